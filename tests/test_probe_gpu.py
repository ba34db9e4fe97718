"""On a GPU: the one-tile probe's S and O match torch, for several configurations."""

import pytest

from cute_fa.layouts import TileConfig

CONFIGS = [
    TileConfig(),
    TileConfig(dtype="bfloat16"),
    TileConfig(head_dim=32),
    TileConfig(head_dim=128, block_m=128, block_n=64, num_threads=256, dtype="bfloat16"),
    TileConfig(head_dim=96, block_m=64, block_n=64),
    TileConfig(head_dim=64, block_m=128, block_n=128),
]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.dtype}-d{c.head_dim}-{c.block_m}x{c.block_n}-t{c.num_threads}")
def test_probe_matches_torch(cfg):
    from cute_fa.explain.probe import run_probe_check

    report = run_probe_check(cfg, seed=cfg.head_dim)
    assert report.ok, report.summary()
