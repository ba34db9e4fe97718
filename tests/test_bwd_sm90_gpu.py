"""The Hopper (wgmma) backward, backend="sm90", on an sm90 GPU: gradients against the float64
reference of tests/grad_reference.py with flash-attn's criterion (error at most twice torch's own
at the input dtype plus 1e-3), over odd lengths, Sq != Sk both ways, GQA/MQA, head_dim 40-256
(past 128 the tile that splits d between its warpgroups), both causal alignments, windows,
softcap, ragged batches with empty entries; deterministic mode bitwise repeatable; `auto`
takes it."""

import pytest

from grad_reference import check_grads

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import cute_fa  # noqa: E402


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


needs_sm90 = pytest.mark.skipif(not _hopper(), reason="the wgmma backward runs on sm90 only")

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
GRID = [
    (1, 128, 128, 2, 2, 64),
    (2, 177, 177, 4, 2, 64),
    (2, 200, 333, 4, 1, 128),
    (1, 333, 200, 8, 2, 128),
    (1, 257, 257, 2, 2, 96),
    (1, 300, 300, 2, 2, 40),
    (3, 1, 77, 2, 2, 128),
    (1, 1100, 1100, 8, 1, 128),
]
# head_dim past 128: the split-d tile (`WgmmaBwdTileConfig.split_d`), 136-192 on 64-byte atoms
# (160 padded to 192), 256
SPLIT_D_GRID = [
    (1, 257, 257, 2, 2, 256),
    (2, 200, 333, 4, 1, 192),
    (1, 333, 200, 4, 2, 256),
    (3, 1, 77, 2, 2, 256),
    (1, 700, 700, 4, 4, 160),
    (1, 1100, 1100, 4, 1, 256),
    (1, 333, 200, 4, 2, 176),
    (1, 300, 300, 2, 2, 136),
    (1, 1100, 1100, 4, 1, 192),
]


def _rand(*shape, dtype, gen):
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)


def _poisoned(t):
    return torch.full_like(t, float("nan"))


def _inputs(shape, dtype, seed):
    b, sq, sk, hq, hk, d = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = _rand(b, sq, hq, d, dtype=dtype, gen=gen)
    k, v = (_rand(b, sk, hk, d, dtype=dtype, gen=gen) for _ in range(2))
    return q, k, v, _rand(b, sq, hq, d, dtype=dtype, gen=gen)


def _sm90_grads(q, k, v, dout, **kw):
    """cute_fa.backward with backend='sm90', into poisoned dq, dk, dv."""
    det = kw.pop("deterministic", False)
    out, lse = cute_fa.forward(q, k, v, return_lse=True, **kw)
    dq, dk, dv = (_poisoned(t) for t in (q, k, v))
    return cute_fa.backward(dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, backend="sm90",
                            deterministic=det, **kw)


@needs_sm90
@pytest.mark.parametrize("shape", GRID, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gradients_grid(shape, causal, dtype):
    dtype = getattr(torch, dtype)
    q, k, v, dout = _inputs(shape, dtype, sum(shape) + causal)
    check_grads(_sm90_grads(q, k, v, dout, causal=causal), q, k, v, dout, causal=causal)


@needs_sm90
@pytest.mark.parametrize("shape", SPLIT_D_GRID, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_split_d_gradients_grid(shape, causal, dtype):
    test_gradients_grid(shape, causal, dtype)


@needs_sm90
@pytest.mark.parametrize("kw", [dict(window_size=(40, 0)), dict(softcap=50.0),
                                dict(window_size=(30, 30), softcap=5.0)],
                         ids=["window_causal", "softcap", "window_softcap"])
@pytest.mark.parametrize("head_dim", [192, 256])
def test_split_d_window_softcap(kw, head_dim):
    q, k, v, dout = _inputs((2, 300, 260, 4, 2, head_dim), torch.bfloat16, 12)
    check_grads(_sm90_grads(q, k, v, dout, causal=True, **kw), q, k, v, dout, causal=True, **kw)


@needs_sm90
def test_top_left_causal():
    """sdpa's alignment (bottom_right=False): the forward's out and lse for it from float32 torch
    ops (the backward takes them as given)."""
    q, k, v, dout = _inputs((2, 190, 250, 4, 2, 64), torch.float16, 3)
    kr, vr = (t.repeat_interleave(2, dim=2).float() for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kr) / 8.0
    seen = torch.arange(250, device="cuda")[None] <= torch.arange(190, device="cuda")[:, None]
    s = s.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), vr).to(q.dtype)
    got = cute_fa.backward(dout, q, k, v, out, lse.contiguous(), causal=True,
                           bottom_right=False, backend="sm90")
    check_grads(got, q, k, v, dout, causal=True, causal_offset=0)


