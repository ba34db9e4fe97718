"""The forward kernels' skeleton: what every FlashAttention-2 forward variant does the same way.

`FlashFwdBase` owns the launch (grid from the tile scheduler, block, shared memory), the work
of a CTA (`sched/`: scheduler tile, sequence lengths, key blocks), the loop over K/V rounds
and one round

    slot     = round_slot(i)            which key block (and ring stage) round i uses
    before_s                            variant: wait for K (and start V's load)
    S = Q K^T                           variant: gemm_s
    softcap (if the key has one)        mask.apply_softcap
    score_mod, mask_mod (if the key     mods.apply_mods (every round)
      has them)
    mask (first rounds; with a window   mask.apply_mask
      also the last ones)
    online softmax -> row scale; rescale O
    after_softmax                       variant: (sm80) wait for V, start the next K
    P = S in the input dtype, as the A operand of the next MMA (registers, no smem)
    before_pv                           variant: (TMA) wait for V
    O += P V                            variant: gemm_o
    after_round                         variant: (TMA) free the stage, refill it

and the epilogue (normalise O, store O and LSE). A variant (one file each: sm80.py,
tma.py, sm90.py) supplies its shared-memory loads, its waits and its GEMMs' smem views through
those hooks, and its own prologue (how Q and the first K/V tiles arrive). State travels in
`RoundContext`, a frozen object, not in positional tuples.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from ...layouts import mma as mma_mod
from ...layouts._types import cutlass_dtype
from ..common import epilogue, mask, mods
from ..common.launch import occupancy_options
from ..common.softmax import LOG2_E
from ..common.thread_mma import ThreadMma
from ..sched.block_info import BlockInfo, list_entry
from ..sched.seqlen import QueryRows, SeqlenInfo, tma_entry_rows
from ..sched.tile_scheduler import SingleTileScheduler


@dataclass(frozen=True)
class MaskCoords:
    """Where this thread's S accumulator sits: global query of its first row (query0), tile
    column of its first column (col0), and the constant offsets of its rows and columns."""

    row_offsets: tuple
    col_offsets: tuple
    query0: object
    col0: object


@dataclass(frozen=True)
class RoundSlot:
    """Round i's key block, and for a ring its stage and the mbarrier phase to wait for."""

    i: object
    n_block: object
    stage: object = None
    phase: object = None


@dataclass(frozen=True)
class KeyRange:
    """The keys a CTA's rows see: causal_offset places the upper (causal) edge,
    window_offset the lower edge of a sliding window (None: none), and the CTA visits key
    blocks [n_block_min, n_block_max) (with split-KV: its split's share of the blocks below
    n_block_total, the query block's own n_block_max). blocks (block_sparse): the key blocks a
    block mask lists for the tile, ascending; block j of [0, n_block_max) is then key block
    blocks[j] (`real_block`)."""

    causal_offset: object
    n_block_max: object
    n_block_min: object = 0
    n_block_total: object = None
    window_offset: object = None
    blocks: object = None


@dataclass(frozen=True)
class RoundContext:
    """What every round reads: the thread's MMA state, its mask coordinates, the lengths, the
    key blocks [n_block_min, n_block_max) it visits (with split-KV: its split's share of the
    n_block_total the query block sees), and the variant's load state (`loads`). With a
    sliding window: window_offset (the lower edge, `visibility.first_visible_key`) and
    window_edge (key blocks starting below it need masking); with a softcap or a score_mod:
    pre_scale, what S is multiplied by first (softmax_scale / softcap, `mask.apply_softcap`;
    softmax_scale, `mods.apply_mods`); with mods: what they read (`mods.ModArgs`); with
    sinks: the sink logits, float32 (heads_q,) (`absorb_sinks`); with block_sparse: the tile's
    key block list (`KeyRange.blocks`)."""

    thr: ThreadMma
    mask_at: MaskCoords
    seqlen: SeqlenInfo
    causal_offset: object
    n_block_max: object
    loads: object
    n_block_min: object = 0
    n_block_total: object = None
    window_offset: object = None
    window_edge: object = None
    pre_scale: object = None
    mods: object = None
    sinks: object = None
    blocks: object = None


