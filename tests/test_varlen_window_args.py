"""forward_varlen, window_size and softcap on the CPU: bad input is refused by name before any
launch (a valid call stops at the device check, as every CPU call does), and a valid call hands
the kernel the arguments and key fields the registry lists (the compiler and launch stood in).
"""

import math
from contextlib import contextmanager

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402
from cute_fa.visibility import key_visible  # noqa: E402
from launch_recording import launches  # noqa: E402,F401  (a fixture)
from launch_recording import named_arguments as _named  # noqa: E402

DEVICE = "must be on a CUDA device"


@contextmanager
def refused(exc, name):
    with pytest.raises(exc, match=name) as info:
        yield
    assert "unexpected keyword argument" not in str(info.value), str(info.value)


def ragged(lens_q=(3, 0, 17), lens_k=None, hq=8, hk=2, d=64, dtype=torch.bfloat16):
    lens_k = lens_k or lens_q
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), hq, d, dtype=dtype)
    k = torch.randn(max(int(cu_k[-1]), 1), hk, d, dtype=dtype)
    v = torch.randn_like(k)
    return q, k, v, cu_q, cu_k, max(lens_q), max(lens_k)


# --- the visibility rule, written out by hand for small cases ---------------------------------

def test_window_visibility_by_hand():
    # Sq = Sk = 6, causal_offset 0: query 3 with window (2, 1) sees keys 1, 2, 3, 4
    seen = [k for k in range(6) if key_visible(3, k, causal=False, window_size=(2, 1))]
    assert seen == [1, 2, 3, 4]
    # causal forces the right side to 0: keys 1, 2, 3
    assert [k for k in range(6) if key_visible(3, k, causal=True, window_size=(2, 1))] == [1, 2, 3]
    # bottom-right (Sk - Sq = 4): query 0 with window (1, -1) sees keys 3 ... 5
    assert [k for k in range(6)
            if key_visible(0, k, causal=False, causal_offset=4, window_size=(1, -1))] == [3, 4, 5]
    assert all(key_visible(0, k, causal=False) for k in range(6))


# --- argument errors --------------------------------------------------------------------------

def test_valid_varlen_calls_reach_device_check():
    q, k, v, cu_q, cu_k, mq, mk = ragged()
    with refused(ValueError, DEVICE):
        cute_fa.forward_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    with refused(ValueError, DEVICE):
        cute_fa.forward_varlen(q, k, v, cu_q, cu_k, mq, mk, window_size=(16, 0), softcap=30.0,
                               return_lse=True, out=torch.empty_like(q))
    pages = torch.randn(4, 64, 2, 64, dtype=torch.bfloat16)
    table = torch.zeros(3, 2, dtype=torch.int32)
    with refused(ValueError, DEVICE):
        cute_fa.forward_varlen(q, pages, pages, cu_q, None, mq, 128, causal=True,
                               page_table=table, seqused_k=torch.tensor([3, 0, 100],
                                                                        dtype=torch.int32))


