"""What `forward` hands each kernel, recorded on the CPU (the compiler and the launch stood in):
one argument per entry of the kernel's registered argument list, in that order, for the
prefill kernels, an unsplit decode call, and a split one with its merge; None exactly where
the kernel's key does not take the argument (as it was compiled), a value everywhere else."""

import dataclasses

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


def test_decode_split_then_merge(launches, monkeypatch):
    from cute_fa import tuning

    monkeypatch.setattr(tuning, "DECODE_FUSED_MERGE", "never")
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


@pytest.mark.parametrize("return_lse", [False, True])
def test_decode_split_in_one_launch(launches, monkeypatch, return_lse):
    """Where split-KV is one launch (`Sm80Key.fused_merge`), the split kernel alone runs: it
    writes the partials and, in its last CTA per query block, the user's out and lse, and it
    takes the stream's counters, one per query block (batch 2 x 2 K/V heads x one block of the
    4 packed rows of a query's GQA group)."""
    from cute_fa import tuning
    from cute_fa.runtime import run

    asked = []
    counters = torch.zeros(64, dtype=torch.int32)
    monkeypatch.setattr(tuning, "DECODE_FUSED_MERGE", "always")
    monkeypatch.setattr(run, "split_counters",
                        lambda device_index, count: asked.append(count) or counters)
    recorded, held = launches
    q, k, v = qkv(sq=1, sk=4096)
    user_out = torch.empty_like(q)
    got = cute_fa.forward(q, k, v, causal=True, num_splits=5, out=user_out,
                          return_lse=return_lse)
    (key, args), = recorded
    _takes_exactly_what_its_key_uses(key, args)
    named = _named(key, args)
    assert key.split_kv and key.fused_merge and key.pack_gqa == 4
    assert named["num_splits"] == 5 and named["write_lse"] == 1
    assert named["out"].dtype == torch.float32 and named["out"].shape == (5 * 2, 1, 8, 64)
    assert named["lse"].shape == (5 * 2, 8, 1)
    assert named["merged_out"] is user_out and named["split_counters"] is counters
    assert asked == [2 * 2 * 1]
    if return_lse:
        assert named["merged_lse"] is got[1] and named["write_merged_lse"] == 1
        assert got[1].shape == (2, 8, 1)
    else:
        assert named["merged_lse"] is held and named["write_merged_lse"] == 0


@pytest.mark.parametrize("batch, seqlen_q, heads_q, heads_kv, head_dim, one", [
    (1, 1, 32, 8, 128, True),     # 4 rows x 128 columns: one 4-float slice per thread
    (1, 4, 32, 8, 128, False),    # 16 rows: four rounds of loads in the last CTA
    (1, 4, 32, 8, 64, False),     # 16 x 64: two rounds
    (1, 2, 32, 8, 64, True),      # 8 x 64: one
    (1, 1, 16, 16, 256, True),    # MHA: one row per block
    (64, 1, 32, 8, 128, False),   # 512 CTAs unsplit: not fewer than the 132 SMs
    (16, 1, 32, 8, 128, True),    # 128 CTAs unsplit
    (17, 1, 32, 8, 128, False),   # 136
])
def test_which_split_calls_take_one_launch(launches, batch, seqlen_q, heads_q, heads_kv,
                                           head_dim, one):
    """`tuning.decode_fused_merge`'s rule, as shipped: one launch where the last CTA merges
    its block's rows in one round (rows x head_dim at most 4 floats x 128 threads) and the
    unsplit grid has fewer CTAs than the GPU's 132 SMs; else the split kernel, then the
    merge kernel."""
    recorded, _ = launches
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=torch.bfloat16)
    k = torch.randn(batch, 256, heads_kv, head_dim, dtype=torch.bfloat16)
    cute_fa.forward(q, k, k, causal=True, num_splits=3)
    assert recorded[0][0].tile.num_threads == 128
    assert [key.backend for key, _ in recorded] == (["sm80"] if one else ["sm80", "merge"])
    assert recorded[0][0].fused_merge == one


def test_merge_slice_is_the_kernels():
    from cute_fa.kernels.fwd import merge
    from cute_fa.tuning import MERGE_SLICE

    assert MERGE_SLICE == merge.VEC


def test_fused_merge_needs_dense_split_kv():
    from cute_fa.tuning import decode_key

    key = decode_key("sm_90a", "bfloat16", 64, True, seqlen_q=1, group=4, page_size=0,
                     seqused_k=False, split_kv=False)
    with pytest.raises(ValueError, match="fused_merge"):
        dataclasses.replace(key, fused_merge=True)
    with pytest.raises(ValueError, match="fused_merge"):
        dataclasses.replace(key, split_kv=True, varlen_q=True, fused_merge=True)


@pytest.mark.parametrize("causal", [False, True])
def test_persistent_tile_counter(launches, causal):
    """A persistent wgmma kernel takes the stream's tile counter where its CTAs take tiles as
    they finish (causal: tiles of unequal work), and none where they take them in turn."""
    from cute_fa.runtime import run
    from cute_fa.runtime.plan import overriding

    recorded, _ = launches
    q, k, v = qkv()
    with overriding(persistent=132, pack_gqa=1):
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


