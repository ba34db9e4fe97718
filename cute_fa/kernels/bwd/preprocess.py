"""The backward's first kernel: per query row, D = rowsum(dO * O) (float32), and the forward's
LSE in log2 units for the main kernel's exp2 (a row that saw no key, LSE = -inf, gets +inf:
its weights exp2(S * scale - LSE) are then 0, not NaN).

A CTA takes block_m rows of one (batch entry, head); each thread loads 16-byte pieces of a
row of O and dO (`RowTile`'s copy split, copy_threads_per_row threads per row), sums its
products and the row's threads combine their sums with XOR shuffles. Rows past the tensor's
seqlen are skipped. Ragged batches need no offsets here: their rows are (1, total, H, D) and
each row's D depends on that row alone.
"""

import cutlass
import cutlass.cute as cute

from ...layouts import copies
from ...layouts._types import cutlass_dtype
from ..common.softmax import LOG2_E, quad_allreduce


class BwdPreprocess:
    """Built from a `compile.keys.BwdPrepKey`: O, dO (B, S, H, D); LSE, LSE_log2, D (B, H, S)."""

    def __init__(self, key):
        self.cfg = key.tile

    @cute.jit
    def __call__(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
                 mLSElog2: cute.Tensor, mD: cute.Tensor, stream):
        cfg = self.cfg
        grid = (cute.ceil_div(mO.shape[1], cfg.block_m), cute.size(mO.shape[2]),
                cute.size(mO.shape[0]))
        self.kernel(mO, mdO, mLSE, mLSElog2, mD).launch(grid=grid, block=(cfg.num_threads, 1, 1),
                                                         stream=stream)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
               mLSElog2: cute.Tensor, mD: cute.Tensor):
        cfg = self.cfg
        bm, dp = cfg.block_m, cfg.head_dim_padded
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        seqlen = mO.shape[1]
        g2r = copies.gmem_tiled_copy_o(cfg)  # 16-byte loads, the O store's thread split
        thr = g2r.get_slice(tidx)
        tOgO = thr.partition_S(cute.local_tile(mO[batch, None, head, None], (bm, dp), (m_block, 0)))
        tOgdO = thr.partition_S(cute.local_tile(mdO[batch, None, head, None], (bm, dp),
                                                (m_block, 0)))
        tOcO = thr.partition_S(cute.make_identity_tensor((bm, dp)))
        dtype = cutlass_dtype(cfg.dtype)
        lanes = cfg.copy_threads_per_row
        for m in cutlass.range_constexpr(cute.size(tOgO.shape[1])):
            row = m_block * bm + tOcO[0, m, 0][0]
            total = cutlass.Float32(0.0)
            if row < seqlen:
                for k in cutlass.range_constexpr(cute.size(tOgO.shape[2])):
                    if tOcO[0, m, k][1] < cfg.head_dim:
                        rO = cute.make_fragment_like(tOgO[None, m, k], dtype)
                        rdO = cute.make_fragment_like(tOgdO[None, m, k], dtype)
                        cute.copy(g2r, tOgO[None, m, k], rO)
                        cute.copy(g2r, tOgdO[None, m, k], rdO)
                        prod = rO.load().to(cutlass.Float32) * rdO.load().to(cutlass.Float32)
                        total = total + prod.reduce(cute.ReductionOp.ADD, 0.0, 0)
            # the row's copy_threads_per_row threads are neighbouring lanes
            total = quad_allreduce(total, [lanes >> i for i in range(1, lanes.bit_length())],
                                   lambda a, b: a + b)
            if row < seqlen and tidx % lanes == 0:
                mD[batch, head, row] = total
                lse = mLSE[batch, head, row]
                lse_log2 = lse * LOG2_E
                if lse == -cutlass.Float32.inf:
                    lse_log2 = cutlass.Float32.inf
                mLSElog2[batch, head, row] = lse_log2
