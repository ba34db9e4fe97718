"""`tiles_of`: another arch's tile tables, compiled for the GPU at hand (CPU: the keys only)."""

import pytest

from cute_fa.tuning import SMEM_BYTES, forced_tile_arch, kernel_key, tiles_of


def test_forced_tables_choose_the_other_archs_tiles():
    native = kernel_key("sm_90a", "bfloat16", 256, False, "sm80")
    with tiles_of("sm120"):
        assert forced_tile_arch() == "sm_120a"
        forced = kernel_key("sm_90a", "bfloat16", 256, False, "sm80")
    assert forced_tile_arch() is None
    assert forced.arch == native.arch == "sm_90a"  # compiled for the GPU at hand
    # sm_90a's 227 KB fit a 128x64 tile with 8 warps; sm_120a's 99 KB do not
    assert native.tile.smem_bytes() > SMEM_BYTES["sm_120a"] >= forced.tile.smem_bytes()
    assert forced.tile == kernel_key("sm_120a", "bfloat16", 256, False, "sm80").tile


def test_forced_tma_tables():
    with tiles_of("sm_120a"):
        k = kernel_key("sm_90a", "float16", 128, True, "tma")
    own = kernel_key("sm_120a", "float16", 128, True, "tma")
    assert (k.tile, k.kv_stages, k.ctas_per_sm) == (own.tile, own.kv_stages, own.ctas_per_sm)
    assert k.tile.smem_bytes(k.kv_stages) <= SMEM_BYTES["sm_120a"]
    # 'auto' follows the forced arch's choice (sm80 kernel on sm_120a), not the H200's (wgmma)
    assert kernel_key("sm_90a", "float16", 128, True, "auto").backend == "sm90"
    with tiles_of("sm_120a"):
        assert kernel_key("sm_90a", "float16", 128, True, "auto").backend == "sm80"


def test_forced_arch_without_tma_refuses_the_tma_kernel():
    with tiles_of("sm_86"), pytest.raises(ValueError, match="backend='tma' needs an sm90"):
        kernel_key("sm_90a", "float16", 64, False, "tma")
    with pytest.raises(ValueError, match="arch must be one of"):
        with tiles_of("sm_75"):
            pass
    assert forced_tile_arch() is None
