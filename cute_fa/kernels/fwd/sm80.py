"""The sm80 FlashAttention-2 forward kernel: cp.async + ldmatrix + mma.sync m16n8k16.

Split-Q: one CTA owns `block_m` query rows of one (batch, head); its warps split
them in 16-row slabs; K and V stream through shared memory in `block_n`-row
tiles while Q stays resident. Per K/V round (walked from the last key block
down, so the blocks that need masking come first):

    wait K[n], sync; start V[n] ........ V loads under Q@K^T and softmax
    S = Q @ K[n]^T (ldmatrix + mma)
    mask (only in the first rounds: sequence tail and causal diagonal)
    online softmax on S's row view (quad shuffles, exp2 with the scale folded in)
    wait V[n], sync; start K[n-1] ...... K loads under P@V
    O += P @ V[n], P straight from registers (the S->A view)

The V wait comes after the softmax so that ptxas cannot hoist V's ldmatrix above
it (a barrier fences them): hoisted, they held V fragments live across the softmax
and spilled ~200 bytes at head_dim 128, for the same speed.

then O is normalised, written through smem (reusing sQ) with 128-bit stores, and
LSE is written. The round and the epilogue are `base.FlashFwdBase`'s; this file supplies
the cp.async loads, the waits and the GEMMs' smem views. Every layout, copy and MMA comes
from `cute_fa.layouts`.

Tensors: Q, O (B, Sq, Hq, D); K, V (B, Sk, Hk, D); LSE (B, Hq, Sq) float32, written
only when write_lse != 0.
Shapes and strides are dynamic (any sequence length, batch, head count or
stride with a unit last stride), head_dim is static.

Decode, each a field of the key (off: the code above, unchanged): GQA packing (the tile's rows
are (query, head) pairs of one K/V head's group, `work.QueryRows`; each row's address is a
shifted base row's), a paged K/V cache (K, V (pages, page_size, Hk, D) and a page table: each
copied row is shifted from page 0 to its page), per-entry key counts (seqused_k), split-KV (a
range of key blocks per CTA, float32 partial O and LSE into (split x batch)-indexed outputs for
`fwd/merge.py`; with fused_merge the last CTA of each query block merges them itself,
`merge.merge_if_last`), a ring of K/V stages that loads whole rounds ahead, and a tile whose warps
split each K/V tile's keys as well as the rows (`TileConfig.warps_split_keys`: 16 or 32 packed
rows, each warp's MMAs, mask and online softmax over its slab's 16 rows and its own slice of the
keys, `smem.warp_tiles`, the warps' O, max and sum combined in shared memory by
`epilogue.write_outputs_warp_split`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory

from dataclasses import dataclass
from typing import Optional

from ...layouts import copies, smem
from ..common import epilogue
from .base import FlashFwdBase, RoundContext, RoundSlot
from ..common.gemm import gemm_ldmatrix
from ..common.loads import copy_row
from ..common.softmax import score_scales
from ..common.thread_mma import thread_mma
from .merge import merge_if_last
from ..sched.seqlen import SeqlenInfo, shifted



@dataclass(frozen=True)
class Sm80Loads:
    """The cp.async side of a round: the tiled copy and the K/V tiles it moves (gmem source,
    smem destination, identity coordinates of a tile's rows), the page table if paged, and a
    block-sparse tile's key block list (`KeyRange.blocks`)."""

    g2s: object
    tKgK: object
    tKsK: object
    tVgV: object
    tVsV: object
    tKVcKV: object
    paged: object = None
    rPage: object = None
    blocks: object = None


@dataclass(frozen=True)
class PagedKV:
    """A paged K/V cache: this batch entry's row of the page table (page indices, int32) and
    the cache's page and row strides; key j is row j % page_size of page page_table[j //
    page_size]. With `Sm80Key.page_prefetch`, `Sm80Loads.rPage` holds the next block's page
    indices, read a round before its loads."""

    page_table: object
    stride_page: object
    stride_row: object


class FlashFwdSm80(FlashFwdBase):
    """Built from an `Sm80Key`. kv_stages 0: one K and one V buffer, V's load under
    S = Q K^T and the next K's under P V (prefill's scheme). kv_stages >= 2 (decode): a ring of
    K/V stages, whole rounds loading ahead, so that more bytes are in flight per CTA when
    the MMAs are too short to hide a load."""

    def __init__(self, key):
        super().__init__(key)
        self.kv_stages = key.kv_stages
        self.fused_merge = key.fused_merge
        self.page_prefetch = key.page_prefetch
        if self.cfg.warps_split_keys:
            needed = epilogue.warp_combine_bytes(self.cfg)
            held = self.cfg.smem_bytes(max(self.kv_stages, 1))
            if needed > held:
                raise ValueError(f"the warps' combine needs {needed} bytes of shared memory, "
                                 f"more than this tile's Q and K/V tiles ({held}): {self.cfg}")

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, softmax_scale: cutlass.Float32, causal_offset: Optional[cutlass.Int32],
                 write_lse: cutlass.Int32, window_left: Optional[cutlass.Int32],
                 window_right: Optional[cutlass.Int32], softcap: Optional[cutlass.Float32],
                 mCuSeqlensQ: Optional[cute.Tensor], mCuSeqlensK: Optional[cute.Tensor],
                 max_seqlen_q: Optional[cutlass.Int32], score_tensors: Optional[tuple],
                 mTileOrder: Optional[cute.Tensor], mSeqUsedK: Optional[cute.Tensor],
                 mPageTable: Optional[cute.Tensor], num_splits: Optional[cutlass.Int32],
                 mOMerged: Optional[cute.Tensor], mLSEMerged: Optional[cute.Tensor],
                 write_merged_lse: Optional[cutlass.Int32],
                 mSplitCounters: Optional[cute.Tensor], stream):
        """The optional arguments are those the key asks for (`compile.registry`), None
        elsewhere."""
        cfg = self.cfg
        sQ_layout = smem.smem_layout_q(cfg)
        sKV_layout = smem.smem_layout_kv(cfg, self.kv_stages)
        SharedStorage = smem.shared_storage(cfg, self.kv_stages)
        scale_log2, pre_scale = score_scales(self.softcap, softmax_scale, softcap,
                                             self.score_mod)
        grid = self._grid(mQ, mCuSeqlensQ, max_seqlen_q, num_splits)
        self._launch(self.kernel(mQ, mK, mV, mO, mLSE, scale_log2, causal_offset,
                                 write_lse, sQ_layout, sKV_layout, SharedStorage, mSeqUsedK,
                                 mPageTable, num_splits, mCuSeqlensQ, mCuSeqlensK, window_left,
                                 window_right, pre_scale, mOMerged, mLSEMerged,
                                 write_merged_lse, mSplitCounters, score_tensors, mTileOrder),
                     grid, SharedStorage, stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor, scale_log2: cutlass.Float32, causal_offset: Optional[cutlass.Int32],
               write_lse: cutlass.Int32, sQ_layout: cute.ComposedLayout,
               sKV_layout: cute.ComposedLayout, SharedStorage: cutlass.Constexpr,
               mSeqUsedK: Optional[cute.Tensor], mPageTable: Optional[cute.Tensor],
               num_splits: Optional[cutlass.Int32], mCuSeqlensQ: Optional[cute.Tensor],
               mCuSeqlensK: Optional[cute.Tensor], window_left: Optional[cutlass.Int32],
               window_right: Optional[cutlass.Int32], pre_scale: Optional[cutlass.Float32],
               mOMerged: Optional[cute.Tensor], mLSEMerged: Optional[cute.Tensor],
               write_merged_lse: Optional[cutlass.Int32],
               mSplitCounters: Optional[cute.Tensor], score_tensors: Optional[tuple],
               mTileOrder: Optional[cute.Tensor]):
        cfg = self.cfg
        bm, bn, dp = cfg.block_m, cfg.block_n, cfg.head_dim_padded
        tidx, _, _ = cute.arch.thread_idx()
        if cutlass.const_expr(self.group == 1 and not self.split_kv and not self.seqused_k
                              and self.page_size == 0 and not self.varlen_q
                              and not self.varlen_k and not self.local):
            seqlen = SeqlenInfo(mQ.shape[1], mK.shape[1])
            # K/V tiles are walked from n_block_max - 1 down to 0
            tile, keys = self._work(mQ.shape[2], mK.shape[2], seqlen, causal_offset,
                                    score_tensors)
        else:
            batch_size = mQ.shape[0]
            if cutlass.const_expr(self.varlen_q):
                batch_size = mCuSeqlensQ.shape[0] - 1
            tile = self.scheduler.tile(mQ.shape[2], mK.shape[2], batch_size, mTileOrder)
            seqlen_k = mK.shape[1]
            if cutlass.const_expr(self.page_size > 0):
                seqlen_k = mPageTable.shape[1] * self.page_size
            seqlen = SeqlenInfo.of(tile.batch, mQ.shape[1], seqlen_k, mCuSeqlensQ, mCuSeqlensK,
                                   mSeqUsedK)
            if cutlass.const_expr(self.seqused_k or self.page_size > 0 or self.varlen_q
                                  or self.varlen_k):
                causal_offset = seqlen.seqlen_k - seqlen.seqlen_q  # bottom-right, per entry
            keys = self._key_range(tile, seqlen, causal_offset, window_left, window_right,
                                   num_splits, score_tensors)
        n_block_min, n_block_max = keys.n_block_min, keys.n_block_max
        m_block, head, batch, head_kv = tile.m_block, tile.head, tile.batch, tile.head_kv
        n_rows = self.rows.count(seqlen.seqlen_q)

        if cutlass.const_expr(self.group == 1):
            gQ = cute.local_tile(seqlen.q_rows(mQ, batch, head), (bm, dp), (m_block, 0))
        else:  # query rows 0..bm-1 of the group's first head; each row is shifted to its own
            gQ = cute.local_tile(seqlen.q_rows(mQ, batch, head), (bm, dp), (0, 0))
        if cutlass.const_expr(self.page_size > 0):  # rows 0..bn-1 of page 0, shifted per row
            gK = cute.local_tile(mK[0, None, head_kv, None], (bn, dp), (0, 0))
            gV = cute.local_tile(mV[0, None, head_kv, None], (bn, dp), (0, 0))
        else:
            gK = cute.local_tile(seqlen.k_rows(mK, batch, head_kv), (bn, dp), (None, 0))
            gV = cute.local_tile(seqlen.k_rows(mV, batch, head_kv), (bn, dp), (None, 0))
        cQ = cute.local_tile(cute.make_identity_tensor((n_rows, cfg.head_dim)),
                             (bm, dp), (m_block, 0))
        cKV = cute.make_identity_tensor((bn, dp))

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ, sK, sV, sVt = smem.qkv_tensors(storage, sQ_layout, sKV_layout, cfg, self.kv_stages)

        g2s = copies.gmem_tiled_copy_qkv(cfg)
        thr_g2s = g2s.get_slice(tidx)
        tQgQ = thr_g2s.partition_S(gQ)
        tQsQ = thr_g2s.partition_D(sQ)
        tQcQ = thr_g2s.partition_S(cQ)
        tKVcKV = thr_g2s.partition_S(cKV)
        paged, rPage = None, None
        if cutlass.const_expr(self.page_size > 0):
            paged = PagedKV(mPageTable[batch, None], mK.stride[0], mK.stride[1])
        if cutlass.const_expr(self.page_prefetch):
            rPage = cute.make_rmem_tensor(self._page_slots(tKVcKV), cutlass.Int32)
        loads = Sm80Loads(g2s, thr_g2s.partition_S(gK), thr_g2s.partition_D(sK),
                          thr_g2s.partition_S(gV), thr_g2s.partition_D(sV), tKVcKV, paged,
                          rPage, keys.blocks)

        # Q: rows past seqlen_q (packed: past the group's rows) are zeros
        for m in cutlass.range_constexpr(cute.size(tQsQ.shape[1])):
            row = tQcQ[0, m, 0][0]
            if row < n_rows:
                tQgQ_m = tQgQ[None, m, None]
                if cutlass.const_expr(self.group > 1):
                    tQgQ_m = shifted(tQgQ_m, self.rows.offset(
                        row, row - m_block * bm, mQ.stride[1], mQ.stride[2]))
                copy_row(cfg, g2s, tQgQ_m, tQsQ[None, m, None], tQcQ[None, m, None])
            else:
                tQsQ[None, m, None].fill(0.0)

        # the MMAs' share of each K/V tile: all of it, or where the warps split the keys this
        # warp's slice of it (then the MMA state is one warp's, indexed by the lane)
        warp, mma_tidx, sQ_mma, sK_mma, sVt_mma = None, tidx, sQ, sK, sVt
        if cutlass.const_expr(cfg.warps_split_keys):
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            mma_tidx = tidx % cute.arch.WARP_SIZE
            sQ_mma, sK_mma, sVt_mma = smem.warp_tiles(sQ, sK, sVt, cfg, warp, self.kv_stages)
        if cutlass.const_expr(self.kv_stages == 0):
            thr = thread_mma(self.mma_cfg, mma_tidx, sQ_mma, sK_mma, sVt_mma, sK_mma, sVt_mma,
                             scale_log2)
            if n_block_max > n_block_min:
                self._load_kv(loads, loads.tKgK, loads.tKsK, n_block_max - 1, seqlen.seqlen_k,
                              True)
            cute.arch.cp_async_commit_group()
        else:
            thr = thread_mma(self.mma_cfg, mma_tidx, sQ_mma, sK_mma, sVt_mma,
                             sK_mma[None, None, 0], sVt_mma[None, None, 0], scale_log2)
            # the ring's first stages: one cp.async group per stage, empty past the last block,
            # so that round i always waits for the i-th group
            for stage in cutlass.range_constexpr(self.kv_stages):
                if n_block_max - 1 - stage >= n_block_min:
                    self._load_kv(loads, loads.tKgK, loads.tKsK[None, None, None, stage],
                                  n_block_max - 1 - stage, seqlen.seqlen_k, True)
                    self._load_kv(loads, loads.tVgV, loads.tVsV[None, None, None, stage],
                                  n_block_max - 1 - stage, seqlen.seqlen_k, True)
                cute.arch.cp_async_commit_group()
            if cutlass.const_expr(self.page_prefetch):  # the first refill's pages
                if n_block_max - 1 - self.kv_stages >= n_block_min:
                    self._fetch_pages(loads, n_block_max - 1 - self.kv_stages)

        ctx = self._context(thr, m_block, seqlen, keys, loads, warp, pre_scale, tile, score_tensors)
        self.run_rounds(ctx)
        scratch = None
        if cutlass.const_expr(cfg.warps_split_keys):
            # the warps' partial O, max and sum overlay Q and the K/V tiles, which the struct
            # lays out back to back (each a multiple of 1024 bytes)
            scratch = storage.sQ.get_tensor(
                cute.make_layout(epilogue.warp_combine_bytes(cfg) // 4), dtype=cutlass.Float32)
        self.write_epilogue(ctx, sQ, mO, mLSE, tile, write_lse, tidx, scratch, warp)
        if cutlass.const_expr(self.fused_merge):
            # one int32 of shared memory past every thread's last use of it (the barrier in
            # merge_if_last comes first)
            sFlag = storage.sQ.get_tensor(cute.make_layout(1), dtype=cutlass.Int32)
            merge_if_last(cfg, self.rows, tile, seqlen.seqlen_q, mO, mLSE, mOMerged, mLSEMerged,
                          write_merged_lse, mSplitCounters, num_splits, mQ.shape[0], sFlag, tidx)

    @cute.jit
    def _load_kv(self, ld: "Sm80Loads", tXgX: cute.Tensor, tXsX: cute.Tensor, n_block, seqlen_k,
                 check_rows: cutlass.Constexpr, prefetched: cutlass.Constexpr = False):
        """Start the cp.async of one K or V tile; with check_rows, rows past seqlen_k become
        zeros. Paged, each row is shifted from page 0 to its page (rows past seqlen_k are
        never looked up: their page-table entry may not exist); prefetched: the pages are
        those `_fetch_pages` read for this block. Block-sparse, n_block is the tile's list's
        (its last, the largest, is the one a tail can cut: the first round's)."""
        n_block = self.real_block(ld.blocks, n_block)
        for m in cutlass.range_constexpr(cute.size(tXsX.shape[1])):
            if cutlass.const_expr(check_rows):
                if n_block * self.cfg.block_n + ld.tKVcKV[0, m, 0][0] < seqlen_k:
                    copy_row(self.cfg, ld.g2s, self._row_source(ld, tXgX, n_block, m),
                             tXsX[None, m, None], ld.tKVcKV[None, m, None])
                else:
                    tXsX[None, m, None].fill(0.0)
            else:
                copy_row(self.cfg, ld.g2s, self._row_source(ld, tXgX, n_block, m, prefetched),
                         tXsX[None, m, None], ld.tKVcKV[None, m, None])

    def _row_source(self, ld: "Sm80Loads", tXgX: cute.Tensor, n_block, m, prefetched=False):
        """Row m of the thread's copy of key block n_block: the block's row (dense), or row
        `row` of page 0 moved to key n_block * block_n + row's page and slot (paged)."""
        if cutlass.const_expr(ld.paged is None):
            return tXgX[None, m, None, n_block]
        row = ld.tKVcKV[0, m, 0][0]
        if cutlass.const_expr(prefetched and self._whole_blocks()):
            # the block is one page's slots [first, first + block_n): one shift for every row
            first = n_block % (self.page_size // self.cfg.block_n) * self.cfg.block_n
            return shifted(tXgX[None, m, None], ld.rPage[0] * ld.paged.stride_page
                           + first * ld.paged.stride_row)
        key = n_block * self.cfg.block_n + row
        if cutlass.const_expr(prefetched):
            page = ld.rPage[m]
        else:
            page = ld.paged.page_table[key // self.page_size]
        slot = key % self.page_size
        return shifted(tXgX[None, m, None], page * ld.paged.stride_page
                                + (slot - row) * ld.paged.stride_row)

    def _whole_blocks(self) -> bool:
        """Whether a page holds whole key blocks (page_size a multiple of block_n): then one
        page-table entry serves every row of a block."""
        return self.page_size % self.cfg.block_n == 0

    def _page_slots(self, tKVcKV: cute.Tensor) -> int:
        """How many page indices `Sm80Loads.rPage` holds: one where a page holds whole
        blocks, else one per row the thread copies."""
        return 1 if self._whole_blocks() else cute.size(tKVcKV.shape[1])

    @cute.jit
    def _fetch_pages(self, ld: "Sm80Loads", n_block):
        """Read key block n_block's page indices into `ld.rPage`, a round before its loads
        (`after_round`): the page table's latency then passes under that round's MMAs
        instead of stalling the loads' issue. n_block must be a full block (below the last)."""
        if cutlass.const_expr(self._whole_blocks()):
            ld.rPage[0] = ld.paged.page_table[n_block // (self.page_size // self.cfg.block_n)]
        else:
            for m in cutlass.range_constexpr(cute.size(ld.rPage)):
                key = n_block * self.cfg.block_n + ld.tKVcKV[0, m, 0][0]
                ld.rPage[m] = ld.paged.page_table[key // self.page_size]

    # ---- the round's hooks (base.FlashFwdBase.run_round) ----

    def round_slot(self, ctx: RoundContext, i) -> RoundSlot:
        if cutlass.const_expr(self.kv_stages == 0):
            return RoundSlot(i, ctx.n_block_max - 1 - i)
        return RoundSlot(i, ctx.n_block_max - 1 - i, i % self.kv_stages)

    @cute.jit
    def before_s(self, ctx: RoundContext, slot: RoundSlot, masked):
        """K of this round has landed (every thread's copies: a CTA barrier); start V's.
        With a ring: this round's K and V have landed (the younger stages may still load)."""
        ld = ctx.loads
        if cutlass.const_expr(self.kv_stages > 0):
            cute.arch.cp_async_wait_group(self.kv_stages - 1)
            cute.arch.barrier()
        else:
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()
            # only the first round's tile can cross seqlen_k; predicating every round's rows
            # measured 2-5% slower at head_dim 128 on the H200
            if masked:
                self._load_kv(ld, ld.tVgV, ld.tVsV, slot.n_block, ctx.seqlen.seqlen_k, True)
            else:
                self._load_kv(ld, ld.tVgV, ld.tVsV, slot.n_block, ctx.seqlen.seqlen_k, False)
            cute.arch.cp_async_commit_group()

    def gemm_s(self, ctx: RoundContext, slot: RoundSlot, acc_S):
        thr = ctx.thr
        tSsK = thr.ldsm["tSsK"]
        if cutlass.const_expr(self.kv_stages > 0):
            tSsK = tSsK[None, None, None, slot.stage]
        gemm_ldmatrix(thr.tiled_mma, acc_S, thr.tSrQ, thr.tSrK, thr.s2r_k, tSsK,
                      thr.ldsm["tSrK_view"], thr.s2r_q, thr.ldsm["tSsQ"], thr.ldsm["tSrQ_view"],
                      fine=False)

    @cute.jit
    def after_softmax(self, ctx: RoundContext, slot: RoundSlot):
        """V has landed; start the next round's K under P @ V."""
        if cutlass.const_expr(self.kv_stages == 0):
            ld = ctx.loads
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()
            if slot.n_block > ctx.n_block_min:
                self._load_kv(ld, ld.tKgK, ld.tKsK, slot.n_block - 1, ctx.seqlen.seqlen_k, False)
            cute.arch.cp_async_commit_group()

    def gemm_o(self, ctx: RoundContext, slot: RoundSlot, tOrP):
        thr = ctx.thr
        tOsVt = thr.ldsm["tOsVt"]
        if cutlass.const_expr(self.kv_stages > 0):
            tOsVt = tOsVt[None, None, None, slot.stage]
        gemm_ldmatrix(thr.tiled_mma, thr.acc_O, tOrP, thr.tOrVt, thr.s2r_v, tOsVt,
                      thr.ldsm["tOrVt_view"])

    @cute.jit
    def after_round(self, ctx: RoundContext, slot: RoundSlot):
        """With a ring: once every warp is done with this stage, refill it with the block
        kv_stages rounds ahead (a full block: only the first round's can cross seqlen_k)."""
        if cutlass.const_expr(self.kv_stages > 0):
            ld = ctx.loads
            cute.arch.barrier()
            n_next = slot.n_block - self.kv_stages
            if n_next >= ctx.n_block_min:
                self._load_kv(ld, ld.tKgK, ld.tKsK[None, None, None, slot.stage], n_next,
                              ctx.seqlen.seqlen_k, False, self.page_prefetch)
                self._load_kv(ld, ld.tVgV, ld.tVsV[None, None, None, slot.stage], n_next,
                              ctx.seqlen.seqlen_k, False, self.page_prefetch)
                if cutlass.const_expr(self.page_prefetch):
                    if n_next > ctx.n_block_min:
                        self._fetch_pages(ld, n_next - 1)
            cute.arch.cp_async_commit_group()