@pytest.mark.parametrize("change, exc, match", [
    (dict(q=lambda q: q[None]), ValueError, "q must be 3-D"),
    (dict(q=lambda q: q.float()), TypeError, "q must be float16 or bfloat16"),
    (dict(cu_q=lambda c: c.long()), TypeError, "cu_seqlens_q must be an int32 tensor"),
    (dict(cu_q=lambda c: c[:1]), ValueError, r"cu_seqlens_q must have shape \(batch \+ 1,\)"),
    (dict(cu_k=lambda c: c[:-1]), ValueError, r"cu_seqlens_k must have shape .*like cu_seqlens_q"),
    (dict(cu_k=lambda c: None), ValueError, "cu_seqlens_k may be None only with a page_table"),
    (dict(mq=lambda m: 3.0), TypeError, "max_seqlen_q must be an int"),
    (dict(mk=lambda m: -1), ValueError, "max_seqlen_k must be >= 0"),
    (dict(mq=lambda m: 21), ValueError, "max_seqlen_q .21. must be at most the number of query"),
    (dict(mk=lambda m: 21), ValueError, "max_seqlen_k .21. must be at most the number of key"),
    (dict(k=lambda k: k[..., :32]), ValueError, "k must have shape"),
    (dict(k=lambda k: k[:, :1].expand(-1, 3, -1)), ValueError, "multiple of the number"),
])
def test_bad_varlen_arguments(change, exc, match):
    q, k, v, cu_q, cu_k, mq, mk = ragged()
    args = dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, mq=mq, mk=mk)
    for name, fn in change.items():
        args[name] = fn(args[name])
    if "k" in change:
        args["v"] = args["k"]
    out = torch.full_like(q, 7.0)
    with refused(exc, match):
        cute_fa.forward_varlen(args["q"], args["k"], args["v"], args["cu_q"], args["cu_k"],
                               args["mq"], args["mk"], out=out if "q" not in change else None)
    assert (out == 7.0).all()


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(window_size=(4,)), TypeError, "window_size must be a pair of ints"),
    (dict(window_size=(4.0, 0)), TypeError, "window_size must be a pair of ints"),
    (dict(window_size=(-2, 0)), ValueError, "window_size sides must be -1"),
    (dict(softcap=-1.0), ValueError, "softcap must be a finite float >= 0"),
    (dict(softcap=float("inf")), ValueError, "softcap must be a finite float >= 0"),
    (dict(softcap=True), TypeError, "softcap must be a float >= 0"),
    (dict(softcap="5"), TypeError, "softcap must be a float >= 0"),
])
def test_bad_window_and_softcap(kwargs, exc, match):
    q = torch.randn(1, 8, 4, 64, dtype=torch.float16)
    k = torch.randn(1, 8, 2, 64, dtype=torch.float16)
    with refused(exc, match):
        cute_fa.forward(q, k, k, **kwargs)
    qv, kv, vv, cu_q, cu_k, mq, mk = ragged()
    with refused(exc, match):
        cute_fa.forward_varlen(qv, kv, vv, cu_q, cu_k, mq, mk, **kwargs)


def test_valid_window_and_softcap_reach_device_check():
    q = torch.randn(1, 8, 4, 64, dtype=torch.float16)
    k = torch.randn(1, 8, 2, 64, dtype=torch.float16)
    for kwargs in (dict(window_size=(4, 0)), dict(window_size=[-1, 3]), dict(softcap=50),
                   dict(window_size=(4, -1), causal=True, softcap=0.5)):
        with refused(ValueError, DEVICE):
            cute_fa.forward(q, k, k, **kwargs)


# --- what reaches the kernel ------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sm80", "tma", "auto"])
def test_varlen_launch(launches, backend):
    recorded, held = launches
    q, k, v, cu_q, cu_k, mq, mk = ragged(lens_q=(3, 0, 17), lens_k=(5, 9, 17))
    out, lse = cute_fa.forward_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True,
                                      return_lse=True, backend=backend)
    (key, args), = recorded
    named = _named(key, args)
    assert key.varlen_q and key.varlen_k and key.causal and not key.local and not key.softcap
    # auto on sm_90a: the wgmma kernel
    assert key.backend == ("sm90" if backend == "auto" else backend)
    # (1, total, heads, head_dim) views of the caller's tensors, no copies
    assert named["q"].shape == (1,) + q.shape and named["q"].data_ptr() == q.data_ptr()
    assert named["k"].shape == (1,) + k.shape and named["k"].data_ptr() == k.data_ptr()
    assert named["out"].data_ptr() == out.data_ptr() and out.shape == q.shape
    assert named["lse"].shape == (1, 8, 20) and lse.shape == (8, 20)
    assert named["cu_seqlens_q"] is cu_q and named["cu_seqlens_k"] is cu_k
    assert named["max_seqlen_q"] == 17 and named["write_lse"] == 1
    # no cache: the kernel takes none of the decode arguments (the TMA-fed kernels have none)
    assert all(named.get(name) is None for name in ("seqused_k", "page_table", "num_splits"))


