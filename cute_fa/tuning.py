"""Kernel choice: backend, tile sizes and K/V stages per arch, head_dim class and causality.

Each row is tried in order; the first whose shared memory fits the arch wins.
(head_dim_max, causal) -> [(block_m, block_n, num_threads), ...]
Tuned on the H200 (bf16, S = 1k and 8k, see docs/perf/). The sm80 kernel takes 128x128 with
8 warps at head_dim 128, where 128x64 with 4 warps (32 query rows per warp) spills; the TMA
kernel keeps 128x64 with 4 warps. The smaller fallbacks are for the ~100 KB of sm86/89/120.
The forward's and decode's tables; the backward's are `tuning_bwd`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from .arch import ARCHS, SMEM_BYTES, Arch
from .compile.keys import Sm80Key, Sm90Key, TmaKey
from .compile.registry import REGISTRY
from .layouts import TileConfig

__all__ = ["ARCHS", "BACKENDS", "SMEM_BYTES", "TILES", "TMA_TILES", "kernel_key", "tile_config",
           "max_kv_stages", "check_backend", "resolve_backend"]

BACKENDS = ("sm80", "tma", "sm90", "auto")
# backends without the decode features (GQA packing, split-KV, paged or seqused_k caches):
# asked for by name they run every call as prefill and refuse the cache arguments
PREFILL_ONLY = ("tma", "sm90")

TMA_TILES = {
    (64, False): [(128, 64, 128), (64, 64, 128)],
    (64, True): [(128, 64, 128), (64, 64, 128)],
    (128, False): [(128, 64, 128), (64, 64, 128)],
    (128, True): [(128, 64, 128), (64, 64, 128)],
    (192, False): [(128, 64, 256), (64, 64, 128)],
    (192, True): [(128, 64, 256), (64, 64, 128)],
    (256, False): [(128, 64, 256), (64, 64, 128), (64, 32, 128)],
    (256, True): [(128, 64, 256), (64, 64, 128), (64, 32, 128)],
}

TILES = dict(TMA_TILES)  # the sm80 kernel's
TILES[128, False] = TILES[128, True] = [(128, 128, 256), (64, 64, 128)]


def head_dim_class(head_dim: int) -> int:
    for limit in (64, 128, 192, 256):
        if head_dim <= limit:
            return limit
    raise ValueError(f"head_dim must be at most 256, got {head_dim}")


def tile_config(arch: str, dtype: str, head_dim: int, causal: bool,
                backend: str = "sm80") -> TileConfig:
    """The TileConfig the sm80 (or, with backend='tma', the TMA) kernel uses on `arch`."""
    budget = Arch.of_name(arch).smem_bytes
    table = TMA_TILES if backend == "tma" else TILES
    for block_m, block_n, num_threads in table[head_dim_class(head_dim), causal]:
        try:
            cfg = TileConfig(head_dim=head_dim, block_m=block_m, block_n=block_n,
                             num_threads=num_threads, dtype=dtype)
        except ValueError:
            continue  # the copy partition does not divide this tile
        if cfg.smem_bytes() <= budget:
            return cfg
    raise ValueError(f"no tile configuration of head_dim={head_dim} fits {arch}'s shared memory")


def check_backend(backend) -> str:
    """`backend` if it is one of BACKENDS; the one rule every entry point checks it by."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    return backend


def _require_support(backend: str, arch: str) -> None:
    b = REGISTRY[backend]
    if not b.supports(arch):
        needs = (f"an sm{b.min_major}0 GPU (Hopper)" if b.max_major == b.min_major
                 else f"an sm{b.min_major}0 or newer GPU")
        raise ValueError(f"backend={backend!r} needs {needs}; this one is {arch}; use "
                         f"backend='sm80' or 'auto'")


def resolve_backend(arch: str, backend: str, head_dim: int, causal: bool) -> str:
    """'sm80' or 'tma' for a requested backend; 'auto' is the faster one measured for the arch."""
    if check_backend(backend) != "auto":
        _require_support(backend, arch)
    if backend == "auto":
        return AUTO.get((arch, head_dim_class(head_dim), causal), "sm80")
    return backend


# Whether a ragged batch's tiles start most work first, heads fastest (`KernelKey.varlen_order`,
# the list from `runtime.ragged_order`), instead of entry after entry (and under causal each
# entry's longest query blocks first, `lpt`). Built and compiled on the CPU (2026-12-08, when
# no GPU was lent), not yet timed: off until docs/perf/2026-12-08-cpu-masks-mods/
# ab_varlen_order.py measures it.
VARLEN_ORDER = False


