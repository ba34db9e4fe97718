"""Every shipped kernel class compiles on the CPU without register spills, within the arch's
shared memory, with the instructions it is made of: the sm80 kernel for sm_80, sm_90a and
sm_120a, the TMA kernel (lazy rescale, the default) for sm_90a and sm_120a, each for every
head_dim class, dtype and causality, plus head_dims that need padding and the eager TMA kernel
the benchmark compares against."""

import re

import pytest

from cute_fa.compile.build import compile_kernel
from cute_fa.compile.ptxas import ptxas_resources
from cute_fa.tuning import SMALL_GRID_TILES, SMEM_BYTES, TILES, kernel_key, tile_config

ARCHS = ["sm_80", "sm_90a", "sm_120a"]
DTYPES = ("bfloat16", "float16")
# every (head_dim class, causal) row of the tile table in both dtypes (ptxas's register
# allocation near 255 differs between them), plus a head_dim padded to the MMA's K of 16
CASES = [(limit, causal, dtype) for limit, causal in sorted(TILES) for dtype in DTYPES] + [
    (40, True, "bfloat16")]


def _one_round_mmas(cfg) -> int:
    """mma.sync m16n8k16 instructions of one K/V round of one warp, from the tile: a warp owns
    block_m / num_warps query rows; S = Q @ K^T takes (rows/16)(block_n/8)(head_dim/16) of
    them, O += P @ V (rows/16)(head_dim/8)(block_n/16). The PTX holds exactly this many when the
    round body is traced once (first, masked and unmasked rounds share it), which keeps the
    PTX, and the first call's compile time, half of what separate bodies cost."""
    rows, d = cfg.block_m // cfg.num_warps, cfg.head_dim_padded
    return (rows // 16) * (cfg.block_n // 8) * (d // 16) + (rows // 16) * (d // 8) * (cfg.block_n // 16)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("head_dim, causal, dtype", CASES,
                         ids=lambda x: str(x))
def test_forward_compiles_without_spills(arch, head_dim, causal, dtype):
    cfg = tile_config(arch, dtype, head_dim, causal)
    assert cfg.smem_bytes() <= SMEM_BYTES[arch]
    key = kernel_key(arch, dtype, head_dim, causal, "sm80")
    assert key.tile == cfg and key.lpt == causal
    compiled = compile_kernel(key, keep_ptx=True)
    ptx = compiled.__ptx__
    assert re.search(rf"^\.target {arch}\b", ptx, re.M)
    mma = "bf16.bf16" if dtype == "bfloat16" else "f16.f16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{mma}.f32" in ptx
    assert ptx.count("mma.sync.aligned") == _one_round_mmas(cfg)
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert re.search(r"cp\.async\.cg\.shared\.global(\.L2::128B)? \[", ptx)
    assert "shfl.sync.bfly" in ptx  # the quad reductions
    res = ptxas_resources(ptx, arch)
    assert res["registers"] <= 255
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0, res["log"]


# (arch, head_dim, causal, dtype, lazy_rescale): the default (lazy) kernel of every head_dim
# class, dtype and causality on sm_90a and on sm_120a (whose ~100 KB force other tiles and
# fewer stages), padding, and the eager kernel of the benchmark's comparison at head_dim 128
# (eager kernels are not reachable from the public API; some spill, see docs/perf/README.md)
TMA_CASES = [(arch, limit, causal, dtype, True) for arch in ("sm_90a", "sm_120a")
             for limit, causal in sorted(TILES) for dtype in DTYPES] + [
    ("sm_90a", 128, False, "bfloat16", False),
    ("sm_90a", 40, True, "bfloat16", True),
]