class FlashFwdBase:
    MASK_BITS = False  # `mask.apply_mask`'s bit-mask form (the wgmma kernel's)

    def __init__(self, key):
        cfg = key.tile
        self.cfg = cfg
        self.mma_cfg = cfg.mma_tile  # the CTA's tile, or one warp's where warps split the keys
        self.causal = key.causal
        self.ctas_per_sm = key.ctas_per_sm
        # decode features (fields of the cp.async kernel's key; absent: off)
        self.group = getattr(key, "pack_gqa", 1)
        self.split_kv = getattr(key, "split_kv", False)
        self.page_size = getattr(key, "page_size", 0)
        self.seqused_k = getattr(key, "seqused_k", False)
        self.varlen_q = getattr(key, "varlen_q", False)
        self.varlen_k = getattr(key, "varlen_k", False)
        # score features (fields of every forward key): a window's lower edge, a softcap
        self.local = key.local
        self.softcap = key.softcap
        self.score_mod, self.mask_mod = key.score_mod, key.mask_mod
        self.has_mods = key.score_mod is not None or key.mask_mod is not None
        self.sinks = key.sinks
        self.n_captures = len(key.mod_captures)  # the score tensors before the sink logits
        self.block_sparse = key.block_sparse
        self.rows = QueryRows(self.group)
        self.scheduler = SingleTileScheduler(cfg.block_m, key.causal, self.group, self.split_kv,
                                             key.lpt, key.varlen_order)
        self.block_info = BlockInfo(cfg.block_m, cfg.block_n, key.causal, self.group, key.local)
        self.mask_steps = self.block_info.masked_rounds()

    def _grid(self, mQ, mCuSeqlensQ, max_seqlen_q, num_splits=None) -> tuple:
        """The launch grid: over the longest query sequence and the entries of a ragged batch,
        else over q's own extents."""
        if cutlass.const_expr(self.varlen_q):
            return self.scheduler.grid(max_seqlen_q, mQ.shape[2], mCuSeqlensQ.shape[0] - 1,
                                       num_splits)
        return self.scheduler.grid(mQ.shape[1], mQ.shape[2], mQ.shape[0], num_splits)

    @cute.jit
    def _key_range(self, tile, seqlen: SeqlenInfo, causal_offset, window_left, window_right,
                   num_splits=None, score_tensors=None) -> KeyRange:
        """The key blocks tile's rows visit and the edges of their keys (`KeyRange`). With a
        window, the upper edge moves right by window_right and the lower one is window_left
        keys left of the diagonal; a ragged batch's query blocks past their entry's queries
        visit none. With block_sparse (a ragged batch or a KV cache), those its block mask
        lists, the lists cut to the entry's own blocks on the host
        (`BlockMask.per_sequence`: a query block past its queries lists none)."""
        if cutlass.const_expr(self.block_sparse):
            return self._listed_range(tile, causal_offset, score_tensors)
        window_offset = None
        if cutlass.const_expr(self.local):
            window_offset = causal_offset - window_left
            causal_offset = causal_offset + window_right
        n_block_max = self.block_info.n_block_max(seqlen, tile.m_block, causal_offset)
        if cutlass.const_expr(self.varlen_q):
            if tile.m_block * self.cfg.block_m >= self.rows.count(seqlen.seqlen_q):
                n_block_max = cutlass.Int32(0)
        n_block_first = 0
        if cutlass.const_expr(self.local):
            n_block_first = cutlass.min(self.block_info.n_block_min(tile.m_block, window_offset),
                                        n_block_max)
        if cutlass.const_expr(self.split_kv):
            if cutlass.const_expr(self.local):
                lo, hi = self.block_info.split_range(n_block_max - n_block_first, tile.split,
                                                     num_splits)
                lo, hi = n_block_first + lo, n_block_first + hi
            else:
                lo, hi = self.block_info.split_range(n_block_max, tile.split, num_splits)
            return KeyRange(causal_offset, hi, lo, n_block_max, window_offset)
        return KeyRange(causal_offset, n_block_max, n_block_first, None, window_offset)

    def _launch(self, kernel_call, grid, storage, stream, threads=None):
        """threads: the CTA's threads where they are not the tile's (a warp-specialized
        kernel adds its producer warpgroup)."""
        kernel_call.launch(grid=grid, block=(threads or self.cfg.num_threads, 1, 1),
                           smem=storage.size_in_bytes(), stream=stream,
                           **occupancy_options(self.ctas_per_sm))

    def _tma_partitions(self, storage, stages, tma_atom_Q, tma_Q, tma_atom_K, tma_K,
                        tma_atom_V, tma_V, tile, seqlen: SeqlenInfo) -> tuple:
        """The TMA partitions of this CTA's Q tile and of its entry's K and V blocks, between
        global memory (TMA coordinates) and the shared tiles in the copy engine's notation
        (byte-level swizzle, `tma.tma_smem_layout`; `storage`'s sQ, sK and sV, the latter two
        rings of `stages`): (tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV), K's and V's indexed
        [None, key block] and [None, stage]."""
        from cutlass.cute.nvgpu import cpasync

        from ...layouts import tma

        cfg = self.cfg
        bm, bn, dp = cfg.block_m, cfg.block_n, cfg.head_dim_padded
        sQ_tma = storage.sQ.get_tensor(tma.tma_smem_layout(cfg, "Q"))
        sK_tma = storage.sK.get_tensor(tma.tma_smem_layout(cfg, "K", stages))
        sV_tma = storage.sV.get_tensor(tma.tma_smem_layout(cfg, "V", stages))
        gQ = cute.local_tile(tma_entry_rows(tma_Q, tile.batch, self._q_head(tile),
                                            seqlen.offset_q),
                             (bm, dp), (tile.m_block, 0))
        gK = cute.local_tile(tma_entry_rows(tma_K, tile.batch, tile.head_kv,
                                                seqlen.offset_k), (bn, dp), (None, 0))
        gV = cute.local_tile(tma_entry_rows(tma_V, tile.batch, tile.head_kv,
                                                seqlen.offset_k), (bn, dp), (None, 0))
        one_cta = cute.make_layout(1)
        tQsQ, tQgQ = cpasync.tma_partition(tma_atom_Q, 0, one_cta, cute.group_modes(sQ_tma, 0, 2),
                                           cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(tma_atom_K, 0, one_cta, cute.group_modes(sK_tma, 0, 2),
                                           cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_atom_V, 0, one_cta, cute.group_modes(sV_tma, 0, 2),
                                           cute.group_modes(gV, 0, 2))
        return tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV

    def _n_rounds(self, n_block_max, n_block_min):
        """Rounds of the CTA: every key block below n_block_max, from n_block_min with a
        window (without one the subtraction of 0 is left out, keeping the PTX as it was)."""
        if cutlass.const_expr(self.local):
            return n_block_max - n_block_min
        return n_block_max

    def _masked_round(self, ctx: "RoundContext", i):
        """Whether round i (key block n_block_max - 1 - i) may need the mask: `run_rounds`'s rule
        for a kernel that writes its own loop (no split-KV)."""
        if cutlass.const_expr(self.local):
            n_block = ctx.n_block_max - 1 - i
            return ((n_block >= ctx.n_block_max - self.mask_steps)
                    | (n_block * self.cfg.block_n < ctx.window_edge))
        return i < self.mask_steps

    def _tma_work(self, tma_Q, tma_K, causal_offset, mCuSeqlensQ, mCuSeqlensK, window_left,
                  window_right, score_tensors=None, mTileOrder=None) -> tuple:
        """(tile, SeqlenInfo, KeyRange) of this CTA for a kernel whose Q and K are TMA tensors
        ((seqlen, head_dim, heads, batch)); in a ragged batch causal is bottom-right per entry,
        and with varlen_order the tile is mTileOrder's (`SingleTileScheduler.tile`)."""
        if cutlass.const_expr(not (self.varlen_q or self.varlen_k or self.local)):
            seqlen = SeqlenInfo(self._tma_seqlen_q(tma_Q), tma_K.shape[0])
            tile, keys = self._work(tma_Q.shape[2], tma_K.shape[2], seqlen, causal_offset,
                                    score_tensors)
            return tile, seqlen, keys
        tile = self.scheduler.tile(tma_Q.shape[2], tma_K.shape[2], order=mTileOrder)
        seqlen = SeqlenInfo.of(tile.batch, self._tma_seqlen_q(tma_Q), tma_K.shape[0],
                               mCuSeqlensQ, mCuSeqlensK)
        if cutlass.const_expr(self.varlen_q or self.varlen_k):
            causal_offset = seqlen.seqlen_k - seqlen.seqlen_q
        keys = self._key_range(tile, seqlen, causal_offset, window_left, window_right,
                               score_tensors=score_tensors)
        return tile, seqlen, keys

    def _tma_seqlen_q(self, tma_Q):
        """The queries of a TMA view of Q: its rows, or with GQA packing the seqlen of its
        (group, seqlen) rows (`layouts.tma.tma_view`)."""
        return tma_Q.shape[0][1] if self.group > 1 else tma_Q.shape[0]

    def _q_head(self, tile):
        """The head coordinate of tile's rows in a TMA view of Q or O: the query head, or with
        GQA packing the K/V head whose group the view folds into the rows."""
        return tile.head_kv if self.group > 1 else tile.head

    def _work(self, heads_q, heads_kv, seqlen: SeqlenInfo, causal_offset, score_tensors=None):
        """(tile, KeyRange) of this CTA, for the dense call without a window; with
        block_sparse, the key blocks its block mask lists (`_listed_range`)."""
        tile = self.scheduler.tile(heads_q, heads_kv)
        if cutlass.const_expr(self.block_sparse):
            return tile, self._listed_range(tile, causal_offset, score_tensors)
        return tile, KeyRange(causal_offset,
                              self.block_info.n_block_max(seqlen, tile.m_block, causal_offset))

    @staticmethod
    def _listed_range(tile, causal_offset, score_tensors) -> KeyRange:
        """The key blocks a block mask lists for tile (the last two score tensors: the counts,
        the indices, `BlockMask.kernel_blocks`)."""
        counts, indices = score_tensors[-2], score_tensors[-1]
        return KeyRange(causal_offset, counts[tile.batch, tile.head, tile.m_block],
                        blocks=indices[tile.batch, tile.head, tile.m_block, None])

    @staticmethod
    def listed_block(blocks, n_block):
        """(key block, whether the mask_mod must run on it) of round block n_block in a
        block-sparse tile's list: an entry -(j + 1) is block j with every score kept
        (`BlockMask.kernel_blocks`)."""
        return list_entry(blocks[n_block])

    @staticmethod
    def real_block(blocks, n_block):
        """Key block of round block n_block: itself, or in a block-sparse tile the list's."""
        return n_block if blocks is None else FlashFwdBase.listed_block(blocks, n_block)[0]

    def _context(self, thr: ThreadMma, m_block, seqlen: SeqlenInfo, keys: KeyRange, loads,
                 warp=None, pre_scale=None, tile=None, score_tensors=None) -> RoundContext:
        """warp: where the warps split the keys, this thread's warp, whose rows start at row
        slab * 16 of the tile and whose keys at column group * warp_keys of every K/V tile
        (`TileConfig.warp_place`). tile, score_tensors: the `WorkTile` and the tensors the
        scores read (the mods' captured ones, the sink logits), which a key with them needs."""
        query0 = m_block * self.cfg.block_m + thr.row0
        col0 = thr.col0
        if warp is not None:
            slab, group = self.cfg.warp_place(warp)
            query0, col0 = query0 + slab * 16, col0 + group * self.cfg.warp_keys
        window_edge = None
        if cutlass.const_expr(self.local):
            window_edge = self.block_info.window_edge(m_block, keys.window_offset)
        at = mods.ModArgs(tile.batch, tile.head, score_tensors) if self.has_mods else None
        return RoundContext(thr, MaskCoords(thr.row_offsets, thr.col_offsets, query0, col0),
                            seqlen, keys.causal_offset, keys.n_block_max, loads, keys.n_block_min,
                            keys.n_block_total, keys.window_offset, window_edge, pre_scale, at,
                            score_tensors[self.n_captures] if self.sinks else None,
                            keys.blocks)

    def absorb_sinks(self, ctx: RoundContext, tile):
        """With sinks, after the last round: each row's sink logit (of its query head) joins
        its softmax as a key of value 0 (`OnlineSoftmax.absorb_sink`), once per row: the lanes
        (and, where warps split the keys, the warps) of a row share it, and of a split-KV
        call's splits only the first counts it (the merge adds the splits' sums)."""
        if cutlass.const_expr(self.sinks):
            at, thr = ctx.mask_at, ctx.thr
            holders = (1 << len(thr.reduce_offsets)) * getattr(self.cfg, "key_groups", 1)
            share = cutlass.Float32(1.0 / holders)
            if cutlass.const_expr(self.split_kv):
                share = cutlass.select_(tile.split == 0, share, cutlass.Float32(0.0))
            sink_log2 = tuple(
                ctx.sinks[self.rows.head(tile.head, at.query0 + at.row_offsets[r])] * LOG2_E
                for r in range(len(at.row_offsets)))
            thr.softmax.absorb_sink(thr.acc_O_mn, sink_log2, share)

    @cute.jit
    def run_rounds(self, ctx: RoundContext):
        """Every K/V round, one loop body (one copy of it to trace and compile): the rounds
        that may need masking come first and mask under a uniform branch. With split-KV only
        the split holding the last visible blocks masks."""
        # three branches where one would do, so that the kernels without a window keep their
        # PTX byte for byte
        if cutlass.const_expr(self.local):
            # the causal edge's blocks come first, the window's lower edge's last
            top = ctx.n_block_total if cutlass.const_expr(self.split_kv) else ctx.n_block_max
            first_masked = top - self.mask_steps
            for i in range(0, ctx.n_block_max - ctx.n_block_min, 1):
                n_block = ctx.n_block_max - 1 - i
                self.run_round(ctx, i, (n_block >= first_masked)
                            | (n_block * self.cfg.block_n < ctx.window_edge))
        elif cutlass.const_expr(self.split_kv):
            first_masked = ctx.n_block_total - self.mask_steps
            for i in range(0, ctx.n_block_max - ctx.n_block_min, 1):
                self.run_round(ctx, i, ctx.n_block_max - 1 - i >= first_masked)
        else:
            n_masked = cutlass.min(ctx.n_block_max, self.mask_steps)
            for i in range(0, ctx.n_block_max, 1):
                self.run_round(ctx, i, i < n_masked)

    @cute.jit
    def run_round(self, ctx: RoundContext, i, masked):
        cfg = self.cfg
        thr = ctx.thr
        slot = self.round_slot(ctx, i)
        acc_S = cute.make_rmem_tensor(
            thr.thr_mma.partition_shape_C((self.mma_cfg.block_m, self.mma_cfg.block_n)),
            cutlass.Float32)
        acc_S.fill(0.0)
        self.before_s(ctx, slot, masked)
        self.gemm_s(ctx, slot, acc_S)
        scale = self._scores(ctx, acc_S, mma_mod.acc_rowcol_layout, slot.n_block, masked)
        thr.softmax.rescale_O(thr.acc_O_mn, scale)
        self.after_softmax(ctx, slot)

        rP = cute.make_fragment_like(acc_S, cutlass_dtype(cfg.dtype))
        rP.store(acc_S.load().to(cutlass_dtype(cfg.dtype)))
        tOrP = cute.make_tensor(rP.iterator, mma_mod.acc_to_a_layout(rP.layout))
        self.before_pv(ctx, slot)
        self.gemm_o(ctx, slot, tOrP)
        self.after_round(ctx, slot)

    @cute.jit
    def _scores(self, ctx: RoundContext, acc_S, rowcol: cutlass.Constexpr, n_block, masked):
        """One round's S, in place, into the softmax's weights: softcap, mods, mask (where
        `masked`), online softmax over the (row, col) view `rowcol(acc_S.layout)` of the
        accumulator; returns the factors O's rows must be multiplied by."""
        if cutlass.const_expr(self.softcap):
            mask.apply_softcap(acc_S, ctx.pre_scale)
        acc_S_mn = cute.make_tensor(acc_S.iterator, rowcol(acc_S.layout))
        listed = n_block
        n_block = self.real_block(ctx.blocks, n_block)
        key0 = n_block * self.cfg.block_n + ctx.mask_at.col0
        if cutlass.const_expr(self.block_sparse and self.mask_mod is not None):
            # a block mask's full tiles keep every score: no mask_mod there
            mods.apply_mods_unless_whole(acc_S_mn, ctx.mask_at, key0, self.rows, ctx.seqlen,
                                         ctx.mods, self.score_mod, self.mask_mod, ctx.pre_scale,
                                         lambda: self.listed_block(ctx.blocks, listed)[1])
        elif cutlass.const_expr(self.has_mods):
            mods.apply_mods(acc_S_mn, ctx.mask_at, key0, self.rows, ctx.seqlen, ctx.mods,
                            self.score_mod, self.mask_mod, ctx.pre_scale)
        if masked:
            at = ctx.mask_at
            mask.apply_mask(acc_S_mn, at.row_offsets, at.col_offsets, at.query0,
                            n_block * self.cfg.block_n + at.col0, ctx.seqlen.seqlen_k,
                            ctx.causal_offset, self.causal, self.group, ctx.window_offset,
                            self.MASK_BITS)
        return ctx.thr.softmax.step(acc_S_mn)

    def write_epilogue(self, ctx: RoundContext, sQ, mO, mLSE, tile, write_lse, tidx, scratch=None,
                  warp=None):
        """scratch, warp: where the warps split the keys, the float32 smem their partial results
        are combined in (`epilogue.warp_combine_bytes`) and this thread's warp."""
        self.absorb_sinks(ctx, tile)
        if cutlass.const_expr(self.cfg.warps_split_keys):
            epilogue.write_outputs_warp_split(self.cfg, ctx.thr, scratch, mO, mLSE, tile,
                                              self.rows, ctx.seqlen.seqlen_q, write_lse, tidx,
                                              warp)
        elif cutlass.const_expr(self.group == 1 and not self.split_kv):
            epilogue.write_outputs(self.cfg, ctx.thr, sQ, mO, mLSE, tile.batch, tile.head,
                                   tile.m_block, ctx.seqlen, ctx.mask_at.query0,
                                   write_lse, tidx)
        else:
            epilogue.write_outputs_rows(self.cfg, ctx.thr, sQ, mO, mLSE, tile, self.rows,
                                        ctx.seqlen.seqlen_q, write_lse, tidx)

    # the variant's hooks; a hook with nothing to do is left as is
    def round_slot(self, ctx: RoundContext, i) -> RoundSlot:
        raise NotImplementedError

    def before_s(self, ctx: RoundContext, slot: RoundSlot, masked):
        pass

    def gemm_s(self, ctx: RoundContext, slot: RoundSlot, acc_S):
        raise NotImplementedError

    def after_softmax(self, ctx: RoundContext, slot: RoundSlot):
        pass

    def before_pv(self, ctx: RoundContext, slot: RoundSlot):
        pass

    def gemm_o(self, ctx: RoundContext, slot: RoundSlot, tOrP):
        raise NotImplementedError

    def after_round(self, ctx: RoundContext, slot: RoundSlot):
        pass
