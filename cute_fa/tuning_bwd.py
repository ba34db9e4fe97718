"""The backward's measured tables and the key builder that turns a row into kernel keys: the
mma.sync backward's tiles (`BWD_TILES`), the wgmma backward's (`BWD_SM90_*`), which of the two
a call runs (`bwd_backend`), over how many CTAs a K/V group's query heads are split
(`bwd_head_splits`), and the keys of one backward call (`bwd_keys`). The forward's and
decode's tables are `tuning`'s.
"""

from __future__ import annotations

import functools

from .arch import Arch
from .compile.keys import BwdKey, BwdKvPostKey, BwdPostKey, BwdPrepKey, BwdSm90Key
from .layouts.config import BwdTileConfig, RowTile, WgmmaBwdTileConfig
from .tuning import head_dim_class

# ---- the mma.sync backward (kernels/bwd/sm80.py) ----
# head_dim class -> tiles tried in order, the first whose shared memory fits the arch:
# (block_m, block_n, num_threads, warps_sdp, warps_dkv, warps_dq, q_stages). 8 warps hold dK
# and dV of a 128-key block (64 float32 registers per thread each at head_dim 128), with S, dP
# and the operand fragments beside them: at head_dim 128 ptxas spills 8-48 bytes at 255
# registers (BWD_SPILL_BUDGET), and that tile still ran 1.5x the spill-free 64x64 one on the
# H200 (300 vs 190 TFLOPs/s, bf16, S = 2k): K and V stay for twice the queries per load. At
# head_dim 64, 128x128 ran 0-4% faster than the spill-free 64x128 but spills 48-68 bytes: not
# taken.
# A row whose warp grid does not divide a padded head_dim (96) is passed over; the last rows
# are for the ~100 KB of sm86/sm89/sm120.
BWD_TILES = {
    64: [(64, 128, 256, (2, 4), (4, 2), (4, 2), 2)],
    128: [(64, 128, 256, (2, 4), (4, 2), (2, 4), 2), (64, 128, 256, (2, 4), (4, 2), (4, 2), 2),
          (64, 64, 256, (2, 4), (4, 2), (4, 2), 1)],
    192: [(64, 64, 256, (4, 2), (2, 4), (2, 4), 2), (32, 32, 128, (2, 2), (2, 2), (2, 2), 1)],
    256: [(32, 64, 256, (2, 4), (4, 2), (2, 4), 2), (32, 32, 128, (2, 2), (2, 2), (2, 2), 1)],
}
BWD_ROWS = (64, 128)  # (block_m, num_threads) of the preprocess
BWD_SPILL_BUDGET = 64  # bytes of spill stores a shipped backward kernel may have (see above)


def bwd_tile(arch: str, dtype: str, head_dim: int) -> BwdTileConfig:
    """The backward's tile on `arch` (its shared memory decides)."""
    budget = Arch.of_name(arch).smem_bytes
    for bm, bn, nt, sdp, dkv, dq, stages in BWD_TILES[head_dim_class(head_dim)]:
        try:
            cfg = BwdTileConfig(head_dim, bm, bn, nt, dtype, sdp, dkv, dq, stages)
        except ValueError:
            continue  # a warp grid that does not divide this (padded) head_dim
        if cfg.smem_bytes() <= budget:
            return cfg
    raise ValueError(f"no backward tile of head_dim={head_dim} fits {arch}'s shared memory")


