"""The wgmma backward's split of a K/V group's query heads over CTAs, on the CPU: how many
splits the plan picks for a grid (counted here by hand), what it launches then (the main
kernel with dK and dV's float32 sums, zeroed and sized by the tile, the deterministic mode's
counters of those sums, and the dK/dV postprocess after dQ's), where it never splits (MHA,
the mma.sync backward), and that the kernels it needs compile for sm_90a and precompile plans
them."""

import re

import pytest

torch = pytest.importorskip("torch")

from cute_fa import backward, backward_varlen  # noqa: E402
from cute_fa.compile.keys import BwdKvPostKey, BwdSm90Key  # noqa: E402
from cute_fa.tuning_bwd import BWD_HEAD_SPLIT_WAVES, bwd_head_splits, bwd_keys  # noqa: E402
from launch_recording import kernels_asked, launches, named_arguments  # noqa: E402,F401  (fixtures)


def test_the_fewest_splits_that_fill_the_waves():
    """132 SMs; non-causal wants the grid to cover 90% of them once (118.8 CTAs), causal 8
    CTAs per SM (1056). The splits divide the group; when no divisor reaches the target, one
    query head per CTA."""
    assert BWD_HEAD_SPLIT_WAVES == {False: 0.9, True: 8}
    # 16 key blocks x 8 K/V heads x 1 entry = 128 CTAs, a group of 4
    assert bwd_head_splits(16, 8, 4, 1, 132, False) == 1  # 128 >= 118.8
    assert bwd_head_splits(16, 8, 4, 1, 132, True) == 4   # 512 < 1056: the whole group
    assert bwd_head_splits(16, 8, 4, 4, 132, True) == 4   # 512 -> 1024 < 1056 -> 2048
    assert bwd_head_splits(16, 8, 4, 8, 132, True) == 2   # 1024 -> 2048
    assert bwd_head_splits(16, 8, 4, 16, 132, True) == 1  # 2048
    # 8 key blocks x 2 K/V heads = 16 CTAs, a group of 4: non-causal too
    assert bwd_head_splits(8, 2, 4, 1, 132, False) == 4   # 16 -> 32 -> 64 < 118.8: all
    assert bwd_head_splits(32, 2, 4, 1, 132, False) == 2  # 64 -> 128
    # a group of 6 (divisors 1, 2, 3, 6): 10 x 4 = 40 CTAs
    assert bwd_head_splits(10, 4, 6, 1, 132, False) == 3  # 40 -> 80 -> 120
    assert bwd_head_splits(10, 4, 6, 2, 132, False) == 2  # 80 -> 160
    assert bwd_head_splits(10, 4, 6, 4, 132, True) == 6   # 160 ... 960 < 1056: all
    assert bwd_head_splits(1, 1, 1, 1, 132, True) == 1


def test_keys_of_a_split_backward():
    pre, main, post, post_kv = bwd_keys("sm_90a", "bfloat16", 128, True, head_splits=2)
    assert isinstance(main, BwdSm90Key) and main.kv_accum
    assert isinstance(post_kv, BwdKvPostKey) and post_kv.tile == main.tile == post.tile
    assert len(bwd_keys("sm_90a", "bfloat16", 128, True)) == 3
    assert not bwd_keys("sm_90a", "bfloat16", 128, True)[1].kv_accum
    with pytest.raises(ValueError, match="wgmma backward"):
        bwd_keys("sm_80", "bfloat16", 128, True, head_splits=2)
    assert not main.ordered_kv_sums
    ordered = bwd_keys("sm_90a", "bfloat16", 128, True, head_splits=2, deterministic=True)[1]
    assert ordered.kv_accum and ordered.deterministic and ordered.ordered_kv_sums


def _gqa(batch, seqlen, heads_q, heads_kv, head_dim=128):
    bf16 = torch.bfloat16
    q, out, dout = (torch.randn(batch, seqlen, heads_q, head_dim, dtype=bf16) for _ in range(3))
    k, v = (torch.randn(batch, seqlen, heads_kv, head_dim, dtype=bf16) for _ in range(2))
    return dout, q, k, v, out, torch.randn(batch, heads_q, seqlen)


