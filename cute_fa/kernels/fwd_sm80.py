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
LSE is written. Every layout, copy and MMA comes from `cute_fa.layouts`.

Tensors: Q, O (B, Sq, Hq, D); K, V (B, Sk, Hk, D); LSE (B, Hq, Sq) float32, written
only when write_lse != 0.
Shapes and strides are dynamic (any sequence length, batch, head count or
stride with a unit last stride), head_dim is static.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory

from ..backends import Sm80Key
from ..layouts import copies, mma as mma_mod, smem
from ..layouts._types import cutlass_dtype
from . import epilogue, mask
from .gemm import gemm_ldmatrix
from .launch import occupancy_options
from .softmax import LOG2_E
from .thread_mma import thread_mma



class FlashFwdSm80:
    def __init__(self, key: Sm80Key):
        cfg = key.tile
        self.cfg = cfg
        self.causal = key.causal
        self.ctas_per_sm = key.ctas_per_sm
        self.mask_steps = mask.masked_round_count(cfg.block_m, cfg.block_n, key.causal)

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, softmax_scale: cutlass.Float32, causal_offset: cutlass.Int32,
                 write_lse: cutlass.Int32, stream):
        cfg = self.cfg
        sQ_layout = smem.smem_layout_q(cfg)
        sKV_layout = smem.smem_layout_kv(cfg)
        SharedStorage = smem.shared_storage(cfg)

        grid = (cute.ceil_div(mQ.shape[1], cfg.block_m), cute.size(mQ.shape[2]),
                cute.size(mQ.shape[0]))
        self.kernel(mQ, mK, mV, mO, mLSE, softmax_scale * LOG2_E, causal_offset, write_lse,
                    sQ_layout, sKV_layout, SharedStorage).launch(
            grid=grid, block=(cfg.num_threads, 1, 1), smem=SharedStorage.size_in_bytes(),
            stream=stream, **occupancy_options(self.ctas_per_sm))

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor, scale_log2: cutlass.Float32, causal_offset: cutlass.Int32,
               write_lse: cutlass.Int32, sQ_layout: cute.ComposedLayout,
               sKV_layout: cute.ComposedLayout, SharedStorage: cutlass.Constexpr):
        cfg = self.cfg
        bm, bn, dp = cfg.block_m, cfg.block_n, cfg.head_dim_padded
        tidx, _, _ = cute.arch.thread_idx()
        seqlen_q = mQ.shape[1]
        seqlen_k = mK.shape[1]
        # K/V tiles are walked from n_block_max - 1 down to 0
        m_block, head, batch, head_kv, n_block_max = mask.cta_work(
            seqlen_k, mQ.shape[2], mK.shape[2], bm, bn, causal_offset, self.causal)

        gQ = cute.local_tile(mQ[batch, None, head, None], (bm, dp), (m_block, 0))
        gK = cute.local_tile(mK[batch, None, head_kv, None], (bn, dp), (None, 0))
        gV = cute.local_tile(mV[batch, None, head_kv, None], (bn, dp), (None, 0))
        cQ = cute.local_tile(cute.make_identity_tensor((seqlen_q, cfg.head_dim)), (bm, dp),
                             (m_block, 0))
        cKV = cute.make_identity_tensor((bn, dp))

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK = storage.sK.get_tensor(sKV_layout)
        sV = storage.sV.get_tensor(sKV_layout)
        sVt = smem.transposed_v(sV, cfg)

        g2s = copies.gmem_tiled_copy_qkv(cfg)
        thr_g2s = g2s.get_slice(tidx)
        tQgQ = thr_g2s.partition_S(gQ)
        tQsQ = thr_g2s.partition_D(sQ)
        tQcQ = thr_g2s.partition_S(cQ)
        tKgK = thr_g2s.partition_S(gK)
        tKsK = thr_g2s.partition_D(sK)
        tVgV = thr_g2s.partition_S(gV)
        tVsV = thr_g2s.partition_D(sV)
        tKVcKV = thr_g2s.partition_S(cKV)

        # Q: rows past seqlen_q are zeros
        for m in cutlass.range_constexpr(cute.size(tQsQ.shape[1])):
            if tQcQ[0, m, 0][0] < seqlen_q:
                self._copy_row(g2s, tQgQ[None, m, None], tQsQ[None, m, None], tQcQ[None, m, None])
            else:
                tQsQ[None, m, None].fill(0.0)

        f = thread_mma(cfg, tidx, sQ, sK, sVt, sK, sVt, scale_log2)
        if n_block_max > 0:
            self._load_kv(g2s, tKgK, tKsK, tKVcKV, n_block_max - 1, seqlen_k, True)
        cute.arch.cp_async_commit_group()

        query0 = m_block * bm + f.row0
        mask_at = (f.row_offsets, f.col_offsets, query0, f.col0)
        args = (f.tiled_mma, f.thr_mma, g2s, tKgK, tKsK, tVgV, tVsV, tKVcKV, f.tSrQ, f.tSrK,
                f.tOrVt, f.ldsm, f.s2r_q, f.s2r_k, f.s2r_v, f.acc_O, f.acc_O_mn, mask_at,
                f.softmax, seqlen_k, causal_offset)
        # one loop body for every round (one copy of it to trace and compile): the rounds
        # that may need masking come first and mask under a uniform branch
        n_masked = cutlass.min(n_block_max, self.mask_steps)
        for step in range(0, n_block_max, 1):
            self._round(n_block_max - 1 - step, step < n_masked, *args)

        epilogue.write_outputs(cfg, f, sQ, mO, mLSE, batch, head, m_block, seqlen_q, query0,
                               write_lse, tidx)

    @cute.jit
    def _copy_row(self, g2s: cute.TiledCopy, src: cute.Tensor, dst: cute.Tensor,
                  coords: cute.Tensor):
        """Copy one row-pass of a tile; the padding columns past head_dim become zeros."""
        cfg = self.cfg
        if cutlass.const_expr(cfg.head_dim == cfg.head_dim_padded):
            cute.copy(g2s, src, dst)
        else:
            for k in cutlass.range_constexpr(cute.size(src.shape[1])):
                if coords[0, k][1] < cfg.head_dim:
                    cute.copy(g2s, src[None, k], dst[None, k])
                else:
                    dst[None, k].fill(0.0)

    @cute.jit
    def _load_kv(self, g2s: cute.TiledCopy, tXgX: cute.Tensor, tXsX: cute.Tensor,
                 tKVcKV: cute.Tensor, n_block, seqlen_k, check_rows: cutlass.Constexpr):
        """Start the cp.async of one K or V tile; with check_rows, rows past seqlen_k become zeros."""
        for m in cutlass.range_constexpr(cute.size(tXsX.shape[1])):
            if cutlass.const_expr(check_rows):
                if n_block * self.cfg.block_n + tKVcKV[0, m, 0][0] < seqlen_k:
                    self._copy_row(g2s, tXgX[None, m, None, n_block], tXsX[None, m, None],
                                   tKVcKV[None, m, None])
                else:
                    tXsX[None, m, None].fill(0.0)
            else:
                self._copy_row(g2s, tXgX[None, m, None, n_block], tXsX[None, m, None],
                               tKVcKV[None, m, None])

    @cute.jit
    def _round(self, n_block, masked,
               tiled_mma: cute.TiledMma, thr_mma, g2s: cute.TiledCopy, tKgK: cute.Tensor,
               tKsK: cute.Tensor, tVgV: cute.Tensor, tVsV: cute.Tensor, tKVcKV: cute.Tensor,
               tSrQ: cute.Tensor, tSrK: cute.Tensor, tOrVt: cute.Tensor, ldsm: dict,
               s2r_q: cute.TiledCopy, s2r_k: cute.TiledCopy, s2r_v: cute.TiledCopy,
               acc_O: cute.Tensor, acc_O_mn: cute.Tensor, mask_at: tuple, softmax, seqlen_k,
               causal_offset):
        cfg = self.cfg
        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((cfg.block_m, cfg.block_n)),
                                      cutlass.Float32)
        acc_S.fill(0.0)

        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        # only the first round's tile can cross seqlen_k; predicating every round's rows
        # measured 2-5% slower at head_dim 128 on the H200
        if masked:
            self._load_kv(g2s, tVgV, tVsV, tKVcKV, n_block, seqlen_k, True)
        else:
            self._load_kv(g2s, tVgV, tVsV, tKVcKV, n_block, seqlen_k, False)
        cute.arch.cp_async_commit_group()

        tSsQ, tSrQ_view = ldsm["tSsQ"], ldsm["tSrQ_view"]
        tSsK, tSrK_view = ldsm["tSsK"], ldsm["tSrK_view"]
        gemm_ldmatrix(tiled_mma, acc_S, tSrQ, tSrK, s2r_k, tSsK, tSrK_view, s2r_q, tSsQ, tSrQ_view,
                      fine=False)

        acc_S_mn = cute.make_tensor(acc_S.iterator, mma_mod.acc_rowcol_layout(acc_S.layout))
        if masked:
            row_offsets, col_offsets, query0, col0 = mask_at
            mask.apply_mask(acc_S_mn, row_offsets, col_offsets, query0,
                            n_block * cfg.block_n + col0, seqlen_k, causal_offset, self.causal)

        softmax.step(acc_S_mn, acc_O_mn)

        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        if n_block > 0:
            self._load_kv(g2s, tKgK, tKsK, tKVcKV, n_block - 1, seqlen_k, False)
        cute.arch.cp_async_commit_group()

        rP = cute.make_fragment_like(acc_S, cutlass_dtype(cfg.dtype))
        rP.store(acc_S.load().to(cutlass_dtype(cfg.dtype)))
        tOrP = cute.make_tensor(rP.iterator, mma_mod.acc_to_a_layout(rP.layout))
        tOsVt, tOrVt_view = ldsm["tOsVt"], ldsm["tOrVt_view"]
        gemm_ldmatrix(tiled_mma, acc_O, tOrP, tOrVt, s2r_v, tOsVt, tOrVt_view)
