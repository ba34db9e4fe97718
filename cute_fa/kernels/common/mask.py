"""The score transforms between S = Q K^T and the softmax: the softcap, and the mask (the
causal edge, a sliding window's lower edge and the sequence tail).

The rule of which key a query sees is `cute_fa.visibility` (shared with the reference and the
introspection); `apply_mask` applies it to the S accumulator.
"""

import cutlass
import cutlass.cute as cute

from ...visibility import (first_query_seeing, first_visible_key, last_query_seeing,
                           last_visible_key)
from ..sched.seqlen import QueryRows


def run_shape(offsets: tuple):
    """(run, stride) if the constant offsets are runs of `run` consecutive columns every
    `stride` (offset j = stride * (j // run) + j % run), as an MMA accumulator's columns are
    (0, 1, 8, 9, 16, ...: runs of 2 every 8); None otherwise. Such offsets are in order, so
    the ones at most a limit are a prefix, counted in closed form (`count_at_most`)."""
    for run in (1, 2, 4, 8):
        stride = offsets[run] if len(offsets) > run else 8 * run
        if stride >= run and all(o == stride * (j // run) + j % run
                                 for j, o in enumerate(offsets)):
            return run, stride
    return None


def count_at_most(limit, shape: tuple, n: int):
    """How many of n offsets of run_shape `shape` are <= limit (0 ... n): plain arithmetic, on
    Python ints or (inside a kernel) Int32 values."""
    run, stride = shape
    cols = cutlass.max(cutlass.min(limit + 1, stride * (n // run) + n % run), 0)
    return (cols // stride) * run + cutlass.min(cols % stride, run)


def bit_mask_runs(col_offsets: tuple) -> tuple:
    """run_shape of the offsets, which the bit-mask form needs: a ValueError at tracing if the
    accumulator's columns are not runs (a layout the mask was not written for), not a slower
    form chosen silently."""
    shape = run_shape(col_offsets)
    if shape is None:
        raise ValueError(f"the bit-mask form of the mask needs column offsets in runs of "
                         f"1, 2, 4 or 8 at a fixed stride, got {col_offsets}")
    return shape


@cute.jit
def _low_bits(k):
    """A Uint32 whose k low bits are set, k in 0 ... 32 (a shift by 32 is not defined: k = 32
    takes every bit by a select)."""
    ones = cutlass.Uint32(0xFFFFFFFF)
    below = ~(ones << cutlass.Uint32(cutlass.min(k, 31)))
    return ones if k >= 32 else below


@cute.jit
def _mask_row(acc_row, n: cutlass.Constexpr, keep_from, keep_to):
    """-inf in the elements of a row view (n of them, in offset order) outside the prefix
    counts keep_from ... keep_to - 1 (keep_from None: 0): one 32-bit keep mask per 32
    elements, each element's bit tested against a constant, so that the compare per element
    becomes a bit moved to a predicate (R2P) and one select."""
    for chunk in cutlass.range_constexpr((n + 31) // 32):
        lo = chunk * 32
        keep = _low_bits(cutlass.max(cutlass.min(keep_to - lo, 32), 0))
        if cutlass.const_expr(keep_from is not None):
            keep = keep & ~_low_bits(cutlass.max(cutlass.min(keep_from - lo, 32), 0))
        # a select, not `a if cond else b`: on a dynamic condition the latter traces into an
        # scf.if region per element (more tracing and more IR for the same PTX)
        for i in cutlass.range_constexpr(min(32, n - lo)):
            acc_row[lo + i] = cutlass.select_((keep & cutlass.Uint32(1 << i)) != 0,
                                              acc_row[lo + i], -cutlass.Float32.inf)


@cute.jit
def apply_mask(acc_S_mn: cute.Tensor, row_offsets: cutlass.Constexpr, col_offsets: cutlass.Constexpr,
               query0, key0, seqlen_k, causal_offset, causal: cutlass.Constexpr,
               group: cutlass.Constexpr = 1, window_offset=None,
               bitmask: cutlass.Constexpr = False):
    """Set to -inf every score whose key is past seqlen_k, if causal in the future (past
    query + causal_offset), or with a window_offset before query + window_offset.

    acc_S_mn is the S accumulator's (row, col) register view; the score in (r, c) is
    query query0 + row_offsets[r] against key key0 + col_offsets[c], the offsets being
    compile-time constants read from the layout. One limit per row is computed and compared
    with the constant column offsets, so no per-element coordinate stays live. -inf, not 0,
    so that the element weighs nothing in the max, the sum and P@V. With GQA packing
    (group > 1) row r is query (query0 + row_offsets[r]) // group.

    bitmask: each row's limits become a count of its visible columns (`run_shape`) and a
    32-bit keep mask, and every element is written by a select. The default form, a branch
    per element, compiles to chains of selects over the row (about 1,000 FSEL per masked
    round of a 64 x 128 wgmma tile, against 64): the wgmma kernels take the bit mask; the
    mma.sync kernels, at 255 registers, spill with it (up to 100 bytes in ptxas) and keep
    the branches.
    """
    if cutlass.const_expr(bitmask):
        _apply_mask_bits(acc_S_mn, row_offsets, col_offsets, query0, key0, seqlen_k,
                         causal_offset, causal, group, window_offset)
    else:
        limit_past_end = seqlen_k - 1 - key0
        for r in cutlass.range_constexpr(len(row_offsets)):
            limit = limit_past_end
            if cutlass.const_expr(causal):
                limit = cutlass.min(
                    last_visible_key(QueryRows(group).query(query0 + row_offsets[r]),
                                     causal_offset) - key0, limit_past_end)
            if cutlass.const_expr(window_offset is None):
                for c in cutlass.range_constexpr(len(col_offsets)):
                    if col_offsets[c] > limit:
                        acc_S_mn[r, c] = -cutlass.Float32.inf
            else:
                low = first_visible_key(QueryRows(group).query(query0 + row_offsets[r]),
                                        window_offset) - key0
                for c in cutlass.range_constexpr(len(col_offsets)):
                    if col_offsets[c] > limit:
                        acc_S_mn[r, c] = -cutlass.Float32.inf
                    if col_offsets[c] < low:
                        acc_S_mn[r, c] = -cutlass.Float32.inf


@cute.jit
def _apply_mask_bits(acc_S_mn, row_offsets: cutlass.Constexpr, col_offsets: cutlass.Constexpr,
                     query0, key0, seqlen_k, causal_offset, causal: cutlass.Constexpr,
                     group: cutlass.Constexpr, window_offset):
    """`apply_mask`'s bit-mask form: per row, the counts of columns before the window's lower
    edge and up to the causal edge or the sequence's end, then `_mask_row`."""
    shape = bit_mask_runs(col_offsets)
    n = len(col_offsets)
    limit_past_end = seqlen_k - 1 - key0
    for r in cutlass.range_constexpr(len(row_offsets)):
        query = QueryRows(group).query(query0 + row_offsets[r])
        limit = limit_past_end
        if cutlass.const_expr(causal):
            limit = cutlass.min(last_visible_key(query, causal_offset) - key0, limit_past_end)
        keep_from = None
        if cutlass.const_expr(window_offset is not None):
            keep_from = count_at_most(first_visible_key(query, window_offset) - key0 - 1,
                                       shape, n)
        _mask_row(acc_S_mn[r, None], n, keep_from, count_at_most(limit, shape, n))


@cute.jit
def apply_mask_transposed(acc_St_mn: cute.Tensor, row_offsets: cutlass.Constexpr,
                          col_offsets: cutlass.Constexpr, key0, query0, seqlen_k,
                          causal_offset, causal: cutlass.Constexpr, window_offset=None):
    """`apply_mask` for a transposed score tile S^T (rows = keys, columns = queries; the
    Hopper backward's): -inf where the row's key is past seqlen_k, if causal where the
    column's query is before the first query that sees the key, with a window_offset where it
    is past the last one. Per row one or two limits, turned into a keep mask as in
    `apply_mask`'s bit-mask form."""
    shape = bit_mask_runs(col_offsets)
    n = len(col_offsets)
    for r in cutlass.range_constexpr(len(row_offsets)):
        key = key0 + row_offsets[r]
        keep_from = None
        keep_to = n - (n + 1) * cutlass.Int32(key >= seqlen_k)  # past the end: keep none
        if cutlass.const_expr(causal):
            keep_from = count_at_most(first_query_seeing(key, causal_offset) - query0 - 1,
                                       shape, n)
        if cutlass.const_expr(window_offset is not None):
            keep_to = cutlass.min(keep_to, count_at_most(
                last_query_seeing(key, window_offset) - query0, shape, n))
        _mask_row(acc_St_mn[r, None], n, keep_from, keep_to)


@cute.jit
def apply_softcap(acc_S: cute.Tensor, pre_scale):
    """Scores -> tanh(S * softmax_scale / softcap), in place; the softmax's scale is then
    softcap * log2(e), so its weights are exp(softcap * tanh(S * softmax_scale / softcap) -
    max): flash-attn's and Gemma 2's softcap. Before the mask, whose -inf tanh would undo."""
    for i in cutlass.range_constexpr(cute.size(acc_S)):
        acc_S[i] = cute.math.tanh(acc_S[i] * pre_scale, fastmath=True)