def kernel_key(arch: str, dtype: str, head_dim: int, causal: bool, backend: str = "auto",
               lazy_rescale: bool = True, tile_arch: str | None = None, *,
               local: bool = False, softcap: bool = False, varlen: bool = False,
               small_grid: bool = False, seqlen_q: int | None = None,
               persistent_sms: int = 0, pack_gqa: int = 1):
    """The KernelKey `forward` compiles and launches for this problem.

    local, softcap, varlen: a sliding window's lower edge, a softcap, a ragged batch
    (`compile.keys.KernelKey`); each keeps the tile, stages and register cap of the plain kernel
    but where FEATURE_TILES says otherwise. seqlen_q: the call's queries (`SM90_LONG_TILES`).
    small_grid: a causal call whose 128-row query blocks would not fill the GPU's SMs once
    (`is_small_grid`) takes SMALL_GRID_TILES' tile where the arch and backend have one.
    persistent_sms: the wgmma kernel's plain key is persistent on that many CTAs (0: not);
    pack_gqa: its plain dense key packs that many query heads per tile (`sm90_pack_gqa`).

    tile_arch (default: `arch`; `runtime.plan.tiles_of` forces one) is the arch whose tables choose
    the tile, K/V stages, register cap and 'auto' backend, while the kernel is compiled for
    `arch`: run on an H200, sm_120a's tables give exactly the kernel an sm120 GPU gets, but
    for its target instruction set.

    The TMA kernel's lazy rescale is on by default: on the H200 it measured within noise
    (0.92x-1.10x, docs/perf/README.md), but ptxas compiles it spill-free at head_dim 128 on
    sm_90a, the eager bf16 causal kernel with 24 bytes.
    """
    tiles = tile_arch or arch
    if backend == "auto":
        backend = AUTO_FEATURES.get((tiles, head_dim_class(head_dim), causal,
                                     (local, softcap, varlen)), backend)
    backend = resolve_backend(tiles, backend, head_dim, causal)
    _require_support(backend, arch)  # the forced arch may have TMA where this one has not
    ordered = varlen and VARLEN_ORDER  # a ragged batch's tiles most work first, not lpt's
    features = dict(local=local, softcap=softcap, varlen_q=varlen, varlen_k=varlen,
                    lpt=causal and not ordered, varlen_order=ordered)
    if backend == "sm90":  # its own tiles, no feature or small-grid tiles; persistent if plain
        plain = not (local or softcap or varlen)
        return sm90_key(arch, dtype, head_dim, causal,
                        long=plain and sm90_long(head_dim, causal, seqlen_q),
                        persistent=persistent_sms if plain else 0,
                        pack_gqa=pack_gqa if plain else 1, **features)
    cfg = tile_config(tiles, dtype, head_dim, causal, backend)
    cap = REGISTER_CAP_CTAS.get((tiles, backend, head_dim_class(head_dim), causal), 0)
    feature_tile = FEATURE_TILES.get((tiles, backend, head_dim_class(head_dim), causal,
                                      (local, softcap, varlen)))
    if small_grid and causal and not (local or softcap or varlen):
        feature_tile = SMALL_GRID_TILES.get((tiles, backend, head_dim_class(head_dim)))
    if feature_tile is not None:
        cfg = TileConfig(head_dim=head_dim, block_m=feature_tile[0], block_n=feature_tile[1],
                         num_threads=feature_tile[2], dtype=dtype)
        cap = 0
    if backend == "sm80":
        return Sm80Key(arch, causal, cfg, ctas_per_sm=cap, **features)
    tile = TMA_TILE_EXCEPTIONS.get((tiles.rstrip("a"), cfg.head_dim_padded))
    if tile is not None and feature_tile is None:
        cfg = TileConfig(head_dim=head_dim, block_m=tile[0], block_n=tile[1],
                         num_threads=tile[2], dtype=dtype)
    ctas = TMA_CTAS_PER_SM.get(head_dim_class(head_dim), 2)
    if feature_tile is not None and cfg.block_m == 64:  # the small-grid tile, as measured
        ctas = SMALL_GRID_CTAS_PER_SM
    stages = max_kv_stages(cfg, Arch.of_name(tiles).smem_bytes, ctas_per_sm=ctas)
    # S = Q K^T's k-loop: fine-grained B loads or not, traced step by step or not, whichever
    # ptxas compiles without spills (at head_dim 128 on sm_90a each choice of s_gemm_fine
    # spills 24-40 bytes in the other kind of kernel; kernels/common/gemm.py says why the causal one
    # is traced step by step)
    return TmaKey(arch, causal, cfg, ctas_per_sm=cap, kv_stages=stages,
                  lazy_rescale=bool(lazy_rescale), s_gemm_fine=not causal,
                  s_gemm_python_unrolled=causal, **features)


# ---- the warp-specialized wgmma kernel (backend 'sm90', Hopper only) ----

# (head_dim class, causal) -> (block_m, block_n, consumer threads): 64 query rows per consumer
# warpgroup. The O accumulator (64 x head_dim per warpgroup) and S (64 x block_n) live in
# registers, so block_n shrinks as head_dim grows: at 192 and 256 two K/V stages of 128 keys
# would not fit the 227 KB of shared memory next to Q. Measured on the H200
# (docs/perf/2026-12-01-h200-sm90/ab_tiles.jsonl, bf16): at head_dim 64 three consumer
# warpgroups (192 rows, 160 registers each) took the non-causal kernel from 406 to 491
# TFLOPs/s at S = 8k (275 -> 284 at 1k); causal, only from 2k queries (SM90_LONG_TILES). A
# third K/V stage at head_dim 128: 431 vs 401 at S = 1k, 612 vs 627 at 8k, equal causal: two.
SM90_TILES = {(64, False): (192, 128, 384), (64, True): (128, 128, 256),
              (128, False): (128, 128, 256), (128, True): (128, 128, 256),
              (192, False): (128, 112, 256), (192, True): (128, 112, 256),
              (256, False): (128, 80, 256), (256, True): (128, 80, 256)}
