"""The one-tile probe, built from every layout builder, compiles on the CPU for each arch."""

import re

import pytest

from cute_fa.layouts import TileConfig

ARCHS = ["sm_80", "sm_90a", "sm_120a"]


@pytest.fixture(scope="module")
def compile_probe():
    from cute_fa.kernels.tile_probe import compile_probe

    return compile_probe


@pytest.mark.parametrize("arch", ARCHS)
def test_probe_compiles_for_each_arch(compile_probe, arch):
    cfg = TileConfig()  # docs/walkthrough.md §3: fp16, d=64, 64x64, 4 warps
    compiled = compile_probe(cfg, arch)
    ptx = compiled.__ptx__
    assert compiled.__cubin__, "no cubin produced"
    assert re.search(rf"^\.target {arch}\b", ptx, re.M), "PTX for the wrong target"
    # 4 warps each run 8 n-atoms x 4 k-steps for Q@K^T and again for P@V: 64 mma per thread
    assert len(re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32", ptx)) == 64
    # Q: 4 k-steps x 1 ldmatrix.x4; K: 4 k-steps x 4 (two n8 atoms per x4); V: same, transposed
    assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", ptx)) == 4 + 16
    assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16", ptx)) == 16
    # Q, K and V: 4 cp.async of 16 bytes per thread each
    assert len(re.findall(r"cp\.async\.cg\.shared\.global(?:\.L2::128B)? \[[^\]]+\], \[[^\]]+\], 16", ptx)) == 12


def test_probe_compiles_bf16_eight_warps(compile_probe):
    cfg = TileConfig(head_dim=128, block_m=128, block_n=64, num_threads=256, dtype="bfloat16")
    ptx = compile_probe(cfg, "sm_90a").__ptx__
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