@needs_sm90
@pytest.mark.parametrize("kw", [dict(window_size=(40, 0)), dict(window_size=(64, 16)),
                                dict(softcap=20.0), dict(window_size=(30, 30), softcap=5.0)],
                         ids=["window_causal", "window", "softcap", "window_softcap"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_window_softcap(kw, causal):
    q, k, v, dout = _inputs((2, 300, 260, 4, 2, 128), torch.bfloat16, 11)
    check_grads(_sm90_grads(q, k, v, dout, causal=causal, **kw), q, k, v, dout, causal=causal, **kw)


@needs_sm90
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (70, 0)])
def test_varlen_gradients(deterministic, window):
    """Empty and one-row entries, keys longer than queries, GQA: each entry against its own
    reference, rows of q past the last entry dq = 0, keys of an entry without queries 0."""
    _check_varlen(deterministic, window)


@needs_sm90
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("head_dim", [192, 256])
def test_split_d_varlen_gradients(deterministic, head_dim):
    _check_varlen(deterministic, (70, 0), head_dim=head_dim)


def _check_varlen(deterministic, window, head_dim=128):
    gen = torch.Generator(device="cuda").manual_seed(5)
    lens_q, lens_k = [100, 1, 0, 333, 64], [150, 40, 17, 333, 64]
    cu_q = torch.tensor([0] + [sum(lens_q[:i + 1]) for i in range(5)], device="cuda",
                        dtype=torch.int32)
    cu_k = torch.tensor([0] + [sum(lens_k[:i + 1]) for i in range(5)], device="cuda",
                        dtype=torch.int32)
    q = _rand(sum(lens_q) + 5, 4, head_dim, dtype=torch.bfloat16, gen=gen)
    k, v = (_rand(sum(lens_k), 2, head_dim, dtype=torch.bfloat16, gen=gen) for _ in range(2))
    dout = _rand(*q.shape, dtype=torch.bfloat16, gen=gen)
    args = (cu_q, cu_k, max(lens_q), max(lens_k))
    out, lse = cute_fa.forward_varlen(q, k, v, *args, causal=True, window_size=window,
                                      return_lse=True)
    got = cute_fa.backward_varlen(dout, q, k, v, out, lse, *args, causal=True,
                                  window_size=window, deterministic=deterministic,
                                  backend="sm90")
    assert (got[0][sum(lens_q):] == 0).all()
    for b in range(5):
        sq, sk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if lens_q[b] == 0:
            assert (got[1][sk] == 0).all() and (got[2][sk] == 0).all()
            continue
        check_grads([got[0][sq][None], got[1][sk][None], got[2][sk][None]], q[sq][None],
               k[sk][None], v[sk][None], dout[sq][None], causal=True, window_size=window)


@needs_sm90
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 8, 8, 128), (1, 2048, 2048, 32, 4, 64),
                                   (1, 1500, 1500, 16, 4, 192), (1, 1500, 1500, 16, 4, 256)],
                         ids=lambda s: "x".join(map(str, s)))
def test_deterministic_is_bitwise_repeatable(causal, shape):
    """Three runs, bitwise equal; the second shape has more key blocks x heads than SMs."""
    _check_repeatable(shape, causal, 9)


