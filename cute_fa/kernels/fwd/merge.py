"""Merging attention over disjoint key sets (split-KV's second kernel, and
`cute_fa.merge_attention`).

Part p of a query row saw keys K_p and gives o_p (normalised over K_p) and lse_p = log of its
softmax denominator. Over the union, with m = max_p lse_p and w_p = exp(lse_p - m):

    o = sum_p w_p o_p / sum_p w_p,      lse = m + log(sum_p w_p)

exactly (the softmax of the union, regrouped). A part with lse_p = -inf saw no key and
weighs nothing: it is skipped, so whatever its o_p holds cannot leak in; a row whose parts all
saw nothing gets o = 0 and lse = -inf, like a forward row with no visible key.

Each thread owns VEC consecutive head_dim columns of one row; a CTA of THREADS threads
covers THREADS // (head_dim / VEC) rows. Rows are (batch, query, head) in the output's order
(head fastest), so a warp's stores are contiguous for a dense output.
"""

import math

import cutlass
import cutlass.cute as cute

from ...layouts._types import cutlass_dtype
from ..common.softmax import LOG2_E

THREADS = 128
VEC = 4
UNROLL = 8


class MergeAttention:
    """Built from a `compile.keys.MergeKey`: head_dim and the dtypes are static."""

    def __init__(self, key):
        if key.head_dim % VEC or not VEC <= key.head_dim <= VEC * THREADS:
            raise ValueError(f"head_dim must be a multiple of {VEC} up to {VEC * THREADS}, "
                             f"got {key.head_dim}")
        self.head_dim = key.head_dim
        self.out_dtype = cutlass_dtype(key.out_dtype)
        self.threads_per_row = key.head_dim // VEC
        self.rows_per_cta = THREADS // self.threads_per_row

    @cute.jit
    def __call__(self, mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 write_lse: cutlass.Int32, stream):
        rows = mO.shape[0] * mO.shape[1] * mO.shape[2]
        grid = (cute.ceil_div(rows, self.rows_per_cta), 1, 1)
        self.kernel(mOp, mLSEp, mO, mLSE, write_lse).launch(grid=grid, block=(THREADS, 1, 1),
                                                            stream=stream)

    @cute.kernel
    def kernel(self, mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               write_lse: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        local_row = tidx // self.threads_per_row
        v = tidx % self.threads_per_row
        row = bidx * self.rows_per_cta + local_row
        batch, seqlen, heads = mO.shape[0], mO.shape[1], mO.shape[2]
        if local_row < self.rows_per_cta and row < batch * seqlen * heads:
            h = row % heads
            bs = row // heads
            s = bs % seqlen
            b = bs // seqlen
            parts = mOp.shape[0]
            # one pass, online (the running max and the sum rescaled as the max grows), every
            # part's loads unconditional: unrolled, UNROLL parts' loads are in flight at once
            # (split-KV at batch 1 merges 16-128 parts per row: a memory latency per part, or
            # a branch per part, would cost microseconds)
            lse_max = -cutlass.Float32.inf
            total = cutlass.Float32(0.0)
            acc = cute.make_rmem_tensor(VEC, cutlass.Float32)
            acc.fill(0.0)
            rOp = cute.make_rmem_tensor(VEC, cutlass.Float32)
            for p in cutlass.range(0, parts, 1, unroll=UNROLL):
                lse_p = mLSEp[p, b, h, s]
                rOp.store(cute.local_tile(mOp[p, b, s, h, None], (VEC,), (v,)).load()
                          .to(cutlass.Float32))
                new_max = cute.arch.fmax(lse_max, lse_p)
                base = 0.0 if new_max == -cutlass.Float32.inf else new_max
                scale = cute.math.exp2((lse_max - base) * LOG2_E, fastmath=True)
                w = cute.math.exp2((lse_p - base) * LOG2_E, fastmath=True)
                live = lse_p != -cutlass.Float32.inf
                total = total * scale + w
                for i in cutlass.range_constexpr(VEC):
                    # a part that saw no key adds nothing, whatever its o_p holds
                    acc[i] = acc[i] * scale + (rOp[i] * w if live else 0.0)
                lse_max = new_max
            inv = cutlass.Float32(0.0)
            if total > 0.0:
                inv = 1.0 / total
            rO = cute.make_rmem_tensor(VEC, self.out_dtype)
            rO.store((acc.load() * inv).to(self.out_dtype))
            cute.autovec_copy(rO, cute.local_tile(mO[b, s, h, None], (VEC,), (v,)))
            if write_lse != 0 and v == 0:
                lse = -cutlass.Float32.inf
                if total > 0.0:
                    lse = lse_max + cute.math.log(total, fastmath=True)
                mLSE[b, h, s] = lse