@pytest.mark.parametrize("arch, head_dim, causal, dtype, lazy", TMA_CASES, ids=lambda x: str(x))
def test_tma_forward_compiles_without_spills(arch, head_dim, causal, dtype, lazy):
    key = kernel_key(arch, dtype, head_dim, causal, "tma", lazy_rescale=lazy)
    assert key.backend == "tma" and key.lazy_rescale == lazy
    assert key.tile.smem_bytes(key.kv_stages) + 1024 <= SMEM_BYTES[arch]
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    assert re.search(rf"^\.target {arch}\b", ptx, re.M)
    assert re.search(r"cp\.async\.bulk\.tensor\.4d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx)
    assert "mbarrier.try_wait" in ptx and "mbarrier.arrive.expect_tx" in ptx
    assert "cp.async.cg" not in ptx  # no thread copies Q, K or V itself
    mma = "bf16.bf16" if dtype == "bfloat16" else "f16.f16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{mma}.f32" in ptx
    assert ptx.count("mma.sync.aligned") == _one_round_mmas(key.tile)
    # each ring stage: an "empty" barrier every thread arrives on, instead of a CTA-wide bar.sync
    assert re.search(r"mbarrier\.arrive(\.release)?(\.cta)?\.shared(::cta)?\.b64", ptx)
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert ("vote.sync.any" in ptx) == lazy  # the warp vote of the lazy rescale
    res = ptxas_resources(ptx, arch)
    assert res["registers"] <= 255
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0, res["log"]
    if key.ctas_per_sm:
        # the register cap: ptxas told to fit that many 128-thread CTAs in 64K registers
        assert re.search(rf"^\.minnctapersm {key.ctas_per_sm}$", ptx, re.M)
        assert res["registers"] * key.tile.num_threads * key.ctas_per_sm <= 65536
    else:
        assert ".minnctapersm" not in ptx


@pytest.mark.parametrize("arch, backend, head_dim", sorted(SMALL_GRID_TILES), ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_small_grid_tiles_compile_without_spills(arch, backend, head_dim, dtype):
    """The 64-row tiles of causal calls that would not fill the GPU once (tuning.is_small_grid)."""
    key = kernel_key(arch, dtype, head_dim, True, backend, small_grid=True)
    assert (key.tile.block_m, key.tile.block_n, key.tile.num_threads) == \
        SMALL_GRID_TILES[arch, backend, head_dim]
    assert key.backend == backend and key.lpt
    assert key.tile.smem_bytes(key.kv_stages) + 1024 <= SMEM_BYTES[arch]
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    res = ptxas_resources(ptx, arch)
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0, res["log"]


# (arch, head_dim class, causal): the persistent TMA kernel (`TmaKey.persistent`) with each
# arch's own tiles, bf16
TMA_PERSISTENT_CASES = [(arch, limit, causal) for arch in ("sm_90a", "sm_120a")
                        for limit in (64, 128) for causal in (False, True)]


@pytest.mark.parametrize("arch, head_dim, causal", TMA_PERSISTENT_CASES, ids=str)
def test_persistent_tma_forward_compiles(arch, head_dim, causal):
    """The persistent TMA kernel in the k-loop form `tuning.tma_persistent` picks: a loop over
    tiles (gridDim.x strides), no spills but the 4 bytes of causal head_dim 128 on sm_90a (every
    form spills there), the same MMAs as the one-tile kernel (its rounds traced once), and
    Q's reload behind a proxy fence."""
    from cute_fa.tuning import TMA_PERSISTENT_S_GEMM_FINE, tma_persistent

    plain = kernel_key(arch, "bfloat16", head_dim, causal, "tma")
    key = tma_persistent(plain, 264)
    assert key.persistent == 264 and key.tile == plain.tile
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    assert ptx.count("mma.sync.aligned") == _one_round_mmas(key.tile)
    assert "%nctaid.x" in ptx
    assert "fence.proxy.async.shared::cta" in ptx
    res = ptxas_resources(ptx, arch)
    budget = 4 if (arch, (key.tile.block_m, key.tile.block_n), 128, True) in \
        TMA_PERSISTENT_S_GEMM_FINE and causal and head_dim == 128 else 0
    assert res["spill_stores"] <= budget and res["spill_loads"] <= budget, res["log"]


def test_persistent_tma_refusals():
    import dataclasses

    key = kernel_key("sm_90a", "bfloat16", 128, True, "tma")
    for bad in (-1, True, 2.0):
        with pytest.raises(ValueError, match="persistent must be 0 or a CTA count"):
            dataclasses.replace(key, persistent=bad)
    with pytest.raises(ValueError, match="not with a ragged batch"):
        dataclasses.replace(key, persistent=132, varlen_q=True, varlen_k=True)