# (head_dim class, causal) -> (fewest queries, tile): plain calls (no window, softcap or ragged
# batch) of at least that many queries take this tile instead. Causal head_dim 64 on three
# warpgroups, spill-free with the mask's bit-mask form, ran on the H200 1.02x-1.17x the
# two-warpgroup tile from 2k queries, 0.89x at 1k, 0.79x-0.90x on batch 1-4 prefill of 512-1024
# (idle SMs): docs/perf/2026-12-04-h200-mask/ab_tiles.json, by a rule written before the run.
SM90_LONG_TILES = {(64, True): (2048, (192, 128, 384))}
SM90_KV_STAGES = 2
SM90_OVERLAP = True
# head_dim class -> whether the consumer warpgroups take turns issuing their wgmmas. On at 64
# to 192 (docs/perf/2026-12-01-h200-sm90/ab_schedule.jsonl: 624 vs 611 TFLOPs/s at head_dim
# 128, S = 8k; 647 vs 637 at 192), off at 256, where a warpgroup's two GEMMs are long enough
# to hide its softmax alone (643 vs 617 at S = 8k, 565 vs 512 at 1k).
SM90_PINGPONG = {64: True, 128: True, 192: True, 256: False}
# (head_dim class, causal) whose kernel converts P two values at a time (`Sm90Key.packed_p`).
# With `.to(dtype)` LLVM carries P into the next round as float32 (88 more registers at
# block_n 176). On an H100 (docs/perf/2026-12-06-h100-sm90-tiles, outputs bitwise equal), by the
# rule written before the runs, held in both: head_dim 192 and 256 1.02x-1.05x (geometric mean
# per class), 128 0.99x-1.02x, 64 0.99x-1.00x (0.97x-0.98x on packed-GQA prefill); the rule's
# one-row floor (0.97) failed once each at (128, causal) and (192, full).
SM90_PACKED_P = frozenset({(128, False), (192, True), (256, False), (256, True)})


# head_dim class -> (shortest, longest) query count of the calls whose wgmma kernel runs
# persistent (`Sm90Key.persistent`), where its tiles outnumber the SMs. None: in the 44-row A/B
# (H200, docs/perf/2026-12-03-h200-persistent) head_dim 128 at 1k-2k read 1.007x-1.085x the
# one-tile grid, but three re-runs of 4 of those rows, after the race fix, read 0.984x-1.018x.
SM90_PERSISTENT_SEQLEN: dict = {}


def sm90_persistent(head_dim: int, causal: bool, seqlen_q: int, heads_q: int, batch: int,
                    num_sms: int) -> bool:
    """Whether 'auto' runs a plain dense call's wgmma kernel persistent on num_sms CTAs."""
    cls = head_dim_class(head_dim)
    lo, hi = SM90_PERSISTENT_SEQLEN.get(cls, (1, 0))  # every forward call asks: cheap first
    return lo <= seqlen_q <= hi and -(-seqlen_q // _sm90_tile_shape(
        cls, causal, sm90_long(head_dim, causal, seqlen_q))[0]) * heads_q * batch > num_sms


# (head_dim class, causal) -> (fewest, most queries) of the plain dense calls whose wgmma kernel
# packs the GQA group (`Sm90Key.pack_gqa`): fitted on docs/perf/2026-12-06-h200-pack-gqa's run 1
# by a rule written first, held on runs 2-3 (0.94x-0.97x); at head_dim 128 no range held.
SM90_PACK_GQA_SEQLEN = {(64, False): (1, 4096), (64, True): (1, 4096)}


def sm90_pack_gqa(head_dim: int, causal: bool, seqlen_q: int, heads_q: int,
                  heads_kv: int) -> int:
    """The query heads 'auto' packs into a plain dense call's wgmma tiles: the call's whole
    GQA group where SM90_PACK_GQA_SEQLEN says and the group divides the tile's rows, else 1."""
    cls, group = head_dim_class(head_dim), heads_q // heads_kv
    lo, hi = SM90_PACK_GQA_SEQLEN.get((cls, causal), (1, 0))  # every forward call asks
    return group if group > 1 and lo <= seqlen_q <= hi and _sm90_tile_shape(
        cls, causal, sm90_long(head_dim, causal, seqlen_q))[0] % group == 0 else 1


def sm90_long(head_dim: int, causal: bool, seqlen_q: int | None) -> bool:
    """Whether a plain call of seqlen_q queries takes SM90_LONG_TILES' tile (None: no)."""
    found = SM90_LONG_TILES.get((head_dim_class(head_dim), causal))
    return found is not None and seqlen_q is not None and seqlen_q >= found[0]


def _sm90_tile_shape(cls: int, causal: bool, long: bool) -> tuple:  # (block_m, block_n, threads)
    return SM90_LONG_TILES[cls, causal][1] if long else SM90_TILES[cls, causal]