def _check_repeatable(shape, causal, seed):
    """Three deterministic runs bitwise equal, and the gradients pass."""
    q, k, v, dout = _inputs(shape, torch.bfloat16, seed)
    runs = [_sm90_grads(q, k, v, dout, causal=causal, deterministic=True) for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
    check_grads(runs[0], q, k, v, dout, causal=causal)


@needs_sm90
def test_strided_inputs():
    """q, k, v, dout as views of packed qkv / wider tensors (head stride != head_dim)."""
    gen = torch.Generator(device="cuda").manual_seed(21)
    qkv = _rand(2, 230, 3, 4, 64, dtype=torch.bfloat16, gen=gen)
    q, k, v = qkv.unbind(2)
    dout = _rand(2, 230, 4, 96, dtype=torch.bfloat16, gen=gen)[..., :64]
    check_grads(_sm90_grads(q, k, v, dout, causal=True), q, k, v, dout, causal=True)


@needs_sm90
@pytest.mark.parametrize("head_dim, expected", [(64, "bwd_sm90"), (128, "bwd_sm90"),
                                                (192, "bwd_sm90"), (256, "bwd_sm90")])
def test_auto_takes_the_wgmma_backward(head_dim, expected):
    from cute_fa.runtime.device import device
    from cute_fa.runtime.plan import plan

    q, k, v, dout = _inputs((1, 64, 64, 2, 2, head_dim), torch.bfloat16, 1)
    out, lse = cute_fa.forward(q, k, v, return_lse=True)
    from cute_fa.api.checks import check_backward
    call = check_backward("dense", dout, q, k, v, out, lse)
    assert plan(call, device(0)).keys[1].backend == expected


def _force_splits(monkeypatch, splits):
    """Every GQA call of the wgmma backward splits its groups in `splits` (the plan's rule
    replaced); the plan must then be the split one."""
    from cute_fa.runtime import plan

    monkeypatch.setattr(plan, "bwd_head_splits", lambda *args: splits)


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim), splits
SPLIT_GRID = [
    ((2, 177, 177, 4, 2, 64), 2),
    ((1, 333, 200, 8, 2, 128), 2),
    ((1, 333, 200, 8, 2, 128), 4),
    ((2, 200, 333, 4, 1, 128), 4),
    ((1, 1100, 1100, 8, 1, 128), 8),
    ((1, 300, 300, 6, 2, 40), 3),
    ((1, 333, 200, 8, 2, 256), 4),
    ((1, 700, 700, 4, 1, 192), 2),
]


@needs_sm90
@pytest.mark.parametrize("shape, splits", SPLIT_GRID,
                         ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else str(s))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_split_groups_gradients(monkeypatch, shape, splits, causal, dtype):
    """A K/V group's query heads over `splits` CTAs, dK and dV summed in float32: the same
    criterion, into poisoned dk, dv (the dK/dV postprocess writes every row)."""
    from cute_fa.api.checks import check_backward
    from cute_fa.runtime.device import device
    from cute_fa.runtime.plan import plan

    _force_splits(monkeypatch, splits)
    dtype = getattr(torch, dtype)
    q, k, v, dout = _inputs(shape, dtype, sum(shape) + splits + causal)
    out, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True)
    call = check_backward("dense", dout, q, k, v, out, lse, causal=causal, backend="sm90")
    assert plan(call, device(0)).head_splits == splits
    check_grads(_sm90_grads(q, k, v, dout, causal=causal), q, k, v, dout, causal=causal)


@needs_sm90
@pytest.mark.parametrize("kw", [dict(window_size=(40, 0)), dict(window_size=(64, 16),
                                                                 softcap=20.0)],
                         ids=["window_causal", "window_softcap"])
def test_split_groups_window_softcap(monkeypatch, kw):
    _force_splits(monkeypatch, 2)
    q, k, v, dout = _inputs((2, 300, 260, 4, 2, 128), torch.bfloat16, 13)
    check_grads(_sm90_grads(q, k, v, dout, causal=True, **kw), q, k, v, dout, causal=True, **kw)


@needs_sm90
@pytest.mark.parametrize("window", [(-1, -1), (70, 0)])
def test_split_groups_varlen(monkeypatch, window):
    """test_varlen_gradients' ragged batch (empty and one-row entries, keys longer than
    queries), its groups of 2 split in 2: keys of an entry without queries get 0, as rows
    past the last entry."""
    _force_splits(monkeypatch, 2)
    _check_varlen(False, window)


@needs_sm90
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, splits", [((1, 1000, 1000, 8, 2, 128), 4),
                                           ((1, 2048, 2048, 32, 4, 64), 8),
                                           ((1, 1000, 1000, 8, 2, 256), 4)],
                         ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else str(s))