def test_varlen_paged_launch(launches):
    recorded, held = launches
    q, _, _, cu_q, _, mq, _ = ragged()
    pages = torch.randn(4, 64, 2, 64, dtype=torch.bfloat16)
    table = torch.zeros(3, 2, dtype=torch.int32)
    used = torch.tensor([3, 0, 100], dtype=torch.int32)
    cute_fa.forward_varlen(q, pages, pages, cu_q, None, mq, 128, causal=True, page_table=table,
                           seqused_k=used)
    (key, args), = recorded
    named = _named(key, args)
    assert key.backend == "sm80" and key.varlen_q and not key.varlen_k
    assert key.page_size == 64 and key.seqused_k and key.pack_gqa == 1 and not key.split_kv
    assert named["k"] is pages and named["page_table"] is table and named["seqused_k"] is used


def test_causal_window_ends_at_the_diagonal(launches):
    """causal=True with a window whose right side is open: the keys both allow (right = 0)."""
    recorded, _ = launches
    q = torch.randn(1, 64, 4, 64, dtype=torch.bfloat16)
    for window in ((16, 16), (16, -1), (16, 0)):
        recorded.clear()
        cute_fa.forward(q, q[:, :, :2], q[:, :, :2], causal=True, window_size=window)
        (key, args), = recorded
        named = _named(key, args)
        assert key.causal and key.local and named["window_left"] == 16
        assert named["window_right"] == 0


def test_window_and_softcap_launch(launches):
    recorded, _ = launches
    q = torch.randn(2, 300, 8, 128, dtype=torch.bfloat16)
    k = torch.randn(2, 500, 2, 128, dtype=torch.bfloat16)
    cases = [  # (kwargs, key causal, key local, window_left, window_right)
        (dict(causal=True, window_size=(64, -1)), True, True, 64, 0),
        (dict(window_size=(-1, 0)), True, False, None, 0),  # right = 0 is causal
        (dict(window_size=(32, 16)), True, True, 32, 16),
        (dict(window_size=(32, -1)), False, True, 32, None),
        (dict(window_size=(-1, 16)), True, True, None, 16),  # only the upper edge moved
    ]
    for kwargs, causal, local, left, right in cases:
        recorded.clear()
        cute_fa.forward(q, k, k, softcap=20.0, **kwargs)
        (key, args), = recorded
        named = _named(key, args)
        assert (key.causal, key.local, key.softcap) == (causal, local, True), kwargs
        assert named["softcap"] == 20.0 and named["causal_offset"] == 200
        if left is not None:
            assert named["window_left"] == left
        elif local:  # unbounded left side: an edge left of every key
            assert named["window_left"] + 500 < 0 or named["window_left"] > 500 + 300
        if right is not None and local:
            assert named["window_right"] == right


def test_a_window_past_every_key_is_unbounded(launches):
    """Window sides of 2**30 keys or more are unbounded (-1): the kernels' int32 key offsets
    never see them."""
    recorded, _ = launches
    q = torch.randn(1, 64, 4, 64, dtype=torch.bfloat16)
    cute_fa.forward(q, q, q, causal=True, window_size=(2**40, 0))
    (key, _), = recorded
    assert key.causal and not key.local
    recorded.clear()
    cute_fa.forward(q, q, q, window_size=(2**31, 2**35))
    (key, _), = recorded
    assert not key.causal and not key.local