def sm90_tile(dtype: str, head_dim: int, causal: bool, long: bool = False) -> TileConfig:
    """The wgmma kernel's tile; long: SM90_LONG_TILES' (`sm90_long`'s calls)."""
    block_m, block_n, threads = _sm90_tile_shape(head_dim_class(head_dim), causal, long)
    return TileConfig(head_dim=head_dim, block_m=block_m, block_n=block_n,
                      num_threads=threads, dtype=dtype, wgmma=True)


def sm90_key(arch: str, dtype: str, head_dim: int, causal: bool, long: bool = False,
             **features) -> Sm90Key:
    """The wgmma kernel's key: its tile (long: `sm90_long`'s), ring and schedule for this
    head_dim; features are `kernel_key`'s (window, softcap, ragged batch, lpt)."""
    cfg = sm90_tile(dtype, head_dim, causal, long)
    cls = head_dim_class(head_dim)
    return Sm90Key(arch, causal, cfg, kv_stages=SM90_KV_STAGES, intra_wg_overlap=SM90_OVERLAP,
                   pingpong=SM90_PINGPONG[cls], packed_p=(cls, causal) in SM90_PACKED_P,
                   **features)


def mods_tile(key, block_size: tuple = ()) -> TileConfig:
    """The tile of `key` (a forward key) once the call has mods: its own; with a block mask of
    (query, key) block_size, the largest tile whose rows and keys each lie inside one block
    (`BlockMask.aligned`: then the lists and the mask_mod keep exactly what the mask says) with
    at most the tile's rows and keys, else the tile as it is (`api.mods.exact_blocks` then
    reads the blocks' kinds per score).

    A score_mod or mask_mod keeps the plain tile even where it spills: the wgmma kernel's 192
    x 128 at head_dim 64 (412-600 bytes with mods, ptxas sm_90a) ran 1.03x-1.21x the speed of
    the spill-free 128 x 128 with a causal mask_mod, ALiBi and a softcap score_mod (H100, S 4k
    and 16k, docs/perf/2026-12-07-h100-bwd-mods/). Blocks of 128 take 128 x 128 there: 1.33x-
    1.51x the 192-row tile, which straddles them (a document mask, same run)."""
    cfg = key.tile
    if not block_size or (block_size[0] % cfg.block_m == 0 and block_size[1] % cfg.block_n == 0):
        return cfg
    rows = (128,) if key.backend == "sm90" else (cfg.block_m, 128, 64)
    for block_m in (m for m in dict.fromkeys(rows) if m <= cfg.block_m and block_size[0] % m == 0):
        for block_n in range(cfg.block_n - cfg.block_n % 16, 15, -16):
            if block_size[1] % block_n == 0:
                # 64 rows per consumer warpgroup; 16 rows per warp at least (mma.sync)
                threads = 2 * block_m if key.backend == "sm90" else min(cfg.num_threads,
                                                                        2 * block_m)
                try:
                    return dataclasses.replace(cfg, block_m=block_m, block_n=block_n,
                                               num_threads=threads)
                except ValueError:  # not a tile this kernel's warps can split
                    break
    return cfg


