"""The sm80 FlashAttention-2 backward kernel: cp.async + ldmatrix + mma.sync m16n8k16, for
every GPU from sm80 on.

One CTA owns `block_n` keys of one K/V head of one batch entry. K and V stay in shared memory;
dK and dV accumulate in registers (float32) over every query block that sees those keys, of
every query head of the K/V head's group (GQA/MQA: the group's heads are summed here, no
repeated K/V is ever made). Per query block m (Q, dO, and the forward's LSE and the
preprocess's D = rowsum(dO * O) of its rows):

    S  = Q K^T                      recompute the scores (softcap, mask as the forward)
    P  = exp2(S * scale_log2 - LSE) the forward's weights, from its LSE: no softmax pass
    dP = dO V^T
    dS = P * (dP - D)               (times 1 - tanh^2 under a softcap)
    P, dS -> shared memory          the next three products read them transposed
    dV += P^T dO
    dK += dS^T Q
    dQ  = dS K  -> float32 atomics into dQaccum (`bwd_postprocess` scales and converts it)

Q and dO tiles stream through a ring of q_stages: with two, query block m + 1 loads while m
computes. Where the mask is needed (the causal diagonal, a window's lower edge, the last key
block's tail) is decided per query block, under a uniform branch; rows past seqlen_q arrive as
zeros with LSE = +inf, so they weigh nothing without a mask.

deterministic: the CTAs adding into one query block's dQaccum take turns in key-block order
(a counter per (batch, head, query block): wait until it equals this key block's turn, add,
release it to the next), so the float32 sums are formed in one order on every run. dK and dV
are always deterministic: one CTA sums them, in a fixed order.

Tensors: Q, dO (B, Sq, Hq, D); K, V, dK, dV (B, Sk, Hk, D); LSE (log2 units, +inf where a row
saw no key) and D (B, Hq, Sq) float32; dQaccum (B, Sq, Hq, D) float32, zeroed; ragged (varlen):
(1, total, H, D) and (1, H, total), entry b's rows from cu_seqlens[b].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import cutlass
import cutlass.cute as cute
import cutlass.memory

from ...layouts import bwd as bwd_layouts, copies, mma as mma_mod
from ...layouts._types import cutlass_dtype
from ..common import epilogue, mask, mods
from ..common.gemm import gemm_ldmatrix
from ..common.launch import occupancy_options
from ..common.loads import load_rows
from ..common.softmax import score_scales
from ..common.thread_mma import tile_place
from ..sched.block_info import list_entry
from ..sched.seqlen import SeqlenInfo
from .base import FlashBwdBase, QueryBlocks, RowData


@dataclass(frozen=True)
class BwdThread:
    """One thread's share of the backward's five products: the three TiledMMAs' slices, the
    register fragments of each product's operands, the ldmatrix copies with their smem and
    register views (`views`), the dK/dV accumulators, and where its S/dP accumulator sits in
    the (block_m x block_n) tile (row0/col0 and the constant offsets from them)."""

    tiled_sdp: object
    tiled_dkv: object
    tiled_dq: object
    thr_dq: object
    rA_sdp: object
    rB_sdp: object
    rA_dkv: object
    rB_dkv: object
    rA_dq: object
    rB_dq: object
    copies: dict
    views: dict
    acc_dK: object
    acc_dV: object
    row0: object
    col0: object
    row_offsets: tuple
    col_offsets: tuple


def bwd_thread(cfg, tidx, sQ, sdO, sK, sV, sP, sdS) -> BwdThread:
    """Build thread tidx's MMA state from `cute_fa.layouts.bwd` (plain Python, while tracing).
    sQ, sdO carry a stage mode; the transposed views read the same bytes."""
    bm, bn, dp, st = cfg.block_m, cfg.block_n, cfg.head_dim_padded, cfg.q_stages
    sQt = bwd_layouts.transposed(sQ, bm, dp, st)
    sdOt = bwd_layouts.transposed(sdO, bm, dp, st)
    sKt = bwd_layouts.transposed(sK, bn, dp)
    sPt = bwd_layouts.transposed(sP, bm, bn)
    sdSt = bwd_layouts.transposed(sdS, bm, bn)
    tiled_sdp = bwd_layouts.tiled_mma_sdp(cfg)
    tiled_dkv = bwd_layouts.tiled_mma_dkv(cfg)
    tiled_dq = bwd_layouts.tiled_mma_dq(cfg)
    thr_sdp, thr_dkv, thr_dq = (t.get_slice(tidx) for t in (tiled_sdp, tiled_dkv, tiled_dq))

    # one register fragment per product's operand slot: the two products of a TiledMMA load
    # their operands into the same registers one after the other
    rA_sdp = thr_sdp.make_fragment_A(thr_sdp.partition_A(sQ[None, None, 0]))
    rB_sdp = thr_sdp.make_fragment_B(thr_sdp.partition_B(sK))
    rA_dkv = thr_dkv.make_fragment_A(thr_dkv.partition_A(sPt))
    rB_dkv = thr_dkv.make_fragment_B(thr_dkv.partition_B(sdOt[None, None, 0]))
    rA_dq = thr_dq.make_fragment_A(thr_dq.partition_A(sdS))
    rB_dq = thr_dq.make_fragment_B(thr_dq.partition_B(sKt))

    cp = dict(
        a_sdp=bwd_layouts.smem_copy_a(cfg, tiled_sdp), b_sdp=bwd_layouts.smem_copy_b(cfg, tiled_sdp),
        a_dkv=bwd_layouts.smem_copy_a(cfg, tiled_dkv, transpose=True),
        b_dkv=bwd_layouts.smem_copy_b(cfg, tiled_dkv, transpose=True),
        a_dq=bwd_layouts.smem_copy_a(cfg, tiled_dq),
        b_dq=bwd_layouts.smem_copy_b(cfg, tiled_dq, transpose=True),
        r2s=bwd_layouts.r2s_copy_ps(cfg, tiled_sdp))
    t = {name: c.get_slice(tidx) for name, c in cp.items()}
    views = dict(
        tSsQ=t["a_sdp"].partition_S(sQ), tdPsdO=t["a_sdp"].partition_S(sdO),
        rA_sdp=t["a_sdp"].retile(rA_sdp),
        tSsK=t["b_sdp"].partition_S(sK), tdPsV=t["b_sdp"].partition_S(sV),
        rB_sdp=t["b_sdp"].retile(rB_sdp),
        tdVsPt=t["a_dkv"].partition_S(sPt), tdKsdSt=t["a_dkv"].partition_S(sdSt),
        rA_dkv=t["a_dkv"].retile(rA_dkv),
        tdVsdOt=t["b_dkv"].partition_S(sdOt), tdKsQt=t["b_dkv"].partition_S(sQt),
        rB_dkv=t["b_dkv"].retile(rB_dkv),
        tdQsdS=t["a_dq"].partition_S(sdS), rA_dq=t["a_dq"].retile(rA_dq),
        tdQsKt=t["b_dq"].partition_S(sKt), rB_dq=t["b_dq"].retile(rB_dq),
        tPsP=t["r2s"].partition_D(sP), tdSsdS=t["r2s"].partition_D(sdS), r2s=t["r2s"])

    acc_dK = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, dp)), cutlass.Float32)
    acc_dV = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, dp)), cutlass.Float32)
    acc_dK.fill(0.0)
    acc_dV.fill(0.0)
    tScS = thr_sdp.partition_C(cute.make_identity_tensor((bm, bn)))
    place = tile_place(cute.make_tensor(tScS.iterator, mma_mod.acc_rowcol_layout(tScS.layout)))
    return BwdThread(tiled_sdp=tiled_sdp, tiled_dkv=tiled_dkv, tiled_dq=tiled_dq, thr_dq=thr_dq,
                     rA_sdp=rA_sdp, rB_sdp=rB_sdp, rA_dkv=rA_dkv, rB_dkv=rB_dkv, rA_dq=rA_dq,
                     rB_dq=rB_dq, copies=cp, views=views, acc_dK=acc_dK, acc_dV=acc_dV, **place)


class FlashBwdSm80(FlashBwdBase):
    """Built from a `compile.keys.BwdKey`."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mD: cute.Tensor, mdQaccum: cute.Tensor, mdK: cute.Tensor,
                 mdV: cute.Tensor, softmax_scale: cutlass.Float32, causal_offset: Optional[cutlass.Int32],
                 window_left: Optional[cutlass.Int32], window_right: Optional[cutlass.Int32],
                 softcap: Optional[cutlass.Float32], mCuSeqlensQ: Optional[cute.Tensor],
                 mCuSeqlensK: Optional[cute.Tensor], max_seqlen_k: Optional[cutlass.Int32],
                 mSemaphore: Optional[cute.Tensor], score_tensors: Optional[tuple], stream):
        """The optional arguments are those the key asks for (`compile.registry`), None
        elsewhere."""
        cfg = self.cfg
        Storage = bwd_layouts.shared_storage(cfg)
        scale_log2, softcap_scale = score_scales(self.softcap, softmax_scale, softcap,
                                                 self.score_mod)
        keys = max_seqlen_k if cutlass.const_expr(self.varlen_k) else mK.shape[1]
        grid = (cute.ceil_div(keys, cfg.block_n), cute.size(mK.shape[2]),
                cute.size(mCuSeqlensQ.shape[0] - 1 if cutlass.const_expr(self.varlen_q)
                          else mQ.shape[0]))
        self.kernel(mQ, mK, mV, mdO, mLSE, mD, mdQaccum, mdK, mdV, scale_log2, softmax_scale,
                    causal_offset, Storage, mCuSeqlensQ, mCuSeqlensK, window_left, window_right,
                    softcap_scale, mSemaphore, score_tensors).launch(
            grid=grid, block=(cfg.num_threads, 1, 1), smem=Storage.size_in_bytes(),
            stream=stream, **occupancy_options(self.ctas_per_sm))

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
               mLSE: cute.Tensor, mD: cute.Tensor, mdQaccum: cute.Tensor, mdK: cute.Tensor,
               mdV: cute.Tensor, scale_log2: cutlass.Float32, softmax_scale: cutlass.Float32,
               causal_offset: Optional[cutlass.Int32], Storage: cutlass.Constexpr,
               mCuSeqlensQ: Optional[cute.Tensor], mCuSeqlensK: Optional[cute.Tensor],
               window_left: Optional[cutlass.Int32], window_right: Optional[cutlass.Int32],
               softcap_scale: Optional[cutlass.Float32], mSemaphore: Optional[cute.Tensor],
               score_tensors: Optional[tuple]):
        cfg = self.cfg
        bm, bn, dp = cfg.block_m, cfg.block_n, cfg.head_dim_padded
        tidx, _, _ = cute.arch.thread_idx()
        work = self._work(mQ, mK, 1, 2, causal_offset, mCuSeqlensQ, mCuSeqlensK)
        n_block, head_kv, batch, seqlen = work.n_block, work.head_kv, work.batch, work.seqlen
        causal_offset, group = work.causal_offset, work.group

        storage = cutlass.memory.SmemAllocator().allocate(Storage)
        sQ = storage.sQ.get_tensor(bwd_layouts.smem_layout_q(cfg))
        sdO = storage.sdO.get_tensor(bwd_layouts.smem_layout_q(cfg))
        sK = storage.sK.get_tensor(bwd_layouts.smem_layout_kv(cfg))
        sV = storage.sV.get_tensor(bwd_layouts.smem_layout_kv(cfg))
        sP = storage.sP.get_tensor(bwd_layouts.smem_layout_ps(cfg))
        sdS = storage.sdS.get_tensor(bwd_layouts.smem_layout_ps(cfg))

        # a ragged batch's short entries have fewer key blocks than the grid
        if n_block * bn < seqlen.seqlen_k:
            g2s = copies.gmem_tiled_copy_qkv(cfg)
            thr_g2s = g2s.get_slice(tidx)
            tKVcKV = thr_g2s.partition_S(cute.make_identity_tensor((bn, dp)))
            tQcQ = thr_g2s.partition_S(cute.make_identity_tensor((bm, dp)))
            gK = cute.local_tile(seqlen.k_rows(mK, batch, head_kv), (bn, dp), (n_block, 0))
            gV = cute.local_tile(seqlen.k_rows(mV, batch, head_kv), (bn, dp), (n_block, 0))
            load_rows(cfg, g2s, thr_g2s.partition_S(gK), thr_g2s.partition_D(sK), tKVcKV,
                      n_block * bn, seqlen.seqlen_k)
            load_rows(cfg, g2s, thr_g2s.partition_S(gV), thr_g2s.partition_D(sV), tKVcKV,
                      n_block * bn, seqlen.seqlen_k)
            cute.arch.cp_async_commit_group()

            thr = bwd_thread(cfg, tidx, sQ, sdO, sK, sV, sP, sdS)
            blocks = self._query_blocks(n_block, seqlen, causal_offset, window_left,
                                        window_right)
            tQsQ = thr_g2s.partition_D(sQ)
            tdOsdO = thr_g2s.partition_D(sdO)
            for g in cutlass.range(group, unroll=1):
                head = head_kv * group + g
                tQgQ = thr_g2s.partition_S(cute.local_tile(seqlen.q_rows(mQ, batch, head),
                                                           (bm, dp), (None, 0)))
                tdOgdO = thr_g2s.partition_S(cute.local_tile(seqlen.q_rows(mdO, batch, head),
                                                             (bm, dp), (None, 0)))
                rows = RowData(seqlen.lse_row(mLSE, batch, head), seqlen.lse_row(mD, batch, head),
                               mdQaccum, head)
                # every warp is done with the last head's tiles before they are overwritten
                cute.arch.barrier()
                if cutlass.const_expr(self.block_sparse):
                    self._visit_listed(thr, rows, n_block, blocks, seqlen, batch, head,
                                       (g2s, tQgQ, tQsQ, tdOgdO, tdOsdO, tQcQ), scale_log2,
                                       softcap_scale, mCuSeqlensQ, mSemaphore, tidx,
                                       score_tensors)
                else:
                    self._visit_range(thr, rows, n_block, blocks, seqlen, batch,
                                      (g2s, tQgQ, tQsQ, tdOgdO, tdOsdO, tQcQ), scale_log2,
                                      softcap_scale, mCuSeqlensQ, mSemaphore, tidx,
                                      score_tensors)

            # dS was formed from scores S = Q K^T, the logits are S * softmax_scale
            thr.acc_dK.store(thr.acc_dK.load() * softmax_scale)
            rows_k = cfg.kv_rows
            cdK = cute.local_tile(cute.make_identity_tensor((seqlen.seqlen_k, cfg.head_dim)),
                                  (bn, dp), (n_block, 0))
            epilogue.store_O(rows_k, thr.acc_dK, thr.tiled_dkv, sK,
                             cute.local_tile(seqlen.k_rows(mdK, batch, head_kv), (bn, dp),
                                             (n_block, 0)), cdK, seqlen.seqlen_k, tidx)
            epilogue.store_O(rows_k, thr.acc_dV, thr.tiled_dkv, sV,
                             cute.local_tile(seqlen.k_rows(mdV, batch, head_kv), (bn, dp),
                                             (n_block, 0)), cdK, seqlen.seqlen_k, tidx)

    @cute.jit
    def _visit_range(self, thr: BwdThread, rows: "RowData", n_block, blocks: QueryBlocks,
                     seqlen: SeqlenInfo, batch, loads: tuple, scale_log2, softcap_scale,
                     mCuSeqlensQ, mSemaphore, tidx, score_tensors):
        """Query blocks [blocks.m_lo, blocks.m_hi) for key block n_block, Q and dO loaded
        into a ring of cfg.q_stages stages a block ahead."""
        g2s, tQgQ, tQsQ, tdOgdO, tdOsdO, tQcQ = loads
        if blocks.m_lo < blocks.m_hi:
            self._load_q(g2s, tQgQ, tQsQ, tdOgdO, tdOsdO, tQcQ, blocks.m_lo, 0, seqlen.seqlen_q)
        for m_block in cutlass.range(blocks.m_lo, blocks.m_hi, unroll=1):
            stage = 0
            if cutlass.const_expr(self.cfg.q_stages == 2):
                stage = (m_block - blocks.m_lo) % 2
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()
            if cutlass.const_expr(self.cfg.q_stages == 2):
                if m_block + 1 < blocks.m_hi:
                    self._load_q(g2s, tQgQ, tQsQ, tdOgdO, tdOsdO, tQcQ, m_block + 1,
                                 1 - stage, seqlen.seqlen_q)
            self._step(thr, rows, m_block, n_block, stage, blocks, seqlen, batch, scale_log2,
                       softcap_scale, mCuSeqlensQ, mSemaphore, tidx, score_tensors)
            if cutlass.const_expr(self.cfg.q_stages == 1):
                cute.arch.barrier()
                if m_block + 1 < blocks.m_hi:
                    self._load_q(g2s, tQgQ, tQsQ, tdOgdO, tdOsdO, tQcQ, m_block + 1, 0,
                                 seqlen.seqlen_q)

    @cute.jit
    def _visit_listed(self, thr: BwdThread, rows: "RowData", n_block, blocks: QueryBlocks,
                      seqlen: SeqlenInfo, batch, head, loads: tuple, scale_log2, softcap_scale,
                      mCuSeqlensQ, mSemaphore, tidx, score_tensors):
        """block_sparse: the query blocks key block n_block's block mask lists for `head`
        (`BlockMask.query_tiles`, the score tensors after the captures), ascending, with the
        dense loop's Q / dO ring; a query block it does not list holds no kept score, one it
        lists whole skips the mask (`list_entry`)."""
        g2s, tQgQ, tQsQ, tdOgdO, tdOsdO, tQcQ = loads
        counts = score_tensors[self.n_captures]
        listed = score_tensors[self.n_captures + 1][batch, head, n_block, None]
        steps = counts[batch, head, n_block]
        if steps > 0:
            self._load_q(g2s, tQgQ, tQsQ, tdOgdO, tdOsdO, tQcQ, list_entry(listed[0])[0], 0,
                         seqlen.seqlen_q)
        for i in cutlass.range(steps, unroll=1):
            m_block, needs_mask = list_entry(listed[i])
            stage = 0
            if cutlass.const_expr(self.cfg.q_stages == 2):
                stage = i % 2
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()
            if cutlass.const_expr(self.cfg.q_stages == 2):
                if i + 1 < steps:
                    self._load_q(g2s, tQgQ, tQsQ, tdOgdO, tdOsdO, tQcQ,
                                 list_entry(listed[i + 1])[0], 1 - stage, seqlen.seqlen_q)
            self._step(thr, rows, m_block, n_block, stage, blocks, seqlen, batch, scale_log2,
                       softcap_scale, mCuSeqlensQ, mSemaphore, tidx, score_tensors, needs_mask)
            if cutlass.const_expr(self.cfg.q_stages == 1):
                cute.arch.barrier()
                if i + 1 < steps:
                    self._load_q(g2s, tQgQ, tQsQ, tdOgdO, tdOsdO, tQcQ,
                                 list_entry(listed[i + 1])[0], 0, seqlen.seqlen_q)

    @cute.jit
    def _load_q(self, g2s, tQgQ, tQsQ, tdOgdO, tdOsdO, tQcQ, m_block, stage, seqlen_q):
        """Start the loads of query block m_block's Q and dO tiles into ring stage `stage`."""
        row0 = m_block * self.cfg.block_m
        load_rows(self.cfg, g2s, tQgQ[None, None, None, m_block], tQsQ[None, None, None, stage],
                  tQcQ, row0, seqlen_q)
        load_rows(self.cfg, g2s, tdOgdO[None, None, None, m_block],
                  tdOsdO[None, None, None, stage], tQcQ, row0, seqlen_q)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def _step(self, thr: BwdThread, rows: "RowData", m_block, n_block, stage,
              blocks: QueryBlocks, seqlen: SeqlenInfo, batch, scale_log2, softcap_scale,
              mCuSeqlensQ, mSemaphore, tidx, score_tensors=None, needs_mask=True):
        """One (query block, key block) pair: the five products. softcap_scale: the scores'
        pre-scale under a softcap or a score_mod; needs_mask: False where a block mask's list
        keeps the pair whole (`list_entry`)."""
        cfg = self.cfg
        bm, bn, dp = cfg.block_m, cfg.block_n, cfg.head_dim_padded
        v = thr.views
        dtype = cutlass_dtype(cfg.dtype)
        n_rows = len(thr.row_offsets)

        # the rows' LSE and D, read while S is computed
        query0 = m_block * bm + thr.row0
        rLSE = cute.make_rmem_tensor(n_rows, cutlass.Float32)
        rD = cute.make_rmem_tensor(n_rows, cutlass.Float32)
        for r in cutlass.range_constexpr(n_rows):
            q = query0 + thr.row_offsets[r]
            rLSE[r] = cutlass.Float32.inf
            rD[r] = 0.0
            if q < seqlen.seqlen_q:
                rLSE[r] = rows.lse[q]
                rD[r] = rows.d[q]

        acc_S = cute.make_rmem_tensor(thr.tiled_sdp.get_slice(tidx).partition_shape_C((bm, bn)),
                                      cutlass.Float32)
        acc_S.fill(0.0)
        gemm_ldmatrix(thr.tiled_sdp, acc_S, thr.rA_sdp, thr.rB_sdp, thr.copies["b_sdp"],
                      v["tSsK"], v["rB_sdp"], thr.copies["a_sdp"],
                      v["tSsQ"][None, None, None, stage], v["rA_sdp"], fine=False)
        dtanh = self._softcap_scores(acc_S, softcap_scale)
        acc_S_mn = cute.make_tensor(acc_S.iterator, mma_mod.acc_rowcol_layout(acc_S.layout))
        coords = mods.TileCoords(thr.row_offsets, thr.col_offsets, query0)
        key0 = n_block * bn + thr.col0
        dmod, dcaptures = self._mod_scores(acc_S, acc_S_mn, coords, key0, seqlen, batch,
                                           rows.head, score_tensors, softcap_scale, needs_mask)
        if self._masked(m_block, n_block, blocks, seqlen):
            mask.apply_mask(acc_S_mn, thr.row_offsets, thr.col_offsets, query0,
                            n_block * bn + thr.col0, seqlen.seqlen_k, blocks.upper, self.causal,
                            1, blocks.window_offset)
        for r in cutlass.range_constexpr(n_rows):
            acc_S_mn[r, None] = cute.math.exp2(acc_S_mn[r, None].load() * scale_log2 - rLSE[r],
                                               fastmath=True)

        acc_dP = cute.make_fragment_like(acc_S)
        acc_dP.fill(0.0)
        gemm_ldmatrix(thr.tiled_sdp, acc_dP, thr.rA_sdp, thr.rB_sdp, thr.copies["b_sdp"],
                      v["tdPsV"], v["rB_sdp"], thr.copies["a_sdp"],
                      v["tdPsdO"][None, None, None, stage], v["rA_sdp"], fine=False)
        acc_dP_mn = cute.make_tensor(acc_dP.iterator, mma_mod.acc_rowcol_layout(acc_dP.layout))
        for r in cutlass.range_constexpr(n_rows):
            acc_dP_mn[r, None] = acc_S_mn[r, None].load() * (acc_dP_mn[r, None].load() - rD[r])
        if cutlass.const_expr(self.softcap):
            acc_dP.store(acc_dP.load() * dtanh.load())
        self._capture_grads(acc_dP_mn, dcaptures, coords, key0, seqlen, batch, rows.head,
                            score_tensors)
        if cutlass.const_expr(self.score_mod is not None):
            acc_dP.store(acc_dP.load() * dmod.load())

        rP = cute.make_fragment_like(acc_S, dtype)
        rP.store(acc_S.load().to(dtype))
        rdS = cute.make_fragment_like(acc_dP, dtype)
        rdS.store(acc_dP.load().to(dtype))
        cute.copy(v["r2s"], v["r2s"].retile(rP), v["tPsP"])
        cute.copy(v["r2s"], v["r2s"].retile(rdS), v["tdSsdS"])
        cute.arch.barrier()  # P and dS are in shared memory, whole

        gemm_ldmatrix(thr.tiled_dkv, thr.acc_dV, thr.rA_dkv, thr.rB_dkv, thr.copies["b_dkv"],
                      v["tdVsdOt"][None, None, None, stage], v["rB_dkv"], thr.copies["a_dkv"],
                      v["tdVsPt"], v["rA_dkv"], fine=False)
        gemm_ldmatrix(thr.tiled_dkv, thr.acc_dK, thr.rA_dkv, thr.rB_dkv, thr.copies["b_dkv"],
                      v["tdKsQt"][None, None, None, stage], v["rB_dkv"], thr.copies["a_dkv"],
                      v["tdKsdSt"], v["rA_dkv"], fine=False)
        # deterministic: the turn counter's first read flies under the dQ GEMM
        lock, seen = None, None
        if cutlass.const_expr(self.deterministic):
            lock = self._dq_lock(mSemaphore, batch, rows.head, m_block)
            seen = cutlass.Int32(-1)
            if tidx == 0:
                seen = cute.arch.load(lock, cutlass.Int32, sem="acquire", scope="gpu")
        acc_dQ = cute.make_rmem_tensor(thr.thr_dq.partition_shape_C((bm, dp)), cutlass.Float32)
        acc_dQ.fill(0.0)
        gemm_ldmatrix(thr.tiled_dq, acc_dQ, thr.rA_dq, thr.rB_dq, thr.copies["b_dq"],
                      v["tdQsKt"], v["rB_dq"], thr.copies["a_dq"], v["tdQsdS"], v["rA_dq"],
                      fine=False)
        self._add_dq(acc_dQ, rows.dq_accum, rows.head, m_block, n_block, blocks, seqlen, batch,
                     mCuSeqlensQ, mSemaphore, lock, seen, tidx)

    def _dq_sync(self):
        """The barrier of the threads that add dQ: the whole CTA's."""
        cute.arch.barrier()