def test_split_groups_deterministic(monkeypatch, shape, splits, causal):
    """Split groups under deterministic: three runs bitwise equal (dK and dV's shares add in
    turn), and the gradients pass."""
    _force_splits(monkeypatch, splits)
    _check_repeatable(shape, causal, 19)


@needs_sm90
def test_auto_splits_a_small_gqa_batch():
    """B 1, S 2048, 32/8 heads, causal on the H200's 132 SMs: `tuning_bwd.bwd_head_splits` splits
    each group in 4 (one query head per CTA); the gradients pass."""
    from cute_fa.api.checks import check_backward
    from cute_fa.runtime.device import device
    from cute_fa.runtime.plan import plan

    q, k, v, dout = _inputs((1, 2048, 2048, 32, 8, 128), torch.bfloat16, 17)
    out, lse = cute_fa.forward(q, k, v, causal=True, return_lse=True)
    call = check_backward("dense", dout, q, k, v, out, lse, causal=True)
    if device(0).num_sms == 132:  # 16 key blocks x 8 K/V heads = 128 CTAs; causal wants 1056
        assert plan(call, device(0)).head_splits == 4
    check_grads(_sm90_grads(q, k, v, dout, causal=True), q, k, v, dout, causal=True)


# the persistent backward (`BwdSm90Key.persistent`): (batch, seqlen_q, seqlen_k, heads_q,
# heads_kv, head_dim), each tile's dQ sums, dK and dV; few CTAs, so that each walks many tiles
PERSISTENT_GRID = [
    (2, 177, 177, 4, 2, 64),
    (1, 333, 200, 8, 2, 128),
    (2, 200, 333, 4, 1, 128),
    (3, 1, 77, 2, 2, 128),
    (1, 1100, 1100, 8, 8, 64),
    (1, 333, 200, 4, 2, 256),
    (1, 700, 700, 4, 4, 192),
]


def _persistent_grads(monkeypatch, q, k, v, dout, ctas, **kw):
    """_sm90_grads on the persistent kernel of `ctas` CTAs (GQA groups unsplit: the
    persistent key takes no kv_accum), after checking that the plan is that kernel."""
    from cute_fa.api.checks import check_backward
    from cute_fa.runtime.device import device
    from cute_fa.runtime.plan import overriding_backward, plan

    _force_splits(monkeypatch, 1)
    out, lse = cute_fa.forward(q, k, v, return_lse=True, **kw)
    with overriding_backward(persistent=ctas):
        call = check_backward("dense", dout, q, k, v, out, lse, backend="sm90", **kw)
        assert plan(call, device(0)).keys[1].persistent == ctas
        return _sm90_grads(q, k, v, dout, **kw)


@needs_sm90
@pytest.mark.parametrize("shape", PERSISTENT_GRID, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("ctas", [1, 5, 132])
def test_persistent_gradients(monkeypatch, shape, causal, ctas):
    """The flash-attn criterion, and dK and dV bitwise equal to the one-tile kernel's (each
    tile's products in the same order; dQ's float32 sums are added in another order)."""
    q, k, v, dout = _inputs(shape, torch.bfloat16, sum(shape) + ctas + causal)
    got = _persistent_grads(monkeypatch, q, k, v, dout, ctas, causal=causal)
    check_grads(got, q, k, v, dout, causal=causal)
    single = _sm90_grads(q, k, v, dout, causal=causal)
    assert torch.equal(got[1], single[1]) and torch.equal(got[2], single[2])


@needs_sm90
@pytest.mark.parametrize("kw", [dict(window_size=(40, 0)), dict(window_size=(64, 16),
                                                                 softcap=20.0)],
                         ids=["window_causal", "window_softcap"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("shape", [(2, 300, 260, 4, 2), (1, 130, 520, 6, 3)],
                         ids=["sq_gt_sk", "tiles_without_queries"])
def test_persistent_window_softcap(monkeypatch, kw, head_dim, shape):
    """Windows, softcap; at Sk = 4 Sq the first key blocks see no query (tiles without steps,
    whose dK and dV are zeros)."""
    q, k, v, dout = _inputs(shape + (head_dim,), torch.float16, 13)
    got = _persistent_grads(monkeypatch, q, k, v, dout, 7, causal=True, **kw)
    check_grads(got, q, k, v, dout, causal=True, **kw)
