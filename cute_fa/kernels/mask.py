"""Where the causal mask and the sequence tail are applied to a round's scores.

The rule of which key a query sees is `cute_fa.visibility` (shared with the reference and the
introspection); this module applies it to the S accumulator. It is the one score transform
between S = Q K^T and the softmax; another (a softcap, a window's lower edge) goes beside it.
"""

import cutlass
import cutlass.cute as cute

from ..visibility import last_visible_key
from .work import QueryRows


@cute.jit
def apply_mask(acc_S_mn: cute.Tensor, row_offsets: cutlass.Constexpr, col_offsets: cutlass.Constexpr,
               query0, key0, seqlen_k, causal_offset, causal: cutlass.Constexpr,
               group: cutlass.Constexpr = 1):
    """Set to -inf every score whose key is past seqlen_k or, if causal, in the future.

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
        for c in cutlass.range_constexpr(len(col_offsets)):
            if col_offsets[c] > limit:
                acc_S_mn[r, c] = -cutlass.Float32.inf