def max_kv_stages(cfg: TileConfig, smem_budget: int, ctas_per_sm: int = 2, cap: int = 4) -> int:
    """Stages of the K/V ring: as many as fit while `ctas_per_sm` CTAs share the SM
    (or one CTA, if even two stages do not fit that way), at most `cap`."""
    for per_cta in (smem_budget // ctas_per_sm, smem_budget):
        stages = min(cap, (per_cta - cfg.smem_bytes(0) - 1024) // cfg.smem_bytes_kv_stage())
        if stages >= 2:
            return stages
    return 1


# Tiles of the TMA kernel where they differ from TMA_TILES, by (arch, padded head_dim): on
# sm_120a, ptxas spills the 128x64 tile at a padded head_dim of 128 (32 query rows per warp:
# 128 O + 64 S accumulators per thread) by up to 456 bytes; 128x32 compiles without spills
# (while at 96 it is 128x32 that spills). Checked with ptxas only, not on an sm120 GPU.
TMA_TILE_EXCEPTIONS = {("sm_120", 128): (128, 32, 128)}

# The persistent TMA kernel (`TmaKey.persistent`) carries a tile loop and the next tile's
# refills: where ptxas then spills with the one-tile kernel's S = Q K^T k-loop form, the form
# it spills least with, by (arch, (block_m, block_n), padded head_dim, causal). On sm_90a at
# head_dim 128: non-causal 20 bytes with fine loads, none without; causal 28 without, 4 with.
TMA_PERSISTENT_S_GEMM_FINE = {("sm_90a", (128, 64), 128, False): False,
                              ("sm_90a", (128, 64), 128, True): True}


def tma_persistent(key: TmaKey, ctas: int) -> TmaKey:
    """`key` (a TMA kernel's) persistent on `ctas` CTAs, in the k-loop form ptxas compiles
    best for it (TMA_PERSISTENT_S_GEMM_FINE)."""
    fine = TMA_PERSISTENT_S_GEMM_FINE.get(
        (key.arch, (key.tile.block_m, key.tile.block_n), key.tile.head_dim_padded, key.causal),
        key.s_gemm_fine)
    return dataclasses.replace(key, persistent=ctas, s_gemm_fine=fine)


# Kernels with a sliding window, a softcap or a ragged batch keep a few more values live in
# registers (the window's edges, the softcap's scale, the entry's offsets and lengths), and
# ptxas, at 255 registers already for most plain kernels, then spills some of them.
# - The sm80 kernel: where it does, for either dtype, the kernel takes the first spill-free
#   tile of: the plain tile with twice the warps, half the key block, a 64-row tile. (arch,
#   backend, head_dim class, causal, (local, softcap, varlen)) -> (block_m, block_n,
#   num_threads), from ptxas on sm_80 and sm_90a (sm_120a's smaller tiles are spill-free);
#   one kernel spills with every candidate (SPILLING_FEATURE_KERNELS). Not timed.
# - The TMA kernel keeps its plain tile and spills up to FEATURE_SPILL_BUDGET bytes on sm_90a:
#   the spill-free tile of twice the warps measured far slower on the H200
#   (docs/perf/2026-12-01-h200-prefill/).
FEATURE_TILES: dict = {
    ('sm_80', 'sm80', 64, False, (False, True, False)): (128, 64, 256),
    ('sm_80', 'sm80', 64, False, (False, True, True)): (128, 64, 256),
    ('sm_80', 'sm80', 64, False, (True, True, False)): (128, 64, 256),
    ('sm_80', 'sm80', 64, False, (True, True, True)): (128, 64, 256),
    ('sm_80', 'sm80', 64, True, (False, True, False)): (128, 64, 256),
    ('sm_80', 'sm80', 64, True, (True, True, True)): (128, 64, 256),
    ('sm_80', 'sm80', 128, False, (True, True, True)): (128, 64, 256),
    ('sm_80', 'sm80', 128, True, (True, True, False)): (128, 64, 256),
    ('sm_80', 'sm80', 128, True, (True, True, True)): (128, 64, 256),
    ('sm_80', 'sm80', 256, False, (True, True, True)): (128, 32, 256),
    ('sm_80', 'sm80', 256, True, (False, True, True)): (128, 32, 256),
    ('sm_90a', 'sm80', 64, False, (False, True, False)): (128, 64, 256),
    ('sm_90a', 'sm80', 64, False, (False, True, True)): (128, 64, 256),
    ('sm_90a', 'sm80', 64, False, (True, True, False)): (128, 64, 256),
    ('sm_90a', 'sm80', 64, False, (True, True, True)): (128, 64, 256),
    ('sm_90a', 'sm80', 64, True, (False, True, True)): (128, 64, 256),
    ('sm_90a', 'sm80', 64, True, (True, True, False)): (128, 64, 256),
    ('sm_90a', 'sm80', 64, True, (True, True, True)): (128, 64, 256),
    ('sm_90a', 'sm80', 128, False, (True, True, True)): (128, 64, 256),
    ('sm_90a', 'sm80', 128, True, (False, True, False)): (128, 64, 256),
    ('sm_90a', 'sm80', 128, True, (False, True, True)): (128, 64, 256),
    ('sm_90a', 'sm80', 256, False, (True, True, True)): (128, 32, 256),
    ('sm_90a', 'sm80', 256, True, (False, False, True)): (128, 32, 256),
    ('sm_90a', 'sm80', 256, True, (False, True, False)): (128, 32, 256),
    ('sm_90a', 'sm80', 256, True, (False, True, True)): (128, 32, 256),
    ('sm_90a', 'sm80', 256, True, (True, True, False)): (128, 32, 256),
    ('sm_90a', 'sm80', 256, True, (True, True, True)): (128, 32, 256),
}

# Causal prefill calls too small to fill the GPU once with 128-row query blocks (fewer CTAs
# than SMs: batch 1 at S = 512 with 32 query heads) run 64-row tiles, twice the CTAs: on the
# H200 1.2x-1.3x on such calls, slower on every larger grid
# (docs/perf/2026-12-01-h200-prefill/ab_small_grid_tiles.json, TMA kernel, causal).
# (arch, backend, head_dim class) -> tile; its K/V ring sized for SMALL_GRID_CTAS_PER_SM CTAs.
SMALL_GRID_TILES = {("sm_90a", "tma", 64): (64, 64, 128), ("sm_90a", "tma", 128): (64, 64, 128)}
SMALL_GRID_CTAS_PER_SM = 3
SMALL_GRID_BLOCK_M = 128  # the tile a grid is counted in


def is_small_grid(seqlen_q: int, heads_q: int, batch: int, num_sms: int) -> bool:
    """Whether a causal prefill call's 128-row query blocks are fewer than the GPU's SMs."""
    return -(-seqlen_q // SMALL_GRID_BLOCK_M) * heads_q * batch < num_sms


# (arch, head_dim class, causal, (local, softcap, varlen)) -> 'auto''s backend for a feature
# kernel where it is not AUTO's. Empty: on sm_90a the wgmma kernel runs every prefill call.
AUTO_FEATURES: dict = {}
SPILLING_FEATURE_KERNELS = {("sm_90a", "sm80", 256, True, (False, True, False)): 16}
# Bytes of spill stores (and loads) a feature kernel that keeps its plain tile may have: the
# TMA kernel's (at most 44 on sm_90a) and the decode kernels' with a window or softcap (at most
# 48, some paged head_dim-64 ones: memory-bound, spilling to L1 costs them little).
FEATURE_SPILL_BUDGET = 48

# Bytes of spill stores (and loads) a forward kernel with a score_mod / mask_mod may have
# (`kernels/common/mods.py`, on the plain call's tile), from ptxas for the mods of
# tests/test_compile_mods.py: up to 124 for most (the wgmma kernel's head_dim 64 tile the
# most), 260 / 280 for a bias table gathered per score (relative_bias) in the TMA kernel's
# sm_90a head_dim 128 tile, whose 255 registers were already taken; sm_120a's TMA tiles are
# spill-free. The wgmma kernel's head_dim-64 tile spills 412-600 with mods and is still the
# faster one there (`mods_tile`); the tests hold the head_dim-128 kernels to this budget.
MOD_SPILL_BUDGET = 288
# The same for a block mask whose blocks no tile of the kernel fits (`api.mods.exact_blocks`:
# the blocks' kinds loaded per score beside the mask_mod): 424 bytes with a document mask on
# the wgmma kernel's 128 x 128 tile, 824 on the cp.async kernel's (ptxas, sm_90a). A fallback
# for blocks smaller than the kernels' tiles (torch's default of 128 never takes it).
EXACT_BLOCKS_SPILL_BUDGET = 1024
# The same for the mma.sync backward adding a score_mod's captured tensor's gradient
# (`BwdKey.capture_grads`): ptxas for head_dim 128, causal, sm_80: 44-68 bytes for a table
# read per head, row or scalar, 236 per key (the score kept for the derivative) or per score
# (a reduction each); 316 per score on sm_90a (tests/test_compile_mods.py).
CAPTURE_GRAD_SPILL_BUDGET = 384

# CTAs per SM the TMA kernel's K/V ring is sized for (default 2): three at head_dim 64, whose
# causal kernel is capped for three (REGISTER_CAP_CTAS); 3 vs 4 stages measured the same.
TMA_CTAS_PER_SM = {64: 3}

# (arch, backend, head_dim class, causal) -> CTAs per SM the registers are capped for
# (ptxas's .minnctapersm); absent: ptxas's choice. ncu on the H200 (docs/perf/README.md):
# at head_dim 64 ptxas gives the kernels 205-241 registers, so two CTAs (8 warps) share an
# SM and the warps stall mostly on fixed-latency dependencies. Capped at 168 registers for
# three CTAs, the causal TMA kernel compiles without spills and measured ~3-5% faster; the
# non-causal TMA and the sm80 kernels (50-60 bytes of spills) lost 4-10%: ptxas's choice.
REGISTER_CAP_CTAS: dict = {("sm_90a", "tma", 64, True): 3}

# 'auto' picks per (arch, head_dim class, causal); absent entries use the sm80 kernel. On
# sm_90a the wgmma kernel, at every head_dim class: on the H200 it is 1.2x-1.6x the TMA kernel
# (docs/perf/2026-12-01-h200-sm90/; causal head_dim 64, short calls too: 1.16x-1.45x,
# 2026-12-04-h200-mask/ab_tiles.json). Decode calls (few queries, a KV cache) stay on the
# cp.async kernel's decode path. sm120 is not measured here, so it stays on sm80.
AUTO: dict = {("sm_90a", hd, causal): "sm90" for hd in (64, 128, 192, 256)
              for causal in (False, True)}


# ---- decode: GQA packing, split-KV, paged / seqused_k caches (the cp.async kernel) ----

# Calls with at most this many queries per sequence are decode calls: the query heads of a
# GQA group are packed into one tile (K/V read once per group), the tile is DECODE_TILES'
# and the keys may be split over several CTAs.
DECODE_MAX_SEQLEN_Q = 16

# head_dim class -> [(block_m, block_n, num_threads), ...]: the decode tile for more packed rows
# than one 16-row slab: 64 packed rows (16 per warp, the fewest an m16n8k16 warp takes) so
# that one group of up to 64 (query, head) rows fills a tile. At head_dim 192 and 256, 32-key
# blocks: with 64 ptxas spills 32 bytes at 255 registers (the O accumulator alone holds 128
# floats per thread).
DECODE_TILES = {64: [(64, 128, 128), (64, 64, 128)], 128: [(64, 64, 128)],
                192: [(64, 32, 128)], 256: [(64, 32, 128)]}

# head_dim class -> [(block_m, block_n, num_threads), ...]: decode tiles whose warps split the
# keys as well as the rows (`TileConfig.warps_split_keys`), for calls whose packed rows
# (queries x heads of a group) fit block_m: the smallest that holds them is taken. One query of
# a 32/8 or 64/8 GQA model is 4-8 rows: in a 64-row tile of 16 rows per warp one warp would
# hold them while three read every key for padding; here the 4 warps each take a quarter of
# every K/V tile's keys (two warps per 16-row slab for 32 rows) and combine their partial
# softmax results at the end. Measured on the H200: docs/perf/2026-12-01-h200-decode-2.
DECODE_WARP_SPLIT_TILES = {64: [(16, 128, 128), (32, 64, 128)],
                           128: [(16, 64, 128), (32, 64, 128)],
                           192: [(16, 64, 128), (32, 64, 128)],
                           256: [(16, 64, 128), (32, 64, 128)]}


def decode_rows_class(head_dim: int, packed_rows: int) -> int:
    """block_m of the warp-split decode tile that `packed_rows` rows take (the smallest that
    holds them), or 0 where none does (the 64-row tile). What of a call's query length the
    decode tile depends on."""
    for block_m, _, _ in DECODE_WARP_SPLIT_TILES.get(head_dim_class(head_dim), []):
        if packed_rows <= block_m:
            return block_m
    return 0


# (head_dim class, block_m) -> CTAs per SM their registers are capped for: 3 (168 registers per
# thread), which ptxas fills without spilling, except for O accumulators of 64 floats per thread
# with 32 keys per warp (head_dim 128, 32 rows: 8 bytes of spills with a paged cache) and of
# 96-128 floats (head_dim 192 and 256: 4-60 bytes on some archs), capped for 2 (255). Left to
# itself ptxas gave sm_80's head_dim-64 kernel 96 registers and spilled 4 bytes. (At head_dim
# 64 the 32-row tile takes 64-key stages: with 128, 64 keys per warp, it spilled 4-24 bytes.)
DECODE_WARP_SPLIT_CTAS_PER_SM = {(64, 16): 3, (64, 32): 3, (128, 16): 3, (128, 32): 2,
                                 (192, 16): 2, (192, 32): 2, (256, 16): 2, (256, 32): 2}

# head_dim class -> CTAs per SM the decode kernel's registers are capped for (absent: ptxas's
# choice). At head_dim 128 ptxas on its own settles on 168 registers (three CTAs) and spills
# 12-16 bytes in some feature combinations; capped for two it takes ~180-190, spill-free.
DECODE_CTAS_PER_SM = {128: 2}

# head_dim class -> the decode ring's K/V stages (fewer where two CTAs' worth does not fit);
# absent: single K and V buffers (at 192/256 the ring spills on sm_120a). H200 (2026-12-01-h200-
# decode/sweep_stages.txt): 2 stages had the best geomean, a few % over 0 and 3 (0 won at B32-64).
DECODE_KV_STAGES = {64: 2, 128: 2}
# A paged ring reads its next block's pages a round ahead (`Sm80Key.page_prefetch`): 0.988x and
# 0.986x the at-issue lookup's time on two runs (H100, docs/perf/2026-12-06-h100-page-prefetch).
DECODE_PAGE_PREFETCH = True

# split-KV (flash-decoding): a call whose tiles (query blocks x K/V heads x batch) leave the GPU
# partly idle has its keys split; `num_splits_heuristic` takes the fewest splits whose waves
# are busy at least SPLIT_EFFICIENCY of the best split count's, within MAX_SPLITS and at least
# a minimum of key blocks per split (each split pays a Q load and a partial write), and never
# splits a grid of MANY_WAVES waves or more. A wave, as measured on the H200
# (docs/perf/2026-12-01-h200-decode-2/): with fewer tiles than SMs (small batch) one CTA per
# SM, at least MIN_BLOCKS_PER_SPLIT blocks each (a CTA's K/V ring keeps its SM's loads in
# flight on its own); with at least as many tiles as SMs every CTA an SM holds
# (`decode_ctas_per_sm`), at least MIN_BLOCKS_PER_SPLIT_FULL blocks per split.
SPLIT_EFFICIENCY = 0.9
MIN_BLOCKS_PER_SPLIT = 4
MIN_BLOCKS_PER_SPLIT_FULL = 16
MAX_SPLITS = 128
MANY_WAVES = 4
# Split-KV in one launch (`Sm80Key.fused_merge`: each query block's last CTA merges) where that
# merge is one round of loads (MERGE_SLICE floats of a row per thread) and the unsplit grid is
# smaller than the GPU; else the merge kernel follows. H200 (2026-12-04-h200-decode-one-launch):
# one launch took 0.91x-1.00x two's time there, up to 1.63x with several rounds of loads.
DECODE_FUSED_MERGE = "rule"  # "always" / "never": one form forced (the tests, the A/B)
MERGE_SLICE = 4  # kernels/fwd/merge.VEC


def decode_fused_merge(key: Sm80Key, rows: int, tiles: int, num_sms: int) -> bool:
    """rows: the packed rows of a query block of the call; tiles: its CTAs unsplit."""
    if DECODE_FUSED_MERGE != "rule":
        return DECODE_FUSED_MERGE == "always"
    return tiles < num_sms and rows * key.tile.head_dim <= MERGE_SLICE * key.tile.num_threads

# the longest query sequence a call takes: causal kernels put the query blocks on the grid's y
# (longest first across heads), at most 65535 of them, of up to 64 rows (the small-grid tile)
MAX_SEQLEN_Q = 65535 * 64

# page sizes of a paged K/V cache: multiples of 16 keys (a copy pass's rows) up to this
MAX_PAGE_SIZE = 1024


def supported_page_size(page_size) -> bool:
    """The page sizes the decode kernel is compiled for (`forward` and `precompile` check
    them by this rule)."""
    return (isinstance(page_size, int) and not isinstance(page_size, bool)
            and page_size % 16 == 0 and 16 <= page_size <= MAX_PAGE_SIZE)


def decode_tile(arch: str, dtype: str, head_dim: int, packed_rows: int = 64) -> TileConfig:
    """The decode tile for `packed_rows` (query, head) rows per K/V head: one whose warps split
    the keys where `decode_rows_class` gives one, else DECODE_TILES' (each the first that is
    valid for the head_dim and fits the arch's shared memory)."""
    budget = Arch.of_name(arch).smem_bytes
    hd = head_dim_class(head_dim)
    rows = decode_rows_class(head_dim, packed_rows)
    tiles = [t + (True,) for t in DECODE_WARP_SPLIT_TILES.get(hd, []) if t[0] == rows]
    for block_m, block_n, num_threads, split in tiles + [t + (False,) for t in DECODE_TILES[hd]]:
        try:
            cfg = TileConfig(head_dim=head_dim, block_m=block_m, block_n=block_n,
                             num_threads=num_threads, dtype=dtype, warps_split_keys=split)
        except ValueError:
            continue  # the copy partition does not divide this tile
        if cfg.smem_bytes() <= budget:
            return cfg
    raise ValueError(f"no decode tile of head_dim={head_dim} fits {arch}'s shared memory")


def decode_key(arch: str, dtype: str, head_dim: int, causal: bool, *, seqlen_q: int,
               group: int, page_size: int, seqused_k: bool, split_kv: bool,
               tile_arch: str | None = None, local: bool = False, softcap: bool = False,
               varlen_q: bool = False, varlen_k: bool = False) -> Sm80Key:
    """The cp.async kernel's key for a call with decode features: a short query (seqlen_q <=
    DECODE_MAX_SEQLEN_Q: GQA-packed, decode tile), a paged cache, per-entry key counts or
    split keys. A longer query, or a ragged one (varlen_q: a paged cache read by a ragged
    batch of queries), keeps the prefill tile, unpacked."""
    tiles = tile_arch or arch
    short = seqlen_q <= DECODE_MAX_SEQLEN_Q and not varlen_q
    cfg = decode_tile(tiles, dtype, head_dim, seqlen_q * group) if short else \
        tile_config(tiles, dtype, head_dim, causal, "sm80")
    if cfg.warps_split_keys:
        cap = DECODE_WARP_SPLIT_CTAS_PER_SM[head_dim_class(head_dim), cfg.block_m]
    elif short:
        cap = DECODE_CTAS_PER_SM.get(head_dim_class(head_dim), 0)
    else:
        cap = REGISTER_CAP_CTAS.get((tiles, "sm80", head_dim_class(head_dim), causal), 0)
    ring = DECODE_KV_STAGES.get(head_dim_class(head_dim), 0) if short else 0
    stages = max_kv_stages(cfg, Arch.of_name(tiles).smem_bytes, ctas_per_sm=2, cap=ring)
    stages = stages if ring >= 2 and stages >= 2 else 0
    return Sm80Key(arch, causal, cfg, ctas_per_sm=cap, kv_stages=stages,
                   pack_gqa=group if short else 1, split_kv=split_kv, page_size=page_size,
                   seqused_k=seqused_k, local=local, softcap=softcap, varlen_q=varlen_q,
                   varlen_k=varlen_k, lpt=causal and not short and not split_kv,
                   page_prefetch=DECODE_PAGE_PREFETCH and page_size > 0 and stages > 0)


def decode_ctas_per_sm(key: Sm80Key, arch: str) -> int:
    """How many CTAs of this kernel one SM holds: the fewest that its shared memory (the arch's
    per-CTA limit + 1 KB per SM, 1 KB reserved per CTA, the ring's barriers in a 1 KB-aligned
    block), its threads (2048 per SM) and its registers allow (the key's cap, which ptxas
    fills, as DECODE_WARP_SPLIT_CTAS_PER_SM says; uncapped: 255 registers per thread)."""
    cfg = key.tile
    smem = cfg.smem_bytes(max(key.kv_stages, 1)) + (1024 if key.kv_stages else 0) + 1024
    by_smem = (Arch.of_name(arch).smem_bytes + 1024) // smem
    by_regs = key.ctas_per_sm or 65536 // (256 * cfg.num_threads)
    return max(1, min(by_smem, 2048 // cfg.num_threads, by_regs, 32))


@functools.lru_cache(maxsize=4096)
def num_splits_heuristic(tiles: int, n_blocks: int, num_sms: int, ctas_per_sm: int = 1) -> int:
    """How many key splits a decode call gets: `tiles` CTAs without splitting (query blocks x
    K/V heads x batch), `n_blocks` key blocks per query block, `num_sms` on the GPU, each
    holding `ctas_per_sm` of the kernel's CTAs (`decode_ctas_per_sm`)."""
    if tiles < num_sms:
        slots, least = num_sms, MIN_BLOCKS_PER_SPLIT
    else:
        slots, least = num_sms * ctas_per_sm, MIN_BLOCKS_PER_SPLIT_FULL
    most = min(n_blocks // least, MAX_SPLITS)
    if tiles >= MANY_WAVES * slots or most < 2:
        return 1

    def efficiency(splits):  # busy share of the waves' CTA slots
        waves = tiles * splits / slots
        return waves / math.ceil(waves)

    best = max(efficiency(s) for s in range(1, most + 1))
    return next(s for s in range(1, most + 1) if efficiency(s) >= SPLIT_EFFICIENCY * best)
