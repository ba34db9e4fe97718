"""Kernel keys: what one compiled kernel depends on, one frozen dataclass per kernel family.

A key is the whole of what `cute.compile` is told about a kernel besides the fake arguments'
dtypes: the arch it compiles for, its tile and its family's feature fields. Keys are the
compile cache's index (`compile.cache`), so two calls that get equal keys share one kernel.
Importing this module needs neither torch nor the DSL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..layouts import TileConfig
from ..layouts.config import BwdTileConfig, RowTile, WgmmaBwdTileConfig


@dataclass(frozen=True)
class KernelKey:
    """What one compiled forward kernel depends on. ctas_per_sm > 0 caps the registers so
    that this many CTAs fit one SM's register file (ptxas's .minnctapersm); 0 leaves the
    count to ptxas. causal: the keys have an upper edge (causal_offset, plus window_right
    where local); local: a sliding window's lower edge (window_left); softcap: scores pass
    through softcap * tanh(. / softcap); varlen_q / varlen_k: Q (and O, LSE) / K and V are
    ragged batches packed end to end, entry b's rows starting at cu_seqlens[b]; lpt: causal
    query blocks start longest first across heads (`kernels.sched.tile_scheduler.SingleTileScheduler`).
    varlen_order (a ragged Q): the CTAs take a ragged batch's tiles (entry, query block) in
    the order a list from the host gives (`runtime.ragged_order`: most key blocks first),
    heads fastest, instead of entry by entry.
    score_mod / mask_mod: a traced mod (`cute_fa.mods.ModGraph`, equal for equal graphs
    whatever the captured tensors hold) run on every score (`kernels/common/mods.py`); sinks:
    one more logit per query head in every row's softmax, of a key with value 0 (gpt-oss's
    attention sinks). block_sparse: each query block visits the key blocks a block mask lists
    for it (`cute_fa.mods.block_mask.BlockMask.kernel_blocks`; in a ragged batch or a KV
    cache cut to each entry's blocks, `per_sequence`), in ascending order, instead of every
    one its causal bound leaves (without causal, a window, persistence or split-KV; with GQA
    packing only in the cp.async kernel, for a mask whose lists every head shares). The mods'
    captured tensors, the sink logits
    and the block lists (their counts, then their indices) are the kernel's `score_tensors`
    argument."""

    arch: str
    causal: bool
    tile: TileConfig
    ctas_per_sm: int = 0
    lpt: bool = False
    local: bool = False
    softcap: bool = False
    varlen_q: bool = False
    varlen_k: bool = False
    score_mod: object = None
    mask_mod: object = None
    sinks: bool = False
    block_sparse: bool = False
    varlen_order: bool = False
    backend: ClassVar[str] = ""

    @property
    def mod_captures(self) -> tuple:
        """The mods' captured tensors (`cute_fa.mods.Capture`), the score_mod's then the
        mask_mod's: the first of the kernel's score tensors, in this order."""
        return tuple(c for g in (self.score_mod, self.mask_mod) if g is not None
                     for c in g.captures)

    @property
    def has_score_tensors(self) -> bool:
        """Whether the kernel reads tensors for its scores (the `score_tensors` argument): its
        mods' captured tensors, its sink logits, its block lists."""
        return bool(self.sinks or self.block_sparse or self.mod_captures)

    def _check_mods(self) -> None:
        for name in ("score_mod", "mask_mod"):
            graph = getattr(self, name)
            if graph is not None and getattr(graph, "role", None) != name:
                raise TypeError(f"{name} must be a traced {name} (cute_fa.mods.ModGraph), "
                                f"got {graph!r}")
        if self.score_mod is not None and self.softcap:
            raise ValueError("a softcap and a score_mod together: the softcap is a score_mod "
                             "(softcap * tanh(score / softcap)); give one or the other")
        if self.block_sparse and (self.causal or self.local or self.lpt
                                  or (getattr(self, "pack_gqa", 1) > 1
                                      and self.backend != "sm80")
                                  or getattr(self, "persistent", 0)
                                  or getattr(self, "split_kv", False)
                                  or getattr(self, "page_prefetch", False)):
            raise ValueError("block_sparse visits a block mask's key blocks: not causal (put "
                             "it in the mask), a window, lpt, GQA packing (but the cp.async "
                             "kernel's, whose packed heads share one list), persistence, "
                             "split-KV or page_prefetch")


def _check_order(key: KernelKey) -> None:
    """varlen_order: a ragged Q's tiles in a list's order, one CTA each, one query head each,
    its whole key range (`SingleTileScheduler`)."""
    if key.varlen_order and not (key.varlen_q and not key.lpt
                                 and getattr(key, "pack_gqa", 1) == 1
                                 and not getattr(key, "split_kv", False)
                                 and not getattr(key, "persistent", 0)):
        raise ValueError("varlen_order orders a ragged Q's tiles: it needs varlen_q, and no "
                         "lpt, GQA packing, split-KV or persistence")


def _check_persistent(persistent) -> None:
    """A persistent key's CTA count: 0 (one CTA per tile) or a positive int."""
    if isinstance(persistent, bool) or not isinstance(persistent, int) or persistent < 0:
        raise ValueError(f"persistent must be 0 or a CTA count, got {persistent!r}")


@dataclass(frozen=True)
class Sm80Key(KernelKey):
    """The cp.async kernel (`kernels/fwd/sm80.py`) and its decode features: pack_gqa query heads
    per K/V head share a tile (1: no packing); split_kv writes float32 partial O and LSE per
    key split, for `merge_attention`; page_size > 0 reads K/V from a paged cache through a page
    table; seqused_k takes each batch entry's key count from a tensor. kv_stages 0: one K
    and one V buffer; >= 2: a ring of that many K/V stages loading whole rounds ahead.
    fused_merge (with split_kv): the last CTA of a query block to finish merges the splits'
    partials into the call's output itself (`fwd/merge.merge_if_last`), so split-KV is one
    launch instead of the split kernel and the merge kernel. page_prefetch (with a paged cache
    and a ring): the pages of the ring's next block are read from the page table a round
    before its loads need them, one lookup per block where a page holds whole blocks."""

    kv_stages: int = 0
    pack_gqa: int = 1
    split_kv: bool = False
    page_size: int = 0
    seqused_k: bool = False
    fused_merge: bool = False
    page_prefetch: bool = False
    backend: ClassVar[str] = "sm80"

    def __post_init__(self):
        self._check_mods()
        _check_order(self)
        if self.kv_stages == 1 or self.kv_stages < 0:
            raise ValueError(f"kv_stages must be 0 or at least 2, got {self.kv_stages}")
        if self.pack_gqa < 1:
            raise ValueError(f"pack_gqa must be at least 1, got {self.pack_gqa}")
        if self.lpt and (self.pack_gqa > 1 or self.split_kv):
            raise ValueError("lpt orders unpacked, unsplit query blocks only")
        if self.page_size < 0 or self.page_size % 16:
            raise ValueError(f"page_size must be 0 or a positive multiple of 16, "
                             f"got {self.page_size}")
        if self.fused_merge and not (self.split_kv and not self.varlen_q):
            raise ValueError("fused_merge merges the splits of split_kv into a dense output: "
                             "it needs split_kv and no varlen_q")
        if self.page_prefetch and not (self.page_size and self.kv_stages):
            raise ValueError("page_prefetch reads a paged cache's pages a round ahead: it "
                             "needs page_size > 0 and kv_stages >= 2")


@dataclass(frozen=True)
class TmaKey(KernelKey):
    """The TMA kernel (`kernels/fwd/tma.py`): a ring of kv_stages K/V buffers; lazy_rescale
    skips O's rescale while the row max has grown little; s_gemm_fine loads K's fragments one
    k-step ahead (else a whole tile's at once) and s_gemm_python_unrolled traces the
    S = Q K^T k-loop step by step (else the compiler unrolls it): `tuning` picks whichever
    ptxas compiles without spills. persistent > 0: a grid of at most that many CTAs (the GPU's
    SMs times the CTAs one SM holds), each looping over tiles in a fixed stride
    (`kernels.sched.tile_scheduler.PersistentTileScheduler`), the ring's last rounds of a tile
    loading the next tile's first K/V blocks; 0: one CTA per tile."""

    kv_stages: int = 2
    lazy_rescale: bool = True
    s_gemm_fine: bool = True
    s_gemm_python_unrolled: bool = False
    persistent: int = 0
    backend: ClassVar[str] = "tma"

    def __post_init__(self):
        self._check_mods()
        _check_order(self)
        _check_persistent(self.persistent)
        if self.persistent and (self.varlen_q or self.varlen_k):
            raise ValueError("persistent loops over the tiles of a dense call: not with a "
                             "ragged batch")


@dataclass(frozen=True)
class Sm90Key(KernelKey):
    """The warp-specialized Hopper kernel (`kernels/fwd/sm90.py`): a TMA producer warp filling
    a ring of kv_stages K/V stages, consumer warpgroups running wgmma (the tile's num_threads
    counts them; `layouts.wgmma`). intra_wg_overlap: a warpgroup issues S of round j and P V of
    round j - 1 together and runs the softmax of j under the P V; pingpong: the consumer
    warpgroups take turns issuing their wgmmas (named barriers), so one's softmax runs under
    another's GEMMs. tma_store: O leaves through shared memory by one TMA store (ragged
    batches, whose tiles may run into the next entry's rows, store row by row instead).
    persistent > 0: a grid of at most that many CTAs (the GPU's SMs), each looping over tiles
    (`kernels.sched.tile_scheduler.PersistentTileScheduler`), O staged in its own buffer so
    that the next tile's Q lands under this tile's epilogue; 0: one CTA per tile. Tiles of
    unequal work (causal, a window) are taken as CTAs finish (`dynamic_tiles`), equal ones in
    turn. pack_gqa > 1: that many query heads of a K/V group (the call's whole group) share a
    tile, row r being query r // pack_gqa of head r % pack_gqa, so a K/V tile is read once per
    group and a causal diagonal spans block_m / pack_gqa queries; Q and O still move by TMA,
    one box of whole groups (`layouts.tma.tma_view`), so pack_gqa divides block_m. packed_p:
    P leaves S two values per conversion into one register (`kernels.common.convert`); False:
    `.to(dtype)`, which LLVM moves into the next round, carrying P there as float32."""

    kv_stages: int = 2
    intra_wg_overlap: bool = True
    pingpong: bool = True
    tma_store: bool = True
    persistent: int = 0
    pack_gqa: int = 1
    packed_p: bool = False
    backend: ClassVar[str] = "sm90"

    def __post_init__(self):
        self._check_mods()
        _check_order(self)
        _check_persistent(self.persistent)
        if self.persistent and (self.varlen_q or self.varlen_k or not self.tma_store):
            raise ValueError("persistent loops over the tiles of a dense call (one TMA store "
                             "of O per tile): not with a ragged batch or tma_store=False")
        if isinstance(self.pack_gqa, bool) or not isinstance(self.pack_gqa, int) \
                or self.pack_gqa < 1:
            raise ValueError(f"pack_gqa must be a query head count of at least 1, "
                             f"got {self.pack_gqa!r}")
        if self.pack_gqa > 1:
            if self.tile.block_m % self.pack_gqa:
                raise ValueError(f"pack_gqa={self.pack_gqa} must divide block_m="
                                 f"{self.tile.block_m}: Q and O move in TMA boxes of whole "
                                 f"query groups")
            if self.varlen_q or self.persistent or not self.tma_store:
                raise ValueError("pack_gqa packs the query heads of a dense Q with one CTA per "
                                 "tile: not with a ragged Q, persistent or tma_store=False")

    @property
    def dynamic_tiles(self) -> bool:
        """A persistent CTA takes its next tile from a counter shared by the grid (the next in
        line when it finishes, as the GPU hands a one-tile grid's CTAs out), not the one a
        fixed stride gives it: under causal masking or a window the tiles' work differs, and
        a fixed assignment leaves some CTAs far more of it than others."""
        return bool(self.persistent) and (self.causal or self.local)


@dataclass(frozen=True)
class MergeKey:
    """The kernel that merges attention over disjoint key sets (`kernels/fwd/merge.py`): split-KV's
    second step and `cute_fa.merge_attention`."""

    arch: str
    head_dim: int
    in_dtype: str  # of the parts' O: float32 (split-KV's partials), float16 or bfloat16
    out_dtype: str
    backend: ClassVar[str] = "merge"



def _check_backward_key(key: KernelKey, tile_type: type, sparse: bool = False) -> None:
    """What every backward main kernel's key must hold: a tile of its kernel's type, no lpt
    (the backward's CTAs own key blocks), no sinks (their LSE holds them), a block mask's
    query tile lists only where the kernel walks them (`sparse`) in a dense call without
    causal, a window or deterministic's turns (which count every query block), and
    capture_grads only for float captures of its score_mod."""
    key._check_mods()
    if key.sinks:
        raise ValueError("the backward kernels take no sinks (their LSE holds them)")
    if key.block_sparse and not (sparse and not key.deterministic and not key.causal
                                 and not key.local):
        raise ValueError("block_sparse: a backward without causal, a window or "
                         "deterministic walks a block mask's query tile lists")
    if key.capture_grads:
        captures = key.score_mod.captures if key.score_mod is not None else ()
        if any(not isinstance(slot, int) or not 0 <= slot < len(captures)
               or not captures[slot].dtype.startswith(("float", "bfloat"))
               for slot in key.capture_grads) or \
                tuple(sorted(set(key.capture_grads))) != key.capture_grads:
            raise ValueError(f"capture_grads must be ascending slots of the score_mod's "
                             f"float captures {captures}, got {key.capture_grads!r}")
    if not isinstance(key.tile, tile_type):
        raise TypeError(f"tile must be a {tile_type.__name__}, got {type(key.tile).__name__}")
    if key.lpt:
        raise ValueError("lpt orders query blocks; the backward's CTAs own key blocks")


@dataclass(frozen=True)
class BwdKey(KernelKey):
    """What one compiled backward kernel (`kernels/bwd/sm80.py`) depends on: the forward's score
    features (causal, local, softcap, ragged Q/K; `KernelKey`), its tile (`BwdTileConfig`),
    and deterministic (dQ's float32 sums formed in key-block order, on a counter per query
    block). lpt has no meaning here: the backward's CTAs own key blocks. capture_grads: the
    slots of the score_mod's captured tensors (float ones) whose gradients the kernel adds
    into float32 tensors of their shapes, its last score tensors
    (`mods.grad.capture_derivatives`). block_sparse: the query tiles of each key tile a block
    mask lists (`BlockMask.query_tiles`), the score tensors after the captures."""

    tile: BwdTileConfig = None
    deterministic: bool = False
    capture_grads: tuple = ()
    backend: ClassVar[str] = "bwd_sm80"

    def __post_init__(self):
        _check_backward_key(self, BwdTileConfig, sparse=True)


@dataclass(frozen=True)
class BwdSm90Key(KernelKey):
    """The Hopper backward (`kernels/bwd/sm90.py`): a TMA producer and wgmma consumer
    warpgroups over a `WgmmaBwdTileConfig`; the score features and deterministic as `BwdKey`.
    kv_accum: the query heads of a K/V group are split over head_splits CTAs (a kernel
    argument), which add their dK and dV into float32 sums (`layouts.bwd.kv_accum_chunk`) that
    `BwdKvPostKey`'s kernel converts; without it one CTA visits the whole group and stores dK
    and dV itself. With deterministic too, the CTAs of a key block add their sums in the order
    of their shares, on a counter per key block (`ordered_kv_sums`). The mods, capture_grads
    and block_sparse as `BwdKey`'s (not persistent). persistent > 0: a grid of
    at most that many CTAs, each looping over (key block, K/V head, batch entry) tiles at a
    fixed stride, the next tile's Q and dO loads running under this tile's last query blocks
    and its dK/dV epilogue; 0: one CTA per tile."""

    tile: WgmmaBwdTileConfig = None
    deterministic: bool = False
    kv_accum: bool = False
    persistent: int = 0
    capture_grads: tuple = ()
    backend: ClassVar[str] = "bwd_sm90"

    def __post_init__(self):
        _check_backward_key(self, WgmmaBwdTileConfig, sparse=True)
        if self.ctas_per_sm:
            raise ValueError(f"the wgmma backward's CTAs per SM are its tile's "
                             f"(tile.ctas_per_sm), got ctas_per_sm={self.ctas_per_sm}")
        _check_persistent(self.persistent)
        if self.persistent and (self.varlen_q or self.varlen_k or self.kv_accum
                                or self.deterministic):
            # deterministic: causal turns run from the last key block down, so a tile could
            # wait for a turn owed by a later tile queued behind it on its own CTA
            raise ValueError("persistent loops over the key blocks of a dense call, each CTA "
                             "storing its own dK and dV: not with a ragged batch, kv_accum or "
                             "deterministic")

    @property
    def ordered_kv_sums(self) -> bool:
        """dK and dV's float32 sums taken in share order (kv_accum and deterministic)."""
        return self.kv_accum and self.deterministic


@dataclass(frozen=True)
class BwdPrepKey:
    """The backward's preprocess (`kernels/bwd/preprocess.py`): D = rowsum(dO * O), LSE in log2
    units."""

    arch: str
    tile: RowTile
    backend: ClassVar[str] = "bwd_pre"


@dataclass(frozen=True)
class BwdPostKey:
    """The backward's postprocess (`kernels/bwd/postprocess.py`): dQ from its float32 sums, laid
    out by the main kernel's tile (a `BwdTileConfig`, or the Hopper kernel's
    `WgmmaBwdTileConfig`: each names the dQ TiledMMA whose register order the sums are in)."""

    arch: str
    tile: BwdTileConfig | WgmmaBwdTileConfig
    varlen: bool = False
    backend: ClassVar[str] = "bwd_post"


@dataclass(frozen=True)
class BwdKvPostKey:
    """The wgmma backward's second postprocess (`kernels/bwd/postprocess.py`), under kv_accum:
    dK and dV from their float32 sums, laid out by the main kernel's dK/dV TiledMMA."""

    arch: str
    tile: WgmmaBwdTileConfig
    varlen: bool = False
    backend: ClassVar[str] = "bwd_post_kv"