def test_a_small_gqa_batch_splits_its_groups(launches):
    """B 1, S 2048, 32/8 heads, causal, on 132 SMs: 16 key blocks x 8 K/V heads = 128 CTAs;
    causal wants 1056, so each group of 4 is split in 4. The main kernel adds dK and dV into
    float32 sums (zeros, one buffer of (2, batch, heads_kv, key blocks * block_n * 128)), the
    fourth launch converts them into dk, dv."""
    recorded, _ = launches
    dout, q, k, v, out, lse = _gqa(1, 2048, 32, 8)
    dk = torch.full_like(k, 7.0)
    backward(dout, q, k, v, out, lse, True, dk=dk)
    keys = [key for key, _ in recorded]
    assert [key.backend for key in keys] == ["bwd_pre", "bwd_sm90", "bwd_post", "bwd_post_kv"]
    main = named_arguments(*recorded[1])
    assert keys[1].kv_accum and main["head_splits"] == 4
    bn = keys[1].tile.block_n
    for name in ("dk_accum", "dv_accum"):
        sums = main[name]
        assert sums.dtype == torch.float32 and sums.shape == (1, 8, (2048 // bn) * bn * 128)
        assert (sums == 0).all()
    assert main["dk_accum"].data_ptr() != main["dv_accum"].data_ptr()
    post_kv = named_arguments(*recorded[3])
    for name in ("dk_accum", "dv_accum"):
        assert post_kv[name].data_ptr() == main[name].data_ptr()
    assert post_kv["dk"].data_ptr() == dk.data_ptr() and post_kv["dv"].shape == v.shape
    assert (dk == 7.0).all()  # the stand-in launches wrote nothing


@pytest.mark.parametrize("batch, seqlen, heads_q, heads_kv, deterministic", [
    (1, 2048, 8, 8, False),    # MHA: nothing to split
    (1, 2048, 8, 8, True),
    (1, 4352, 64, 32, False),  # 34 key blocks x 32 K/V heads = 1088 CTAs: full enough
])
def test_no_split(launches, batch, seqlen, heads_q, heads_kv, deterministic):
    recorded, _ = launches
    backward(*_gqa(batch, seqlen, heads_q, heads_kv, head_dim=64), True,
             deterministic=deterministic)
    keys = [key for key, _ in recorded]
    assert [key.backend for key in keys] == ["bwd_pre", "bwd_sm90", "bwd_post"]
    assert not keys[1].kv_accum
    assert named_arguments(*recorded[1])["head_splits"] is None


def test_deterministic_splits_and_orders_the_sums(launches):
    """deterministic splits as the default does; the shares of a key block add their dK and dV
    in turn, on int32 counters (batch, heads_kv, key blocks), zeroed, beside dQ's counters."""
    recorded, _ = launches
    backward(*_gqa(1, 2048, 32, 8), True, deterministic=True)
    keys = [key for key, _ in recorded]
    assert [key.backend for key in keys] == ["bwd_pre", "bwd_sm90", "bwd_post", "bwd_post_kv"]
    assert keys[1].ordered_kv_sums
    main = named_arguments(*recorded[1])
    assert main["head_splits"] == 4
    counters = main["kv_semaphore"]
    assert counters.dtype == torch.int32 and counters.shape == (1, 8, 2048 // keys[1].tile.block_n)
    assert (counters == 0).all()
    assert main["semaphore"].shape[:2] == (1, 32)


def test_splitting_heads_stands_in_for_the_rule(launches):
    """`plan.splitting_heads(rule)`: within the block the plan asks rule, with
    `bwd_head_splits`' arguments, instead of it (the A/Bs of that rule): the causal call
    above, split 4 ways by the rule, runs unsplit under a rule of 1; a rule asked as if the
    call were causal splits the same grid, not causal, 4 ways where the rule leaves it whole."""
    from cute_fa.runtime.plan import splitting_heads

    recorded, _ = launches
    asked = []
    with splitting_heads(lambda *args: asked.append(args) or 1):
        backward(*_gqa(1, 2048, 32, 8), True)
    assert asked == [(16, 8, 4, 1, 132, True)]
    assert named_arguments(*recorded[1])["head_splits"] is None
    recorded.clear()
    backward(*_gqa(1, 4352, 32, 8), False)  # 34 x 8 = 272 CTAs cover 132 SMs: no split
    assert named_arguments(*recorded[1])["head_splits"] is None
    recorded.clear()
    with splitting_heads(lambda *args: bwd_head_splits(*args[:-1], True)):
        backward(*_gqa(1, 4352, 32, 8), False)
    assert named_arguments(*recorded[1])["head_splits"] == 4


def test_default_has_no_sum_counters(launches):
    recorded, _ = launches
    backward(*_gqa(1, 2048, 32, 8), True)
    assert named_arguments(*recorded[1])["kv_semaphore"] is None


def test_the_mma_sync_backward_never_splits(launches):
    recorded, _ = launches
    backward(*_gqa(1, 2048, 32, 8), True, backend="sm80")
    assert [key.backend for key, _ in recorded] == ["bwd_pre", "bwd_sm80", "bwd_post"]


def test_a_ragged_batch_splits_by_its_longest_entry(launches):
    """3 entries of at most 300 keys, 8/2 heads, causal: 3 key blocks x 2 x 3 = 18 CTAs ->
    split in 4 (72 < 1056).
    The sums hold total_k // block_n + entries key blocks (each entry's start on a block of
    its own, as dQ's)."""
    recorded, _ = launches
    bf16 = torch.bfloat16
    lens = [300, 17, 200]
    cu = torch.tensor([0, 300, 317, 517], dtype=torch.int32)
    q, out, dout = (torch.randn(517, 8, 128, dtype=bf16) for _ in range(3))
    k, v = (torch.randn(517, 2, 128, dtype=bf16) for _ in range(2))
    backward_varlen(dout, q, k, v, out, torch.randn(8, 517), cu, cu, max(lens), max(lens),
                    causal=True)
    keys = [key for key, _ in recorded]
    assert [key.backend for key in keys] == ["bwd_pre", "bwd_sm90", "bwd_post", "bwd_post_kv"]
    main = named_arguments(*recorded[1])
    bn = keys[1].tile.block_n
    assert main["head_splits"] == 4
    assert main["dk_accum"].shape == (1, 2, (517 // bn + 3) * bn * 128)
    post_kv = named_arguments(*recorded[3])
    assert post_kv["cu_seqlens_k"] is cu and post_kv["max_seqlen_k"] == 300
    assert main["kv_semaphore"] is None
    recorded.clear()
    backward_varlen(dout, q, k, v, out, torch.randn(8, 517), cu, cu, max(lens), max(lens),
                    causal=True, deterministic=True)
    main = named_arguments(*recorded[1])
    # a counter per (entry, K/V head, key block of the longest entry)
    assert main["kv_semaphore"].shape == (3, 2, 3) and (main["kv_semaphore"] == 0).all()


def test_split_kernels_compile_for_sm90a():
    """The split main kernel: dK and dV leave by float32 vector reductions, not stores (two
    per 4 floats of each thread's 64 keys x head_dim / 128 threads share, plus dQ's); the dK/dV
    postprocess compiles and stores 16 bytes at a time."""
    from cute_fa.compile.build import compile_kernel
    from cute_fa.compile.ptxas import ptxas_resources
    from cute_fa.tuning_bwd import BWD_SM90_SPILL_BUDGET

    ordered = bwd_keys("sm_90a", "bfloat16", 128, True, head_splits=2, deterministic=True)[1]
    ptx = compile_kernel(ordered, keep_ptx=True).__ptx__
    # two release reductions: dQ's turn (in the loop) and the sums' turn (at the end)
    assert len(re.findall(r"red\.release\.gpu\.global\.add\.(?:s|u)32", ptx)) == 2
    for head_dim in (64, 128):
        _, main, _, post_kv = bwd_keys("sm_90a", "bfloat16", head_dim, True, head_splits=2)
        split = compile_kernel(main, keep_ptx=True).__ptx__
        plain = compile_kernel(bwd_keys("sm_90a", "bfloat16", head_dim, True)[1],
                               keep_ptx=True).__ptx__
        reds = r"red\.relaxed\.gpu\.global\.add\.v4\.f32"
        cfg = main.tile
        per_thread = cfg.block_n * cfg.head_dim_padded // cfg.num_threads  # dK's, and dV's
        assert len(re.findall(reds, split)) == len(re.findall(reds, plain)) + 2 * per_thread // 4
        assert not re.search(r"st\.global\.v4\.b32", split)  # no dK / dV stores
        assert re.search(r"st\.global\.v4\.b32", plain)
        res = ptxas_resources(split, "sm_90a")
        assert res["spill_stores"] <= BWD_SM90_SPILL_BUDGET, res["log"]
        post = compile_kernel(post_kv, keep_ptx=True).__ptx__
        assert re.search(r"^\.target sm_90a\b", post, re.M)
        assert re.search(r"st\.global\.v4\.b32", post)
        assert ptxas_resources(post, "sm_90a")["spill_stores"] == 0


def test_precompile_plans_the_split_kernels(kernels_asked):
    from cute_fa import precompile

    precompile(head_dims=128, dtypes="bfloat16", causal=True, arch="sm_90a", backward=True)
    split = [k for k in kernels_asked if isinstance(k, BwdSm90Key) and k.kv_accum]
    assert split and any(isinstance(k, BwdKvPostKey) for k in kernels_asked)


def test_a_split_call_compiles_only_the_split_kernels(kernels_asked):
    """The plan decides the split from the unsplit main key without compiling it."""
    backward(*_gqa(1, 2048, 32, 8), True)
    mains = [k for k in kernels_asked if isinstance(k, BwdSm90Key)]
    assert mains and all(k.kv_accum for k in mains)
