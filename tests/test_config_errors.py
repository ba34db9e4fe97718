"""Invalid configurations raise ValueError naming the parameter."""

import pytest

from cute_fa.explain import FlashLayouts
from cute_fa.layouts import TileConfig


@pytest.mark.parametrize("kwargs, name", [
    (dict(head_dim=60), "head_dim"),
    (dict(head_dim=264), "head_dim"),
    (dict(head_dim=0), "head_dim"),
    (dict(num_threads=100), "num_threads"),
    (dict(num_threads=0), "num_threads"),
    (dict(block_m=48), "block_m"),            # not a multiple of 16 * 4 warps
    (dict(block_m=64, num_threads=256), "block_m"),
    (dict(block_n=40), "block_n"),
    (dict(dtype="float32"), "dtype"),
    (dict(dtype="int8"), "dtype"),
    (dict(head_dim=32, block_n=16), "block_n"),  # 32-wide atom: 32 rows per copy pass
    # warps splitting the keys: one 16-row slab, 16 keys per warp at least
    (dict(block_m=64, warps_split_keys=True), "block_m must be 16 times a proper divisor of "
                                              "num_warps = 4"),
    (dict(block_m=48, warps_split_keys=True), "block_m must be 16 times a proper divisor"),
    (dict(block_m=16, block_n=32, warps_split_keys=True),
     "block_n must be a multiple of 16 \\* 4 warps per slab = 64"),
    (dict(block_m=32, block_n=48, warps_split_keys=True),
     "block_n must be a multiple of 16 \\* 2 warps per slab = 32"),
    (dict(head_dim=96, block_m=16, block_n=64, warps_split_keys=True), "block_m must be a multiple of 32"),
])
def test_invalid_config(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TileConfig(**kwargs)
    with pytest.raises(ValueError, match=name):
        FlashLayouts(**kwargs)


def test_non_int_is_a_type_error():
    with pytest.raises(TypeError, match="head_dim must be an int, got 64.0"):
        TileConfig(head_dim=64.0)
    with pytest.raises(TypeError, match="block_m must be an int"):
        FlashLayouts(block_m="64")


def test_warp_split_tile():
    cfg = TileConfig(head_dim=128, block_m=16, block_n=64, num_threads=128, warps_split_keys=True)
    assert (cfg.mma_tile.block_m, cfg.mma_tile.block_n, cfg.mma_tile.num_threads) == (16, 16, 32)
    assert cfg.warp_keys == 16 and not cfg.mma_tile.warps_split_keys
    assert (cfg.row_slabs, cfg.key_groups) == (1, 4)
    assert [cfg.warp_place(w) for w in range(4)] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    cfg = TileConfig(head_dim=128, block_m=32, block_n=64, num_threads=128, warps_split_keys=True)
    assert (cfg.row_slabs, cfg.key_groups, cfg.warp_keys) == (2, 2, 32)
    assert [cfg.warp_place(w) for w in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert (TileConfig().row_slabs, TileConfig().key_groups) == (4, 1)
    assert TileConfig().mma_tile == TileConfig()
    with pytest.raises(TypeError, match="warps_split_keys must be a bool"):
        TileConfig(block_m=16, warps_split_keys=1)


def test_torch_dtypes_accepted():
    import torch

    assert FlashLayouts(dtype=torch.bfloat16).config.dtype == "bfloat16"
    assert FlashLayouts(dtype=torch.float16).config.dtype == "float16"
    with pytest.raises(ValueError, match="dtype"):
        FlashLayouts(dtype=torch.float32)


def test_bad_arguments(walkthrough):
    with pytest.raises(ValueError, match="tid"):
        walkthrough.s_coords(128)
    with pytest.raises(TypeError, match="tid"):
        walkthrough.s_coords("0")
    with pytest.raises(ValueError, match="tensor"):
        walkthrough.smem_offset("X", 0, 0)
    with pytest.raises(ValueError, match="row"):
        walkthrough.smem_offset("Q", 64, 0)
    with pytest.raises(ValueError, match="col"):
        walkthrough.smem_offset("K", 0, 64)
    with pytest.raises(ValueError, match="op"):
        walkthrough.allreduce_steps({0: 1}, op="min")
    with pytest.raises(ValueError, match="row_values"):
        walkthrough.reduce_steps([1, 2, 3])


def test_import_is_cheap():
    import subprocess
    import sys

    code = ("import sys, cute_fa; "
            "assert 'cutlass' not in sys.modules, 'import cute_fa imported the CuTe DSL'; "
            "print(cute_fa.__version__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