# the Hopper backward (kernels/bwd/sm90.py): head_dim class -> (block_m, consumers, q_stages,
# ctas_per_sm[, split_d, dq_writer, atom_cols, dv_after_ds, dq_before_dk]). Same-process A/Bs
# on the H200, bf16 (docs/perf/2026-12-02-h200-bwd-sm90, -d64, 2026-12-03-h200-bwd-dq-writer,
# -192, -80, -order):
# - dq_writer (warp 2 adds dQ from shared memory in one bulk reduction): deterministic
#   1.20x-1.50x (its turn waits leave the consumers' path), default 1.02x-1.09x at 64,
#   0.985x-1.03x at 128. A softcap at 128 spills with it (164 bytes stored, 208 loaded):
#   BWD_SM90_SOFTCAP_TILES keep the consumers' own reductions there.
# - head_dim 128: a third Q/dO stage -2% to +14% against two; deterministic on 80 queries
#   (dQ transposed, dV after dS) 0.99x-1.05x the 64-query tile, fewer turns per dQ block;
#   the default ran 0.95x-1.02x there (slower causal) and keeps 64.
# - head_dim 64: 128 keys x 128 queries in two warpgroups with dV issued after dS
#   (dv_after_ds) 1.02x-1.13x the 64 x 64 one-warpgroup tile, deterministic 1.11x-1.15x;
#   issued before dS, ptxas serializes every wgmma (C7512). Under a softcap the 128-query
#   step spills 424 bytes stored (S^T, dP^T and 1 - tanh^2): 64 x 64 there (84 bytes).
# - dq_before_dk (flash-attn-4's order): 64 1.008x-1.032x, deterministic 1.010x-1.028x, 128
#   deterministic 1.018x-1.037x; the 128 default (0.977x-1.026x; with 2 stages or 80 queries
#   0.973x-1.061x) and its softcap (0.974x-1.062x) keep their order.
# - A consumer thread holds dK and dV of its 64 keys (64 float32 registers each at 128)
#   beside S^T and dP^T, within setmaxnreg's 240 and BWD_SM90_SPILL_BUDGET bytes of spills (0
#   without a softcap; its 1 - tanh^2 costs up to 128 bytes stored and 160 loaded at 128).
# - head_dim 192 and 256: dK and dV over all of d do not fit a thread, so the two warpgroups
#   split d (`split_d`): 1.53x-1.80x the mma.sync backward at 256, whose 215 KB of shared
#   memory leave no room for the writer. 192 (the class of 136-192) runs unpadded on 64-byte
#   atoms (atom_cols=32: three per warpgroup's 96 columns) with the writer in 210 KB:
#   1.36x-1.50x the tile padded to 256 (deterministic 1.39x-1.67x), told one CTA per SM
#   (.minnctapersm 1; without it C7508, setmaxnreg ignored, and 580 bytes of spills).
BWD_SM90_TILES = {64: (128, 2, 2, 1, False, True, 64, True, True),
                  128: (64, 2, 3, 1, False, True), 192: (64, 2, 2, 1, True, True, 32),
                  256: (64, 2, 2, 1, True)}
BWD_SM90_SOFTCAP_TILES = {64: (64, 1, 2, 2, False, True), 128: (64, 2, 3, 1)}
BWD_SM90_DETERMINISTIC_TILES = {64: (128, 2, 2, 1, False, True, 64, True, True),
                                128: (80, 2, 2, 1, False, True, 64, True, True)}
BWD_SM90_DETERMINISTIC_SOFTCAP_TILES = {64: (64, 2, 2, 1, False, True)}
BWD_SM90_SPILL_BUDGET = 192
BWD_SM90_AUTO = (64, 128, 192, 256)  # the head_dim classes 'auto' runs the wgmma backward on
# Whether 'auto' runs the backward of a call with a score_mod or mask_mod on the wgmma kernel
# (sm90) rather than the mma.sync one: 1.26x-1.51x its speed on each of 18 rows (causal, window,
# softcap, ALiBi, document and prefix-LM mods, S 1k-16k, head_dim 128; H100,
# docs/perf/2026-12-07-h100-bwd-mods/), the mods' GPU tests passing on both.
SM90_MODS = True
BWD_BACKENDS = ("auto", "sm80", "sm90")


def check_bwd_backend(backend) -> str:
    """`backend` if it is one of BWD_BACKENDS; the one rule the backward's entry points and
    `bwd_backend` check it by."""
    if not isinstance(backend, str) or backend not in BWD_BACKENDS:
        raise ValueError(f"backend must be one of {BWD_BACKENDS} for the backward, got "
                         f"{backend!r}")
    return backend


def bwd_sm90_tile(dtype: str, head_dim: int, softcap: bool = False,
                  deterministic: bool = False) -> WgmmaBwdTileConfig | None:
    """The Hopper backward's tile for head_dim, or None where it has none. A softcap takes its
    own tiles where it has them; deterministic takes its own where it has them, and of those a
    softcap's."""
    cls = head_dim_class(head_dim)
    found = BWD_SM90_TILES.get(cls)
    if softcap:
        found = BWD_SM90_SOFTCAP_TILES.get(cls, found)
    if deterministic:
        table = BWD_SM90_DETERMINISTIC_SOFTCAP_TILES if softcap else BWD_SM90_DETERMINISTIC_TILES
        found = table.get(cls, found)
    return None if found is None else bwd_sm90_entry_tile(found, dtype, head_dim)


def bwd_sm90_entry_tile(entry: tuple, dtype: str, head_dim: int) -> WgmmaBwdTileConfig:
    """The tile of an entry of the BWD_SM90_* tables, (block_m, consumers, q_stages,
    ctas_per_sm[, split_d, dq_writer, atom_cols, dv_after_ds, dq_before_dk]), at head_dim and
    dtype."""
    return WgmmaBwdTileConfig(head_dim, *entry[:2], dtype, *entry[2:])


