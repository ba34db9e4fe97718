"""The backward's last kernel: dQ = dQaccum * softmax_scale, from the main kernel's float32
sums to the input dtype (the main kernel's dS is the gradient of the scores Q K^T; the logits
are those times softmax_scale).

dQaccum holds each query block's sums in the dQ TiledMMA's register order
(`layouts.bwd.dq_accum_chunk`), so a CTA of the main kernel's threads reads them back as that
TiledMMA's accumulator, each warp 32 consecutive floats at a time, and stores them as the
forward stores O (`epilogue.store_O`: through shared memory, 16-byte stores, rows past the
sequence skipped). Ragged batches find each entry's blocks with `layouts.bwd.dq_block`.
"""

from typing import Optional

import cutlass
import cutlass.cute as cute
import cutlass.memory

from ...layouts import bwd as bwd_layouts, bwd_wgmma, smem
from ...layouts.config import WgmmaBwdTileConfig
from ...layouts._types import cutlass_dtype
from ..common import epilogue
from ..sched.seqlen import SeqlenInfo


class BwdPostprocess:
    """Built from a `compile.keys.BwdPostKey` (the main kernel's tile): dQaccum float32 (B, H,
    blocks * block_m * head_dim_padded), dQ (B, S, H, D)."""

    def __init__(self, key):
        self.cfg = key.tile
        self.varlen = key.varlen
        self.dq_vector = bwd_layouts.dq_vector(key.arch)
        # the main kernel's dQ TiledMMA, whose register order the sums are in
        self.tiled_mma_dq = (bwd_wgmma.tiled_mma_dq if isinstance(key.tile, WgmmaBwdTileConfig)
                             else bwd_layouts.tiled_mma_dq)

    @cute.jit
    def __call__(self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, softmax_scale: cutlass.Float32,
                 mCuSeqlensQ: Optional[cute.Tensor], max_seqlen_q: Optional[cutlass.Int32],
                 stream):
        """cu_seqlens_q and max_seqlen_q: a ragged batch's (None for a dense one)."""
        cfg = self.cfg
        rows = cfg.q_rows
        dtype = cutlass_dtype(cfg.dtype)
        q_elems = cute.cosize(smem.smem_layout_o(rows))

        @cute.struct
        class Storage:
            sdQ: cute.struct.Align[cute.struct.MemRange[dtype, q_elems], 1024]

        if cutlass.const_expr(self.varlen):
            grid = (cute.ceil_div(max_seqlen_q, cfg.block_m), cute.size(mdQ.shape[2]),
                    cute.size(mCuSeqlensQ.shape[0] - 1))
        else:
            grid = (cute.ceil_div(mdQ.shape[1], cfg.block_m), cute.size(mdQ.shape[2]),
                    cute.size(mdQ.shape[0]))
        self.kernel(mdQaccum, mdQ, softmax_scale, Storage, mCuSeqlensQ).launch(
            grid=grid, block=(cfg.num_threads, 1, 1), smem=Storage.size_in_bytes(),
            stream=stream)

    @cute.kernel
    def kernel(self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, softmax_scale: cutlass.Float32,
               Storage: cutlass.Constexpr, mCuSeqlensQ: Optional[cute.Tensor]):
        cfg = self.cfg
        bm, dp = cfg.block_m, cfg.head_dim_padded
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        seqlen = SeqlenInfo.of(batch, mdQ.shape[1], 0, mCuSeqlensQ)
        if m_block * bm < seqlen.seqlen_q:
            tiled_dq = self.tiled_mma_dq(cfg)
            acc = cute.make_rmem_tensor(tiled_dq.get_slice(tidx).partition_shape_C((bm, dp)),
                                        cutlass.Float32)
            chunk = bwd_layouts.dq_accum_chunk(
                mdQaccum, 0 if cutlass.const_expr(self.varlen) else batch, head,
                bwd_layouts.dq_block(m_block, batch, bm, mCuSeqlensQ), cfg, self.dq_vector)
            for i in cutlass.range(cute.size(acc), unroll_full=True):
                acc[i] = chunk[i, tidx] * softmax_scale
            storage = cutlass.memory.SmemAllocator().allocate(Storage)
            sdQ = storage.sdQ.get_tensor(smem.smem_layout_o(cfg.q_rows))
            gdQ = cute.local_tile(seqlen.q_rows(mdQ, batch, head), (bm, dp), (m_block, 0))
            cdQ = cute.local_tile(cute.make_identity_tensor((seqlen.seqlen_q, cfg.head_dim)),
                                  (bm, dp), (m_block, 0))
            epilogue.store_O(cfg.q_rows, acc, tiled_dq, sdQ, gdQ, cdQ, seqlen.seqlen_q, tidx)
