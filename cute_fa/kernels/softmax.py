"""Online softmax on the accumulator's row view, in registers (FlashAttention-2 Algorithm 1).

The walkthrough's convention: row_max holds the max of raw scores (before the
scale); weights are exp2(S * scale_log2 - row_max * scale_log2), with
scale_log2 = softmax_scale * log2(e) folded into one FFMA per element.
Each thread keeps its partial row sums across K/V rounds; they are combined
across the quad once, at the end (the rescale factors are equal within a quad).
"""

import math

import cutlass
import cutlass.cute as cute

LN2 = math.log(2.0)


def quad_allreduce(value, offsets, op):
    """All-reduce one float across the lanes that share an accumulator row."""
    for off in offsets:
        value = op(value, cute.arch.shuffle_sync_bfly(value, offset=off, mask=-1, mask_and_clamp=31))
    return value


def _max(a, b):
    return cute.arch.fmax(a, b)


def _add(a, b):
    return a + b


class OnlineSoftmax:
    def __init__(self, num_rows: int, scale_log2, reduce_offsets):
        self.scale_log2 = scale_log2
        self.offsets = reduce_offsets
        self.row_max = cute.make_rmem_tensor(num_rows, cutlass.Float32)
        self.row_sum = cute.make_rmem_tensor(num_rows, cutlass.Float32)
        self.row_max.fill(-cutlass.Float32.inf)
        self.row_sum.fill(0.0)

    @cute.jit
    def step(self, acc_S_mn: cute.Tensor, acc_O_mn: cute.Tensor, is_first: cutlass.Constexpr):
        """Turn this round's scores into weights in place and rescale O and the row sums."""
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            row = acc_S_mn[r, None].load()
            m_prev = self.row_max[r]
            m_cur = row.reduce(cute.ReductionOp.MAX, m_prev, 0)
            m_cur = quad_allreduce(m_cur, self.offsets, _max)
            # a row that has seen only masked keys keeps max -inf: use 0 as its base
            m_base = 0.0 if m_cur == -cutlass.Float32.inf else m_cur
            m_scaled = m_base * self.scale_log2
            p = cute.math.exp2(row * self.scale_log2 - m_scaled, fastmath=True)
            row_sum = p.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0)
            if cutlass.const_expr(not is_first):
                alpha = cute.math.exp2(m_prev * self.scale_log2 - m_scaled, fastmath=True)
                row_sum = row_sum + self.row_sum[r] * alpha
                acc_O_mn[r, None] = acc_O_mn[r, None].load() * alpha
            self.row_max[r] = m_cur
            self.row_sum[r] = row_sum
            acc_S_mn[r, None] = p

    @cute.jit
    def finalize(self, acc_O_mn: cute.Tensor, lse: cute.Tensor):
        """Divide O by the full row sums; write each row's natural-log LSE into `lse`.

        A row with no visible key has sum 0: its O stays 0 and its LSE is -inf.
        """
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            total = quad_allreduce(self.row_sum[r], self.offsets, _add)
            empty = total == 0.0
            inv = 0.0 if empty else cute.arch.rcp_approx(total)
            acc_O_mn[r, None] = acc_O_mn[r, None].load() * inv
            lse[r] = (-cutlass.Float32.inf if empty else
                      (self.row_max[r] * self.scale_log2 + cute.math.log2(total, fastmath=True)) * LN2)
