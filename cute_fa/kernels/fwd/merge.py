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
            acc, total, lse_max = merge_parts(
                lambda p: cute.local_tile(mOp[p, b, s, h, None], (VEC,), (v,)),
                lambda p: mLSEp[p, b, h, s], mOp.shape[0])
            store_merged(acc, total, lambda: cute.local_tile(mO[b, s, h, None], (VEC,), (v,)),
                         self.out_dtype)
            if write_lse != 0 and v == 0:
                mLSE[b, h, s] = merged_lse(total, lse_max)


@cute.jit
def merge_parts(o_part: cutlass.Constexpr, lse_part: cutlass.Constexpr, parts):
    """One thread's VEC columns of a query row, merged over `parts` parts: o_part(p) is part
    p's (VEC,) slice of O (any float type), lse_part(p) its LSE. Returns (acc, total,
    lse_max): the unnormalised sum of the parts' O weighted by exp(lse_p - lse_max), float32
    in registers, the sum of those weights, and the largest LSE (-inf where every part saw
    nothing). Both split-KV merges use it: the merge kernel and the split kernel's last CTA of
    a query block (`FlashFwdSm80`'s fused_merge)."""
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
        lse_p = lse_part(p)
        rOp.store(o_part(p).load().to(cutlass.Float32))
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
    return acc, total, lse_max


@cute.jit
def store_merged(acc, total, out_slice: cutlass.Constexpr, dtype: cutlass.Constexpr):
    """`merge_parts`' result, normalised, in `dtype`, into out_slice() (the thread's (VEC,)
    slice of the output row; a function, so that its address is computed after the
    normalisation, the order the merge kernel was compiled in): zeros for a row whose parts all
    saw nothing, as a forward row with no visible key."""
    inv = cutlass.Float32(0.0)
    if total > 0.0:
        inv = 1.0 / total
    rO = cute.make_rmem_tensor(VEC, dtype)
    rO.store((acc.load() * inv).to(dtype))
    cute.autovec_copy(rO, out_slice())


@cute.jit
def merged_lse(total, lse_max):
    """The merged row's LSE from `merge_parts`' result: -inf where every part saw nothing."""
    lse = -cutlass.Float32.inf
    if total > 0.0:
        lse = lse_max + cute.math.log(total, fastmath=True)
    return lse


@cute.jit
def merge_if_last(cfg: cutlass.Constexpr, rows: cutlass.Constexpr, tile, seqlen_q,
                  mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                  write_lse, mCounters: cute.Tensor, num_splits, batch_size, sFlag: cute.Tensor,
                  tidx):
    """Split-KV in one kernel (`Sm80Key.fused_merge`): called by every CTA of the split kernel
    after it has stored its float32 partials (mOp (splits x batch, seqlen_q, heads, head_dim),
    mLSEp (splits x batch, heads, seqlen_q), entry split * batch_size + batch). The CTAs of one
    query block count themselves in on their block's counter in mCounters; the one that finds
    num_splits - 1 there is the last, reads every split's partials of its tile's rows and
    writes their merge into mO (the call's output) and, where write_lse, mLSE, then puts the
    counter back to zero for the stream's next launch. sFlag: one int32 of shared memory that
    no thread reads or writes any more (the last-CTA answer is told the CTA through it).

    Ordering: each thread's partial stores are fenced (GPU scope) before the barrier behind
    which thread 0 adds to the counter (acquire-release), and the last CTA fences again after
    the barrier that tells it so, so that its loads see every other CTA's stores."""
    cute.arch.fence_acq_rel_gpu()
    cute.arch.barrier()
    if tidx == 0:
        bx, by, _ = cute.arch.block_idx()
        gx, gy, _ = cute.arch.grid_dim()
        counter = mCounters.iterator + (tile.batch * gy + by) * gx + bx
        old = cute.arch.atomic_add(counter, cutlass.Int32(1), sem="acq_rel", scope="gpu")
        last = cutlass.Int32(0)
        if old == num_splits - 1:
            last = cutlass.Int32(1)
            cute.arch.store(counter, cutlass.Int32(0), sem="relaxed", scope="gpu")
        sFlag[0] = last
    cute.arch.barrier()
    if sFlag[0] != 0:
        cute.arch.fence_acq_rel_gpu()
        threads_per_row = cfg.head_dim // VEC
        rows_per_pass = cfg.num_threads // threads_per_row
        local_row = tidx // threads_per_row
        v = tidx % threads_per_row
        row_base = tile.m_block * cfg.block_m
        rows_here = cutlass.min(rows.count(seqlen_q) - row_base, cfg.block_m)
        for r0 in cutlass.range(0, rows_here, rows_per_pass):
            if local_row < rows_per_pass and r0 + local_row < rows_here:
                o_row = row_base + r0 + local_row
                query, head = rows.query(o_row), rows.head(tile.head, o_row)
                acc, total, lse_max = merge_parts(
                    lambda p: cute.local_tile(mOp[p * batch_size + tile.batch, query, head,
                                                  None], (VEC,), (v,)),
                    lambda p: mLSEp[p * batch_size + tile.batch, head, query], num_splits)
                store_merged(acc, total, lambda: cute.local_tile(
                    mO[tile.batch, query, head, None], (VEC,), (v,)), mO.element_type)
                if write_lse != 0 and v == 0:
                    mLSE[tile.batch, head, query] = merged_lse(total, lse_max)
