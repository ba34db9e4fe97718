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


def _block_grid(out: cute.Tensor, block: int, cu_seqlens, max_seqlen, varlen: bool):
    """(row blocks, heads, entries) of a conversion into out (B, S, H, D): a ragged batch's
    longest entry and its entries, else out's."""
    if cutlass.const_expr(varlen):
        return (cute.ceil_div(max_seqlen, block), cute.size(out.shape[2]),
                cute.size(cu_seqlens.shape[0] - 1))
    return (cute.ceil_div(out.shape[1], block), cute.size(out.shape[2]), cute.size(out.shape[0]))


class BwdPostprocess:
    """Built from a `compile.keys.BwdPostKey` (the main kernel's tile): dQaccum float32 (B, H,
    blocks * block_m * head_dim_padded), dQ (B, S, H, D)."""

    def __init__(self, key):
        self.cfg = key.tile
        self.varlen = key.varlen
        self.dq_vector = bwd_layouts.dq_vector(key.arch)
        # the main kernel's dQ TiledMMA, whose register order the sums are in
        wgmma_tile = isinstance(key.tile, WgmmaBwdTileConfig)
        self.tiled_mma_dq = bwd_wgmma.tiled_mma_dq if wgmma_tile else bwd_layouts.tiled_mma_dq
        # dQ^T's sums (d on the TiledMMA's rows) are put back in (query, d) order by hand
        self.transposed = wgmma_tile and key.tile.dq_transposed
        dp = key.tile.head_dim_padded
        self.dq_shape = bwd_wgmma.dq_shape(key.tile) if wgmma_tile else (key.tile.block_m, dp)

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

        grid = _block_grid(mdQ, cfg.block_m, mCuSeqlensQ, max_seqlen_q, self.varlen)
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
            acc = cute.make_rmem_tensor(
                tiled_dq.get_slice(tidx).partition_shape_C(self.dq_shape), cutlass.Float32)
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
            if cutlass.const_expr(self.transposed):
                self._stage_transposed(acc, tiled_dq, sdQ, tidx)
                if tidx < cfg.q_rows.num_threads:
                    epilogue.copy_out_O(cfg.q_rows, sdQ, gdQ, cdQ, seqlen.seqlen_q, tidx)
            else:
                epilogue.store_O(cfg.q_rows, acc, tiled_dq, sdQ, gdQ, cdQ, seqlen.seqlen_q,
                                 tidx)

    @cute.jit
    def _stage_transposed(self, acc, tiled_dq, sdQ, tidx):
        """dQ^T's accumulator (`layouts.bwd_wgmma.dq_shape`: (d, query)) into the (query, d)
        tile sdQ, element by element at the coordinates its TiledMMA gives each register (no
        stmatrix fits a transposed C); then the CTA's barrier."""
        dtype = cutlass_dtype(self.cfg.dtype)
        coords = tiled_dq.get_slice(tidx).partition_C(cute.make_identity_tensor(self.dq_shape))
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            d, q = coords[i]
            sdQ[q, d] = acc[i].to(dtype)
        cute.arch.barrier()


class BwdKvPostprocess:
    """Built from a `compile.keys.BwdKvPostKey` (the wgmma backward's tile): under kv_accum, dK
    and dV from their float32 sums (B, H_kv, blocks * block_n * head_dim_padded; softmax_scale
    is in dK's already), one CTA per key block of a K/V head, both stored as the main kernel
    stores them."""

    def __init__(self, key):
        self.cfg = key.tile
        self.varlen = key.varlen
        self.dq_vector = bwd_layouts.dq_vector(key.arch)

    @cute.jit
    def __call__(self, mdKaccum: cute.Tensor, mdVaccum: cute.Tensor, mdK: cute.Tensor,
                 mdV: cute.Tensor, mCuSeqlensK: Optional[cute.Tensor],
                 max_seqlen_k: Optional[cutlass.Int32], stream):
        """cu_seqlens_k and max_seqlen_k: a ragged batch's (None for a dense one)."""
        cfg = self.cfg
        dtype = cutlass_dtype(cfg.dtype)
        kv_elems = cute.cosize(smem.smem_layout_o(cfg.kv_rows))

        @cute.struct
        class Storage:
            sdK: cute.struct.Align[cute.struct.MemRange[dtype, kv_elems], 1024]
            sdV: cute.struct.Align[cute.struct.MemRange[dtype, kv_elems], 1024]

        grid = _block_grid(mdK, cfg.block_n, mCuSeqlensK, max_seqlen_k, self.varlen)
        self.kernel(mdKaccum, mdVaccum, mdK, mdV, Storage, mCuSeqlensK).launch(
            grid=grid, block=(cfg.num_threads, 1, 1), smem=Storage.size_in_bytes(),
            stream=stream)

    @cute.kernel
    def kernel(self, mdKaccum: cute.Tensor, mdVaccum: cute.Tensor, mdK: cute.Tensor,
               mdV: cute.Tensor, Storage: cutlass.Constexpr, mCuSeqlensK: Optional[cute.Tensor]):
        cfg = self.cfg
        bn, dp = cfg.block_n, cfg.head_dim_padded
        tidx, _, _ = cute.arch.thread_idx()
        n_block, head_kv, batch = cute.arch.block_idx()
        seqlen = SeqlenInfo.of(batch, 0, mdK.shape[1], None, mCuSeqlensK)
        if n_block * bn < seqlen.seqlen_k:
            tiled_dkv = bwd_wgmma.tiled_mma_dkv(cfg)
            shape = tiled_dkv.get_slice(tidx).partition_shape_C((bn, dp))
            block = bwd_layouts.dq_block(n_block, batch, bn, mCuSeqlensK)
            entry = 0 if cutlass.const_expr(self.varlen) else batch
            storage = cutlass.memory.SmemAllocator().allocate(Storage)
            cdK = cute.local_tile(cute.make_identity_tensor((seqlen.seqlen_k, cfg.head_dim)),
                                  (bn, dp), (n_block, 0))
            for sums, out, buffer in ((mdKaccum, mdK, storage.sdK), (mdVaccum, mdV, storage.sdV)):
                chunk = bwd_layouts.kv_accum_chunk(sums, entry, head_kv, block, cfg,
                                                   self.dq_vector)
                acc = cute.make_rmem_tensor(shape, cutlass.Float32)
                for i in cutlass.range(cute.size(acc), unroll_full=True):
                    acc[i] = chunk[i, tidx]
                epilogue.store_O(cfg.kv_rows, acc, tiled_dkv,
                                 buffer.get_tensor(smem.smem_layout_o(cfg.kv_rows)),
                                 cute.local_tile(seqlen.k_rows(out, batch, head_kv), (bn, dp),
                                                 (n_block, 0)), cdK, seqlen.seqlen_k, tidx)
