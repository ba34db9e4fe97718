"""`tiles_of`: another arch's tile tables, compiled for the GPU at hand (CPU: the plans only)."""

import pytest

torch = pytest.importorskip("torch")

from cute_fa import tiles_of  # noqa: E402
from cute_fa.runtime.call import DENSE, PLAIN, AttentionCall  # noqa: E402
from cute_fa.runtime.device import stand_in  # noqa: E402
from cute_fa.runtime.plan import plan, tile_arch  # noqa: E402
from cute_fa.tuning import SMEM_BYTES, kernel_key  # noqa: E402

H200 = stand_in("sm_90a", 132)


def _key(head_dim, causal, backend, dtype=torch.bfloat16):
    call = AttentionCall(DENSE, dtype, head_dim, 4, 4096, 4096, 16, 16, PLAIN[causal], 0.1, 0,
                         False, backend, H200.index)
    return plan(call, H200, compile=False).key


def test_forced_tables_choose_the_other_archs_tiles():
    native = _key(256, False, "sm80")
    with tiles_of("sm120"):
        assert tile_arch() == "sm_120a"
        forced = _key(256, False, "sm80")
    assert tile_arch() is None
    assert forced.arch == native.arch == "sm_90a"  # compiled for the GPU at hand
    # sm_90a's 227 KB fit a 128x64 tile with 8 warps; sm_120a's 99 KB do not
    assert native.tile.smem_bytes() > SMEM_BYTES["sm_120a"] >= forced.tile.smem_bytes()
    assert forced.tile == kernel_key("sm_120a", "bfloat16", 256, False, "sm80").tile


def test_forced_tma_tables():
    with tiles_of("sm_120a"):
        k = _key(128, True, "tma", torch.float16)
    own = kernel_key("sm_120a", "float16", 128, True, "tma")
    assert (k.tile, k.kv_stages, k.ctas_per_sm) == (own.tile, own.kv_stages, own.ctas_per_sm)
    assert k.tile.smem_bytes(k.kv_stages) <= SMEM_BYTES["sm_120a"]
    # 'auto' follows the forced arch's choice (sm80 kernel on sm_120a), not the H200's (wgmma)
    assert _key(128, True, "auto", torch.float16).backend == "sm90"
    with tiles_of("sm_120a"):
        assert _key(128, True, "auto", torch.float16).backend == "sm80"


def test_forced_arch_without_tma_refuses_the_tma_kernel():
    with tiles_of("sm_86"), pytest.raises(ValueError, match="backend='tma' needs an sm90"):
        _key(64, False, "tma", torch.float16)
    with pytest.raises(ValueError, match="arch must be one of"):
        with tiles_of("sm_75"):
            pass
    assert tile_arch() is None
