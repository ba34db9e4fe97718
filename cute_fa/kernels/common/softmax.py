"""Online softmax on the accumulator's row view, in registers (FlashAttention-2 Algorithm 1).

The convention of docs/walkthrough.md §10: row_max holds the max of raw scores (before
the scale); weights are exp2(S * scale_log2 - row_max * scale_log2), with
scale_log2 = softmax_scale * log2(e) folded into one FFMA per element.
Each thread keeps its partial row sums across K/V rounds; they are combined
across the quad once, at the end (the rescale factors are equal within a quad).

Lazy rescale (`lazy_threshold`, in log2 units): a row keeps its stale max, and O is
not rescaled, while the true max has grown by at most the threshold; the weights
are then at most 2^threshold, harmless in fp32 sums and in fp16/bf16 P. With 8, O is
rescaled once the pending factor would drop below 2^-8. The
skip is decided per warp (one vote per round), so the branch around the O multiply is
uniform.
"""

import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from .mods import logit_factor

LN2 = math.log(2.0)
LOG2_E = math.log2(math.e)  # the kernels pass softmax_scale * LOG2_E as scale_log2


def score_scales(has_softcap: bool, softmax_scale, softcap, score_mod=None) -> tuple:
    """(scale_log2 of the softmax, the scores' pre-scale or None), for every kernel that
    computes the softmax's weights: with a softcap the scores are tanh(S * softmax_scale /
    softcap) and the softmax scale softcap * log2(e); with a score_mod (its graph) they are
    score_mod(S * softmax_scale, ...) but for the constant factor of its result, which the
    softmax scale takes instead, log2(e) times it (`mods.logit_factor`; 1 for most mods)."""
    if has_softcap:
        return softcap * LOG2_E, softmax_scale / softcap
    if score_mod is not None:
        return cutlass.Float32(LOG2_E * logit_factor(score_mod)), softmax_scale
    return softmax_scale * LOG2_E, None


def quad_allreduce(value, offsets, op):
    """All-reduce one float across the lanes that share an accumulator row."""
    for off in offsets:
        value = op(value, cute.arch.shuffle_sync_bfly(value, offset=off, mask=-1, mask_and_clamp=31))
    return value


def _max(a, b):
    return cute.arch.fmax(a, b)


def _add(a, b):
    return a + b


@dataclass(frozen=True)
class RowScale:
    """What one round of the online softmax asks of O: alphas[r] multiplies row r; growth is
    the largest max increase of the thread's rows (log2 units), for the lazy rule."""

    alphas: tuple
    growth: object = None