def test_pack_gqa_takes_the_whole_group(launches):
    """A wgmma kernel that packs a GQA group (`Sm90Key.pack_gqa`) gets the call's tensors as
    they are (the kernel folds the group into its TMA views); a pack that is not the call's
    group raises a ValueError naming it, before any launch, and leaves out= untouched."""
    from cute_fa.runtime.plan import overriding

    recorded, _ = launches
    q, k, v = qkv(hq=8, hk=2)
    with overriding(pack_gqa=4):
        out = cute_fa.forward(q, k, v, causal=True, backend="sm90")
    (key, args), = recorded
    assert key.pack_gqa == 4
    _takes_exactly_what_its_key_uses(key, args)
    named = _named(key, args)
    assert named["q"] is q and named["k"] is k and named["out"] is out
    recorded.clear()
    mine = torch.full_like(q, 7.0)
    with overriding(pack_gqa=2), pytest.raises(ValueError, match=r"pack_gqa=2 .* heads_kv = 4"):
        cute_fa.forward(q, k, v, causal=True, backend="sm90", out=mine)
    assert not recorded and (mine == 7.0).all()


@pytest.mark.parametrize("shape, kwargs, pack", [
    ((1, 2000, 32, 8, 128), dict(causal=True), 4),
    ((1, 2000, 64, 8, 64), dict(causal=True), 8),  # the three-warpgroup tile: 8 | 192
    ((2, 700, 48, 8, 64), dict(causal=False), 6),  # 6 | 192 rows
    ((2, 700, 48, 8, 64), dict(causal=True), 1),  # 6 does not divide 128 rows
    ((2, 700, 28, 4, 128), dict(causal=True), 1),  # nor 7
    ((1, 2000, 32, 32, 128), dict(causal=True), 1),  # no group
    ((1, 4096, 32, 8, 128), dict(causal=True), 1),  # past the entry's queries
    ((1, 2000, 32, 8, 192), dict(causal=True), 1),  # a class without an entry
    ((1, 2000, 32, 8, 128), dict(causal=True, window_size=(256, 0)), 1),  # plain calls only
    ((1, 2000, 32, 8, 128), dict(causal=True, softcap=30.0), 1),
])
def test_auto_pack_gqa(launches, monkeypatch, shape, kwargs, pack):
    """Where an entry of `tuning.SM90_PACK_GQA_SEQLEN` (set here for head_dim 64 and 128 up to
    3000 queries, causal and not) packs a dense call's GQA group into the wgmma tiles, by a
    rule written out here: a plain call (no window, softcap or ragged batch) inside the range
    whose group divides the tile's rows; the kernel then gets the call's tensors as they are."""
    from cute_fa import tuning
    from cute_fa.runtime.plan import clear_plans

    recorded, _ = launches
    b, s, hq, hk, d = shape
    q, k, v = qkv(b, s, s, hq, hk, d)
    monkeypatch.setattr(tuning, "SM90_PACK_GQA_SEQLEN",
                        {(c, causal): (17, 3000) for c in (64, 128) for causal in (False, True)})
    clear_plans()
    out = cute_fa.forward(q, k, v, backend="sm90", **kwargs)
    (key, args), = recorded
    assert key.pack_gqa == pack
    _takes_exactly_what_its_key_uses(key, args)
    named = _named(key, args)
    assert named["q"] is q and named["k"] is k and named["out"] is out


def test_auto_pack_gqa_ragged(launches, monkeypatch):
    """A ragged batch never packs (its tiles' rows are one entry's queries of one head)."""
    from cute_fa import tuning
    from cute_fa.runtime.plan import clear_plans

    recorded, _ = launches
    monkeypatch.setattr(tuning, "SM90_PACK_GQA_SEQLEN", {(128, True): (1, 2 ** 31 - 1)})
    clear_plans()
    q, k, v = qkv(1, 600, 600, 32, 8, 128)
    cu = torch.tensor([0, 100, 600], dtype=torch.int32)
    cute_fa.forward_varlen(q[0], k[0], v[0], cu, cu, max_seqlen_q=500, max_seqlen_k=500,
                           causal=True, backend="sm90")
    (key, _), = recorded
    assert key.pack_gqa == 1 and key.varlen_q


def test_backward_overrides(launches, monkeypatch):
    """`overriding_backward` replaces fields of the backward's main key only (the forward's keys
    and the backward's pre- and postprocess keep theirs, the postprocess the main key's tile),
    and the persistent main key takes the one-tile kernel's arguments; a field the key lacks is
    a TypeError naming it, and a GQA group the plan splits over CTAs cannot run persistent."""
    from cute_fa.runtime import plan
    from cute_fa.runtime.plan import overriding_backward

    recorded, _ = launches
    q, k, v = qkv(hq=2, hk=2)
    out, lse = torch.randn_like(q), torch.randn(2, 2, 300)
    cute_fa.backward(out, q, k, v, out, lse, causal=True, backend="sm90")
    plain = [key for key, _ in recorded]
    recorded.clear()
    with overriding_backward(persistent=132):
        cute_fa.backward(out, q, k, v, out, lse, causal=True, backend="sm90")
    keys = [key for key, _ in recorded]
    assert [key.backend for key in keys] == [key.backend for key in plain]
    main = keys[1]
    assert main.backend == "bwd_sm90" and main == dataclasses.replace(plain[1], persistent=132)
    assert keys[0] == plain[0] and keys[2] == plain[2] and keys[2].tile == main.tile
    _takes_exactly_what_its_key_uses(main, recorded[1][1])
    with overriding_backward(no_such_field=1), pytest.raises(TypeError, match="no_such_field"):
        cute_fa.backward(out, q, k, v, out, lse, causal=True, backend="sm90")
    q, k, v = qkv(b=1, hq=8, hk=1, d=128)
    monkeypatch.setattr(plan, "bwd_head_splits", lambda *args: 4)
    with overriding_backward(persistent=132), pytest.raises(ValueError, match="kv_accum"):
        cute_fa.backward(q, q, k, v, q, torch.randn(1, 8, 300), causal=True, backend="sm90")
