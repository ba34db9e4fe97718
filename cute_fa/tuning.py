"""Tile sizes of the sm80 kernel, chosen per head_dim class, causality and shared memory.

Each row is tried in order; the first whose shared memory fits the arch wins.
(head_dim_max, causal) -> [(block_m, block_n, num_threads), ...]
Tuned on the H200 (bf16, S = 1k and 8k, see docs/perf/): 128x64 with 4 warps beat
128x128 (4 or 8 warps), 64x128 and 128x64 with 8 warps for head_dim 64 and 128,
causal or not. The smaller fallbacks are for the ~100 KB of sm86/sm89/sm120.
"""

from __future__ import annotations

from .layouts import TileConfig

SMEM_BYTES = {  # usable dynamic shared memory per CTA
    "sm_80": 163 * 1024,
    "sm_86": 99 * 1024,
    "sm_87": 163 * 1024,
    "sm_89": 99 * 1024,
    "sm_90": 227 * 1024,
    "sm_90a": 227 * 1024,
    "sm_100a": 227 * 1024,
    "sm_120": 99 * 1024,
    "sm_120a": 99 * 1024,
}

TILES = {
    (64, False): [(128, 64, 128), (64, 64, 128)],
    (64, True): [(128, 64, 128), (64, 64, 128)],
    (128, False): [(128, 64, 128), (64, 64, 128)],
    (128, True): [(128, 64, 128), (64, 64, 128)],
    (192, False): [(128, 64, 256), (64, 64, 128)],
    (192, True): [(128, 64, 256), (64, 64, 128)],
    (256, False): [(128, 64, 256), (64, 64, 128), (64, 32, 128)],
    (256, True): [(128, 64, 256), (64, 64, 128), (64, 32, 128)],
}


def head_dim_class(head_dim: int) -> int:
    for limit in (64, 128, 192, 256):
        if head_dim <= limit:
            return limit
    raise ValueError(f"head_dim must be at most 256, got {head_dim}")


def tile_config(arch: str, dtype: str, head_dim: int, causal: bool) -> TileConfig:
    """The TileConfig the sm80 kernel uses for this problem on `arch`."""
    budget = SMEM_BYTES.get(arch, 99 * 1024)
    for block_m, block_n, num_threads in TILES[head_dim_class(head_dim), causal]:
        try:
            cfg = TileConfig(head_dim=head_dim, block_m=block_m, block_n=block_n,
                             num_threads=num_threads, dtype=dtype)
        except ValueError:
            continue  # the copy partition does not divide this tile
        if cfg.smem_bytes() <= budget:
            return cfg
    raise ValueError(f"no tile configuration of head_dim={head_dim} fits {arch}'s shared memory")
