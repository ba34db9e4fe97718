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


@cute.jit
def apply_mask(acc_S_mn: cute.Tensor, row_offsets: cutlass.Constexpr, col_offsets: cutlass.Constexpr,
               query0, key0, seqlen_k, causal_offset, causal: cutlass.Constexpr,
               group: cutlass.Constexpr = 1, window_offset=None):
    """Set to -inf every score whose key is past seqlen_k, if causal in the future (past
    query + causal_offset), or with a window_offset before query + window_offset.

    acc_S_mn is the S accumulator's (row, col) register view; the score in (r, c) is
    query query0 + row_offsets[r] against key key0 + col_offsets[c], the offsets being
    compile-time constants read from the layout. One limit per row is computed and
    compared with the constant column offsets, so no per-element coordinate stays live.
    -inf, not 0, so that the element weighs nothing in the max, the sum and P@V.
    With GQA packing (group > 1) row r is query (query0 + row_offsets[r]) // group.
    """
    limit_past_end = seqlen_k - 1 - key0
    for r in cutlass.range_constexpr(len(row_offsets)):
        limit = limit_past_end
        if cutlass.const_expr(causal):
            limit = cutlass.min(
                last_visible_key(QueryRows(group).query(query0 + row_offsets[r]), causal_offset)
                - key0, limit_past_end)
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
def apply_mask_transposed(acc_St_mn: cute.Tensor, row_offsets: cutlass.Constexpr,
                          col_offsets: cutlass.Constexpr, key0, query0, seqlen_k,
                          causal_offset, causal: cutlass.Constexpr, window_offset=None):
    """`apply_mask` for a transposed score tile S^T (rows = keys, columns = queries; the
    Hopper backward's): -inf where the row's key is past seqlen_k, if causal where the
    column's query is before the first query that sees the key, with a window_offset where it
    is past the last one. Per row one or two limits, compared with the constant column
    offsets."""
    for r in cutlass.range_constexpr(len(row_offsets)):
        key = key0 + row_offsets[r]
        past_end = key >= seqlen_k
        for c in cutlass.range_constexpr(len(col_offsets)):
            hidden = past_end
            if cutlass.const_expr(causal):
                hidden = hidden | (col_offsets[c] < first_query_seeing(key, causal_offset)
                                   - query0)
            if cutlass.const_expr(window_offset is not None):
                hidden = hidden | (col_offsets[c] > last_query_seeing(key, window_offset)
                                   - query0)
            if hidden:
                acc_St_mn[r, c] = -cutlass.Float32.inf


@cute.jit
def apply_softcap(acc_S: cute.Tensor, pre_scale):
    """Scores -> tanh(S * softmax_scale / softcap), in place; the softmax's scale is then
    softcap * log2(e), so its weights are exp(softcap * tanh(S * softmax_scale / softcap) -
    max): flash-attn's and Gemma 2's softcap. Before the mask, whose -inf tanh would undo."""
    for i in cutlass.range_constexpr(cute.size(acc_S)):
        acc_S[i] = cute.math.tanh(acc_S[i] * pre_scale, fastmath=True)
