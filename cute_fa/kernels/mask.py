"""Which keys a query may see: the one rule shared by the kernels and the host side.

causal_offset = Sk - Sq aligns the bottom-right corner (flash-attn's causal);
causal_offset = 0 is the top-left alignment of the walkthrough and of torch SDPA.
`last_visible_key` is plain integer arithmetic, so it runs on Python ints and numpy
arrays (reference, introspection) and on DSL Int32 values inside a kernel alike.
"""

import cutlass
import cutlass.cute as cute


def last_visible_key(query, causal_offset):
    """Under causal masking, query `query` sees keys 0 .. query + causal_offset."""
    return query + causal_offset


def key_visible(query, key, *, causal: bool, causal_offset=0):
    """True where key `key` contributes to query `query` (global positions)."""
    if not causal:
        return True
    return key <= last_visible_key(query, causal_offset)


@cute.jit
def apply_mask(acc_S_mn: cute.Tensor, tScS_mn: cute.Tensor, key_base, query_base, seqlen_k,
               causal_offset, causal: cutlass.Constexpr):
    """Set to -inf every score whose key is past seqlen_k or, if causal, in the future.

    acc_S_mn is the S accumulator's (row, col) register view and tScS_mn the same
    view of the identity tensor (tile-local (query, key) of each slot). -inf, not 0,
    so that the element weighs nothing in the max, the sum and P@V.
    """
    for c in cutlass.range_constexpr(cute.size(tScS_mn.shape[1])):
        key = key_base + tScS_mn[0, c][1]
        for r in cutlass.range_constexpr(cute.size(tScS_mn.shape[0])):
            if cutlass.const_expr(causal):
                limit = cutlass.min(
                    last_visible_key(query_base + tScS_mn[r, 0][0], causal_offset), seqlen_k - 1
                )
                if key > limit:
                    acc_S_mn[r, c] = -cutlass.Float32.inf
            else:
                if key >= seqlen_k:
                    acc_S_mn[r, c] = -cutlass.Float32.inf
