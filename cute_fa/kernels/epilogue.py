"""Epilogue shared by the kernels: O through shared memory with 128-bit stores, and LSE."""

import cutlass
import cutlass.cute as cute

from ..layouts import copies, smem
from ..layouts._types import cutlass_dtype


@cute.jit
def store_O(cfg: cutlass.Constexpr, acc_O: cute.Tensor, tiled_mma: cute.TiledMma, sQ: cute.Tensor,
            gO: cute.Tensor, cO: cute.Tensor, seqlen_q, tidx):
    """Write the normalised O tile: registers -> sO (reusing sQ) -> 16-byte stores to gmem.

    The MMA layout scatters a row over a quad; going through smem lets each thread
    store whole 16-byte runs. Rows past seqlen_q and columns past head_dim are skipped.
    gO/cO are the (block_m, head_dim_padded) tile of O and its identity coordinates.
    """
    dtype = cutlass_dtype(cfg.dtype)
    rO = cute.make_fragment_like(acc_O, dtype)
    rO.store(acc_O.load().to(dtype))
    sO = cute.make_tensor(sQ.iterator, smem.smem_layout_o(cfg))
    r2s = copies.smem_tiled_copy_o(cfg, tiled_mma)
    thr_r2s = r2s.get_slice(tidx)
    # Every warp is past its last read of sQ, and no Q copy is still landing there
    # (a CTA whose rows see no key at all runs no round, so nothing waited for Q).
    cute.arch.cp_async_wait_group(0)
    cute.arch.barrier()
    cute.copy(r2s, thr_r2s.retile(rO), thr_r2s.partition_D(sO))
    cute.arch.barrier()

    s2g = copies.gmem_tiled_copy_o(cfg)
    thr_s2g = s2g.get_slice(tidx)
    tOsO = thr_s2g.partition_S(sO)
    tOgO = thr_s2g.partition_D(gO)
    tOcO = thr_s2g.partition_D(cO)
    tOrO = cute.make_fragment_like(tOsO, dtype)
    cute.copy(s2g, tOsO, tOrO)
    for m in cutlass.range_constexpr(cute.size(tOgO.shape[1])):
        if tOcO[0, m, 0][0] < seqlen_q:
            if cutlass.const_expr(cfg.head_dim == cfg.head_dim_padded):
                cute.copy(s2g, tOrO[None, m, None], tOgO[None, m, None])
            else:
                for k in cutlass.range_constexpr(cute.size(tOgO.shape[2])):
                    if tOcO[0, m, k][1] < cfg.head_dim:
                        cute.copy(s2g, tOrO[None, m, k], tOgO[None, m, k])


@cute.jit
def store_LSE(lse: cute.Tensor, query0, row_offsets: cutlass.Constexpr, gLSE: cute.Tensor,
              seqlen_q, tidx, quad_bits: cutlass.Constexpr):
    """One lane per quad writes the LSE of each of its rows (all lanes of a quad agree).

    The thread's rows are query0 + row_offsets[r]; quad_bits is the OR of the
    row-reduction XOR offsets (lane bits inside a quad).
    """
    if tidx & quad_bits == 0:
        for r in cutlass.range_constexpr(len(row_offsets)):
            row = query0 + row_offsets[r]
            if row < seqlen_q:
                gLSE[row] = lse[r]


@cute.jit
def write_outputs(cfg: cutlass.Constexpr, f, sQ: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                  batch, head, m_block, seqlen_q, query0, write_lse, tidx):
    """The end of every forward kernel: normalise O, store it and, if asked, LSE.

    f is the thread's `thread_mma.ThreadMma`; query0 the global row of its first S row.
    """
    bm, dp = cfg.block_m, cfg.head_dim_padded
    lse = cute.make_rmem_tensor(cute.size(f.softmax.row_max), cutlass.Float32)
    f.softmax.finalize(f.acc_O_mn, lse)
    cO = cute.local_tile(cute.make_identity_tensor((seqlen_q, cfg.head_dim)), (bm, dp),
                         (m_block, 0))
    gO = cute.local_tile(mO[batch, None, head, None], (bm, dp), (m_block, 0))
    store_O(cfg, f.acc_O, f.tiled_mma, sQ, gO, cO, seqlen_q, tidx)
    if write_lse != 0:  # else mLSE is a placeholder: the caller did not ask for LSE
        quad_bits = sum(f.reduce_offsets)  # distinct powers of two
        store_LSE(lse, query0, f.row_offsets, mLSE[batch, head, None], seqlen_q, tidx,
                  quad_bits)
