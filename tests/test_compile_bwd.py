"""The mma.sync backward kernels compile for sm_80, sm_90a and sm_120a in their shipped tiles (on
sm_90a `auto` takes the wgmma kernel up to head_dim 128, tests/test_compile_bwd_sm90.py; here
sm_90a's rows name backend="sm80", the kernel it still runs past 128 and on request): mma.sync
m16n8k16 with transposed ldmatrix operands, cp.async loads, float32 reductions for dQ (vector
ones from sm90 on), registers within 255 and spills within tuning_bwd.BWD_SPILL_BUDGET (the
preprocess and postprocess: none); and their tiles fit each arch's shared memory."""

import re

import pytest

from cute_fa.compile.build import compile_kernel
from cute_fa.compile.ptxas import ptxas_resources
from cute_fa.layouts import BwdTileConfig
from cute_fa.tuning import SMEM_BYTES
from cute_fa.tuning_bwd import BWD_SPILL_BUDGET, BWD_TILES, bwd_keys, bwd_tile

ARCHS = ("sm_80", "sm_90a", "sm_120a")
# every head_dim class, causal or not, bf16 on sm_80 and sm_90a; fp16 and sm_120a's small tiles
# on a sample (each compile takes seconds on a 2-core CPU)
PLAIN = ([(arch, hd, "bfloat16", causal) for arch in ("sm_80", "sm_90a")
          for hd in (64, 128, 192, 256) for causal in (False, True)]
         + [("sm_80", 128, "float16", True), ("sm_120a", 64, "float16", True)]
         + [("sm_120a", hd, "bfloat16", False) for hd in (128, 256)])


def _main_ptx(key) -> str:
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    assert re.search(rf"^\.target {key.arch}\b", ptx, re.M)
    mma = "bf16" if key.tile.dtype == "bfloat16" else "f16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{mma}.{mma}.f32" in ptx
    # the transposed products read P^T, dS^T, dO^T, Q^T, K^T with ldmatrix .trans
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert re.search(r"cp\.async\.cg\.shared\.global(\.L2::128B)? \[", ptx)
    vector = key.arch != "sm_80"
    assert bool(re.search(r"red\.relaxed\.gpu\.global\.add\.v4\.f32", ptx)) == vector
    assert vector or "red.relaxed.gpu.global.add.f32" in ptx
    assert "wgmma" not in ptx
    return ptx


def _within_budget(ptx, arch, budget):
    res = ptxas_resources(ptx, arch)
    assert res["registers"] <= 255
    assert res["spill_stores"] <= budget and res["spill_loads"] <= budget, res["log"]


@pytest.mark.parametrize("arch,head_dim,dtype,causal", PLAIN)
def test_main_kernel_compiles(arch, head_dim, dtype, causal):
    _, key, _ = bwd_keys(arch, dtype, head_dim, causal, backend="sm80")
    assert key.tile.smem_bytes() <= SMEM_BYTES[arch]
    ptx = _main_ptx(key)
    # the mask's exp2 and the dQ reductions are there; no deterministic counter
    assert "ex2.approx" in ptx
    assert "ld.acquire" not in ptx
    _within_budget(ptx, arch, BWD_SPILL_BUDGET)


@pytest.mark.parametrize("feature", ["local", "softcap", "varlen", "deterministic"])
def test_features_compile(feature):
    _, key, _ = bwd_keys("sm_80", "bfloat16", 128, True, **{feature: True})
    ptx = _main_ptx(key)
    if feature == "softcap":
        assert "tanh.approx.f32" in ptx
    # deterministic: one CTA adds at a time, on a counter read with acquire and released
    assert ("ld.acquire.gpu" in ptx) == (feature == "deterministic")
    if feature == "deterministic":
        assert re.search(r"red\.release\.gpu\.global\.add\.(s|u)32", ptx)
    _within_budget(ptx, "sm_80", BWD_SPILL_BUDGET)


@pytest.mark.parametrize("arch", ARCHS)
def test_row_kernels_compile(arch):
    """The preprocess (D = rowsum(dO * O), 16-byte loads, quad shuffles) and the postprocess
    (dQ's conversion through smem, 16-byte stores): no spills."""
    pre, main, post = bwd_keys(arch, "float16", 128, False, varlen=arch == "sm_90a")
    pre_ptx = compile_kernel(pre, keep_ptx=True).__ptx__
    assert "shfl.sync.bfly" in pre_ptx and "ld.global.v4" in pre_ptx
    post_ptx = compile_kernel(post, keep_ptx=True).__ptx__
    assert "st.global.v4" in post_ptx and "mma" not in post_ptx
    for ptx in (pre_ptx, post_ptx):
        _within_budget(ptx, arch, 0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("head_dim", [64, 96, 128, 160, 192, 256])
def test_tiles_fit_every_arch(arch, head_dim):
    cfg = bwd_tile(arch, "bfloat16", head_dim)
    assert cfg.smem_bytes() <= SMEM_BYTES[arch]
    assert cfg.head_dim == head_dim


def test_tile_table_rows_are_valid():
    """Every row of a head_dim class builds at that class's head_dim."""
    for hd, rows in BWD_TILES.items():
        for bm, bn, nt, sdp, dkv, dq, stages in rows:
            BwdTileConfig(hd, bm, bn, nt, "float16", sdp, dkv, dq, stages)


@pytest.mark.parametrize("kwargs,match", [
    (dict(warps_sdp=(2, 2)), "warps_sdp must be a pair"),
    (dict(warps_dkv=(4, 2, 1)), "warps_dkv must be a pair"),
    (dict(block_m=48), "warps_sdp = \\(2, 4\\) does not tile the 48 x 128"),
    (dict(head_dim=96, warps_dq=(2, 4)), "warps_dq = \\(2, 4\\) does not tile the 64 x 96"),
    (dict(q_stages=3), "q_stages must be 1 or 2"),
    (dict(block_n=96, warps_sdp=(4, 2)), "block_n must be a multiple of 32|does not tile"),
    (dict(num_threads=100), "num_threads must be a positive multiple of 32"),
])
def test_bwd_tile_config_errors(kwargs, match):
    base = dict(head_dim=128, block_m=64, block_n=128, num_threads=256, dtype="bfloat16",
                warps_sdp=(2, 4), warps_dkv=(4, 2), warps_dq=(4, 2), q_stages=2)
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        BwdTileConfig(**base)