@pytest.mark.parametrize("case, match", [
    ("cu_q_decreasing", "cu_seqlens_q must start at 0, never decrease"),
    ("max_q_short", r"max_seqlen_q \(16\) is less than the longest query sequence \(17\)"),
    ("max_k_short", r"max_seqlen_k \(16\) is less than the longest key sequence \(17\)"),
    ("seqused_past_entry", "sequence 0 uses 6 keys, outside 0..5"),
    ("paged_past_pages", "sequence 2 uses 200 keys, outside 0..128"),
])
def test_check_indices_for_varlen(launches, monkeypatch, case, match):
    """CUTE_FA_CHECK_INDICES=1: the values inside cu_seqlens and seqused_k are checked against
    the tensors and each other before the launch."""
    recorded, _ = launches
    monkeypatch.setenv("CUTE_FA_CHECK_INDICES", "1")
    q, k, v, cu_q, cu_k, mq, mk = ragged(lens_q=(3, 0, 17), lens_k=(5, 9, 17))
    kwargs = {}
    if case == "cu_q_decreasing":
        cu_q = torch.tensor([0, 3, 2, 20], dtype=torch.int32)
    elif case == "max_q_short":
        mq = 16
    elif case == "max_k_short":
        mk = 16
    elif case == "seqused_past_entry":
        kwargs["seqused_k"] = torch.tensor([6, 9, 17], dtype=torch.int32)
    else:
        k = v = torch.randn(4, 64, 2, 64, dtype=torch.bfloat16)
        cu_k = None
        kwargs["page_table"] = torch.zeros(3, 2, dtype=torch.int32)
        kwargs["seqused_k"] = torch.tensor([3, 0, 200], dtype=torch.int32)
    with pytest.raises(ValueError, match=match):
        cute_fa.forward_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True, **kwargs)
    assert recorded == []


def test_decode_window_splits_by_window(launches):
    """A sliding window at decode: the split count comes from the window's keys, not the
    cache's (a 32k cache with a 1k window reads 1k keys)."""
    recorded, _ = launches
    q = torch.randn(1, 1, 32, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 32768, 8, 128, dtype=torch.bfloat16)
    cute_fa.forward(q, k, k, causal=True)
    full = _named(*recorded[0])["num_splits"] or 1  # None: the unsplit kernel
    recorded.clear()
    cute_fa.forward(q, k, k, causal=True, window_size=(1023, 0))
    key, args = recorded[0]
    windowed = _named(key, args)["num_splits"] or 1
    assert key.local and key.pack_gqa == 4
    assert 1 <= windowed < full
    assert math.ceil(1024 / key.tile.block_n) >= 4 * (windowed if windowed > 1 else 0)


def test_empty_varlen_batch_launches_nothing(launches):
    recorded, _ = launches
    q, k, v, cu_q, cu_k, _, mk = ragged(lens_q=(0, 0), lens_k=(4, 4))
    out, lse = cute_fa.forward_varlen(q, k, v, cu_q, cu_k, 0, mk, return_lse=True)
    assert recorded == [] and out.shape == (0, 8, 64) and lse.shape == (8, 0)


def test_auto_takes_the_wgmma_kernel_on_hopper(launches):
    """sm_90a's 'auto': the wgmma kernel, ragged or dense, causal or not, short or long; a
    ragged batch keeps the plain tile whatever its longest entry (SM90_LONG_TILES is for
    dense calls), a dense causal call of 2048 queries at head_dim 64 takes the long tile."""
    from cute_fa.tuning import SM90_LONG_TILES, SM90_TILES

    recorded, _ = launches
    q, k, v, cu_q, cu_k, mq, mk = ragged(d=128)
    cute_fa.forward_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    q, k, v, cu_q, cu_k, mq, mk = ragged(lens_q=(2049, 5), d=64)
    cute_fa.forward_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    cute_fa.forward_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=False)
    q, k, v, cu_q, cu_k, mq, mk = ragged(lens_q=(2048, 5), d=64)
    cute_fa.forward_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    dense = torch.randn(1, 100, 2, 64, dtype=torch.bfloat16)
    cute_fa.forward(dense, dense, dense, causal=True)
    cute_fa.forward(dense, dense, dense, causal=False)
    long = torch.randn(1, 2048, 2, 64, dtype=torch.bfloat16)
    cute_fa.forward(long, long, long, causal=True)
    assert [key.backend for key, _ in recorded] == ["sm90"] * 7
    shapes = [(k.tile.block_m, k.tile.block_n, k.tile.num_threads) for k, _ in recorded]
    assert shapes[1] == shapes[3] == shapes[4] == SM90_TILES[64, True]
    assert shapes[6] == SM90_LONG_TILES[64, True][1] == (192, 128, 384)