class OnlineSoftmax:
    def __init__(self, num_rows: int, scale_log2, reduce_offsets, lazy_threshold=None):
        self.scale_log2 = scale_log2
        self.lazy_threshold = lazy_threshold
        self.offsets = reduce_offsets
        self.row_max = cute.make_rmem_tensor(num_rows, cutlass.Float32)
        self.row_sum = cute.make_rmem_tensor(num_rows, cutlass.Float32)
        self.row_max.fill(-cutlass.Float32.inf)
        self.row_sum.fill(0.0)

    @cute.jit
    def step(self, acc_S_mn: cute.Tensor):
        """Turn this round's scores into weights in place, update the row max and sums, and
        return the factor O's rows must be multiplied by (`rescale_O`), which the kernel
        schedules where it fits (an O still being accumulated cannot be rescaled yet).

        The first round needs no special case: its rescale factor exp2(-inf) is 0, on an
        O and row sums of 0."""
        lazy = self.lazy_threshold is not None
        alphas = []
        growth = None
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            row = acc_S_mn[r, None].load()
            m_prev = self.row_max[r]
            m_cur = row.reduce(cute.ReductionOp.MAX, m_prev, 0)
            m_cur = quad_allreduce(m_cur, self.offsets, _max)
            if cutlass.const_expr(lazy):
                # a first visible key after -inf grows by inf: taken. Still all -inf (nan):
                # kept, which changes nothing (O and the sum are 0, alpha is 0).
                g = (m_cur - m_prev) * self.scale_log2
                m_cur = m_cur if g > self.lazy_threshold else m_prev
                growth = g if r == 0 else cute.arch.fmax(growth, g)
            # a row that has seen only masked keys keeps max -inf: use 0 as its base
            m_base = 0.0 if m_cur == -cutlass.Float32.inf else m_cur
            m_scaled = m_base * self.scale_log2
            p = cute.math.exp2(row * self.scale_log2 - m_scaled, fastmath=True)
            row_sum = p.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0)
            alpha = cute.math.exp2(m_prev * self.scale_log2 - m_scaled, fastmath=True)
            row_sum = row_sum + self.row_sum[r] * alpha
            alphas.append(alpha)  # 1 for a row that kept its (stale) max
            self.row_max[r] = m_cur
            self.row_sum[r] = row_sum
            acc_S_mn[r, None] = p
        return RowScale(tuple(alphas), growth)

    @cute.jit
    def rescale_O(self, acc_O_mn: cute.Tensor, scale: RowScale):
        """O's rows times this round's factors. Lazy: only if some row of the warp moved its
        max, a warp-uniform branch (one vote), since most late rounds move none."""
        if cutlass.const_expr(self.lazy_threshold is not None):
            if cute.arch.vote_any_sync(scale.growth > self.lazy_threshold):
                for r in cutlass.range_constexpr(cute.size(self.row_max)):
                    acc_O_mn[r, None] = acc_O_mn[r, None].load() * scale.alphas[r]
        else:
            for r in cutlass.range_constexpr(cute.size(self.row_max)):
                acc_O_mn[r, None] = acc_O_mn[r, None].load() * scale.alphas[r]

    @cute.jit
    def absorb_sink(self, acc_O_mn: cute.Tensor, sink_log2: tuple, share):
        """One more key per row r, of logit sink_log2[r] (log2 units: the softmax's scale
        applied) and value 0: an attention sink (gpt-oss), which only adds to the softmax's
        denominator. As a round of `step`: the row's max moves up to the sink where it is
        larger, O and the sum rescale, and the thread adds `share` of the sink's weight (the
        lanes and warps that hold parts of one row add up to one share; 0 where the sink
        counts elsewhere, a split-KV call's other splits). A row that saw no key keeps O = 0
        and gets LSE = the sink's logit (or -inf with share 0)."""
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            m_prev = self.row_max[r] * self.scale_log2
            m_new = cute.arch.fmax(m_prev, sink_log2[r])
            alpha = cute.math.exp2(m_prev - m_new, fastmath=True)
            self.row_sum[r] = self.row_sum[r] * alpha + share * cute.math.exp2(
                sink_log2[r] - m_new, fastmath=True)
            acc_O_mn[r, None] = acc_O_mn[r, None].load() * alpha
            self.row_max[r] = m_new / self.scale_log2

    def quad_total(self, r):
        """Row r's sum over every key this warp saw: the thread's partial sum, all-reduced
        across the lanes that share the row."""
        return quad_allreduce(self.row_sum[r], self.offsets, _add)

    @cute.jit
    def finalize(self, acc_O_mn: cute.Tensor, lse: cute.Tensor):
        """Divide O by the full row sums; write each row's natural-log LSE into `lse`.

        A row with no visible key has sum 0: its O stays 0 and its LSE is -inf.
        """
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            total = self.quad_total(r)
            empty = total == 0.0
            inv = 0.0 if empty else cute.arch.rcp_approx(total)
            acc_O_mn[r, None] = acc_O_mn[r, None].load() * inv
            lse[r] = (-cutlass.Float32.inf if empty else
                      (self.row_max[r] * self.scale_log2 + cute.math.log2(total, fastmath=True)) * LN2)