def bwd_backend(arch: str, dtype: str, head_dim: int, backend: str = "auto") -> str:
    """'sm80' or 'sm90': the backward kernel a call runs. 'auto' takes the wgmma kernel on
    sm90 for the head_dim classes of BWD_SM90_AUTO (all of them): on the H200 it ran 1.2x-1.6x
    the mma.sync kernel on every shape measured up to head_dim 128, default and deterministic
    (docs/perf/2026-12-02-h200-bwd-sm90), and 1.05x-1.8x at 192 and 256 (-split-d; 192 ran
    1.36x-1.50x faster again on 64-byte atoms with the dQ writer, -2026-12-03-h200-bwd-192)."""
    check_bwd_backend(backend)
    if backend == "sm90":
        if Arch.of_name(arch).major != 9:
            raise ValueError(f"backend='sm90' (the wgmma backward) runs on sm90 only, not "
                             f"{arch}")
        if bwd_sm90_tile(dtype, head_dim) is None:
            raise ValueError(f"backend='sm90' has no backward tile for head_dim {head_dim}; "
                             f"use backend='sm80' or 'auto'")
        return "sm90"
    if (backend == "auto" and Arch.of_name(arch).major == 9
            and head_dim_class(head_dim) in BWD_SM90_AUTO):
        return "sm90"
    return "sm80"


# The wgmma backward's CTAs split a K/V group's query heads (`bwd_head_splits`) until the grid
# holds BWD_HEAD_SPLIT_WAVES[causal] CTAs per SM. A split costs dK and dV's float32 sums (zeroed,
# added, converted by a second postprocess); it buys the SMs a small batch of few K/V heads
# leaves idle, and under causal shorter long poles (key block 0 sees every query). A/B on the
# H200 (bf16, head_dim 128, 32/8 and 64/8 heads, batch 1-4, docs/perf/2026-12-02-h200-bwd-gqa):
# causal, one query head per CTA ran 1.06x-1.39x the unsplit kernel at batch 1 (0.98x-1.32x at
# batch 2-4) and within 3% of the best split everywhere; 8 CTAs per SM picks within 3% of the
# best on every row but one (4 x 64/8 x 8k: unsplit, 4% behind 4 splits); non-causal,
# splitting a grid that already covers the SMs once lost 6-10% (1 x 32/8 x 2k: 128 CTAs),
# while 16 CTAs split in 4 ran 2.6x.
BWD_HEAD_SPLIT_WAVES = {False: 0.9, True: 8}


@functools.lru_cache(maxsize=4096)
def bwd_head_splits(key_blocks: int, heads_kv: int, group: int, batch: int, num_sms: int,
                    causal: bool) -> int:
    """Over how many CTAs the wgmma backward splits each K/V head's group of query heads: the
    fewest (a divisor of group) that give the grid BWD_HEAD_SPLIT_WAVES[causal] CTAs per SM,
    at most the whole group (one query head per CTA)."""
    ctas = key_blocks * heads_kv * batch
    for splits in range(1, group + 1):
        if group % splits == 0 and ctas * splits >= BWD_HEAD_SPLIT_WAVES[causal] * num_sms:
            return splits
    return group


def bwd_keys(arch: str, dtype: str, head_dim: int, causal: bool, *, local: bool = False,
             softcap: bool = False, varlen: bool = False, deterministic: bool = False,
             tile_arch: str | None = None, backend: str = "auto", head_splits: int = 1,
             capture_grads: bool = False) -> tuple:
    """(preprocess, main, postprocess) keys of one backward call, and the dK/dV postprocess's
    where head_splits > 1 (the wgmma backward only). capture_grads: the call's score_mod adds
    its captured tensors' gradients, whose sums and derivatives take the wgmma backward's
    softcap tiles (ptxas, sm_90a, head_dim 64, ALiBi's slopes' gradient through a block
    mask's lists: 632 bytes spilled on the 128 x 128 tile, 56 on the softcap's 64 x 64)."""
    rows = RowTile(head_dim, BWD_ROWS[0], BWD_ROWS[1], dtype)
    features = dict(local=local, softcap=softcap, varlen_q=varlen, varlen_k=varlen,
                    deterministic=deterministic)
    if bwd_backend(tile_arch or arch, dtype, head_dim, backend) == "sm90":
        tile = bwd_sm90_tile(dtype, head_dim, softcap or capture_grads, deterministic)
        main = BwdSm90Key(arch, causal, tile, kv_accum=head_splits > 1, **features)
    elif head_splits > 1:
        raise ValueError(f"head_splits > 1 is the wgmma backward's (sm90), got {head_splits} "
                         f"for the mma.sync one")
    else:
        main = BwdKey(arch, causal, bwd_tile(tile_arch or arch, dtype, head_dim), **features)
    keys = (BwdPrepKey(arch, rows), main, BwdPostKey(arch, main.tile, varlen))
    if head_splits > 1:
        keys += (BwdKvPostKey(arch, main.tile, varlen),)
    return keys
