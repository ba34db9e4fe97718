"""What `forward` hands each kernel, recorded on the CPU (the compiler and the launch stood in):
one argument per entry of the kernel's registered argument list, in that order, for the
prefill kernels, an unsplit decode call, and a split one with its merge; None exactly where
the kernel's key does not take the argument (as it was compiled), a value everywhere else."""

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402
from launch_recording import launches  # noqa: E402,F401  (a fixture)
from launch_recording import named_arguments as _named  # noqa: E402

from cute_fa.compile.registry import used_arguments  # noqa: E402


def _takes_exactly_what_its_key_uses(key, args):
    for arg, used in zip(args, used_arguments(key)):
        assert (arg is not None) == used, (key, args)


def qkv(b=2, sq=300, sk=300, hq=8, hk=2, d=64):
    return (torch.randn(b, sq, hq, d, dtype=torch.bfloat16),
            torch.randn(b, sk, hk, d, dtype=torch.bfloat16),
            torch.randn(b, sk, hk, d, dtype=torch.bfloat16))


@pytest.mark.parametrize("backend", ["sm80", "tma", "sm90"])
def test_prefill(launches, backend):
    recorded, held = launches
    q, k, v = qkv()
    out = cute_fa.forward(q, k, v, causal=True, backend=backend)
    (key, args), = recorded
    assert key.backend == backend
    _takes_exactly_what_its_key_uses(key, args)
    named = _named(key, args)
    assert named["q"] is q and named["out"] is out and named["lse"] is held
    assert named["causal_offset"] == 0 and named["write_lse"] == 0
    assert named["window_left"] is None and named["softcap"] is None
    assert named["cu_seqlens_q"] is None and named["max_seqlen_q"] is None
    if backend == "sm80":
        assert named["seqused_k"] is None and named["page_table"] is None
        assert named["num_splits"] is None
    else:  # the TMA-fed kernels have no decode arguments at all
        assert not {"seqused_k", "page_table", "num_splits"} & set(named)


def test_decode_unsplit_paged(launches):
    recorded, held = launches
    q, _, _ = qkv(sq=1)
    pages = torch.randn(20, 64, 2, 64, dtype=torch.bfloat16)
    table = torch.zeros(2, 4, dtype=torch.int32)
    lens = torch.tensor([5, 200], dtype=torch.int32)
    out, lse = cute_fa.forward(q, pages, pages, causal=True, page_table=table, seqused_k=lens,
                               num_splits=1, return_lse=True)
    (key, args), = recorded
    _takes_exactly_what_its_key_uses(key, args)
    named = _named(key, args)
    assert key.page_size == 64 and key.seqused_k and key.pack_gqa == 4 and not key.split_kv
    assert named["out"] is out and named["lse"] is lse and named["write_lse"] == 1
    assert named["seqused_k"] is lens and named["page_table"] is table
    assert named["num_splits"] is None


def test_decode_split_then_merge(launches):
    recorded, held = launches
    q, k, v = qkv(sq=1, sk=4096)
    user_out = torch.empty_like(q)
    cute_fa.forward(q, k, v, causal=True, num_splits=5, out=user_out)
    (split_key, split_args), (merge_key, merge_args) = recorded
    _takes_exactly_what_its_key_uses(split_key, split_args)
    named = _named(split_key, split_args)
    assert split_key.split_kv and named["num_splits"] == 5 and named["write_lse"] == 1
    assert named["out"].dtype == torch.float32 and named["out"].shape == (5 * 2, 1, 8, 64)
    assert named["lse"].shape == (5 * 2, 8, 1)
    assert named["seqused_k"] is None and named["page_table"] is None
    merged = _named(merge_key, merge_args)
    assert merge_key.in_dtype == "float32" and merge_key.out_dtype == "bfloat16"
    assert merged["o_parts"].shape == (5, 2, 1, 8, 64)
    assert merged["out"] is user_out and merged["lse"] is held and merged["write_lse"] == 0


@pytest.mark.parametrize("causal", [False, True])
def test_persistent_tile_counter(launches, causal):
    """A persistent wgmma kernel takes the stream's tile counter where its CTAs take tiles as
    they finish (causal: tiles of unequal work), and none where they take them in turn."""
    from cute_fa.runtime import run
    from cute_fa.runtime.plan import overriding

    recorded, _ = launches
    q, k, v = qkv()
    with overriding(persistent=132):
        cute_fa.forward(q, k, v, causal=causal, backend="sm90")
    (key, args), = recorded
    assert key.persistent == 132 and key.dynamic_tiles == causal
    _takes_exactly_what_its_key_uses(key, args)
    named = _named(key, args)
    assert (named["tile_counter"] is run.tile_counter(-1)) if causal else \
        named["tile_counter"] is None


@pytest.mark.parametrize("shape, kwargs, persistent", [
    ((2, 1024, 16, 128), dict(causal=True), 132),  # 256 tiles of 1k queries
    ((2, 2048, 16, 128), dict(causal=False), 132),
    ((1, 1024, 8, 128), dict(causal=True), 0),  # 64 tiles: fewer than the SMs
    ((2, 512, 32, 128), dict(causal=True), 0),  # 512 queries: outside the entry
    ((2, 4096, 16, 128), dict(causal=True), 0),
    ((2, 1024, 32, 64), dict(causal=False), 0),  # head_dim 64
    ((2, 1024, 16, 128), dict(causal=True, window_size=(256, 0)), 0),  # plain calls only
    ((2, 1024, 16, 128), dict(causal=True, softcap=30.0), 0),
])
def test_auto_persistent(launches, monkeypatch, shape, kwargs, persistent):
    """Where a table entry of `tuning.SM90_PERSISTENT_SEQLEN` (head_dim 128, 1024-2048 queries,
    set here: the shipped table has none) runs the wgmma kernel persistent on the stood-in
    GPU's 132 SMs, by a rule written out here: more 128-row tiles than SMs, no window and no
    softcap; and with the shipped table no call does."""
    from cute_fa import tuning
    from cute_fa.runtime.plan import clear_plans

    recorded, _ = launches
    b, s, h, d = shape
    q = torch.randn(b, s, h, d, dtype=torch.bfloat16)
    cute_fa.forward(q, q, q, backend="sm90", **kwargs)
    assert recorded.pop()[0].persistent == 0
    monkeypatch.setattr(tuning, "SM90_PERSISTENT_SEQLEN", {128: (1024, 2048)})
    clear_plans()
    cute_fa.forward(q, q, q, backend="sm90", **kwargs)
    (key, args), = recorded
    assert key.persistent == persistent
    _takes_exactly_what_its_key_uses(key, args)
