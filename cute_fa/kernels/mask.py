"""Where the causal mask is applied, and which query block, heads and key blocks a CTA visits.

The rule of which key a query sees is `cute_fa.visibility` (shared with the reference and the
introspection); this module applies it to a CTA's work and to its S accumulator.
"""

import cutlass
import cutlass.cute as cute

from ..visibility import last_visible_key


def block_coords(causal: bool):
    """(query block, head, batch) of this CTA. Under causal masking the grid is walked in
    reverse, so the longest rows (most key blocks) start first: a shorter tail of the wave."""
    m_block, head, batch = cute.arch.block_idx()
    if causal:
        m_block = cute.arch.grid_dim()[0] - 1 - m_block
    return m_block, head, batch


def key_block_count(seqlen_k, m_block, block_m: int, block_n: int, causal_offset, causal: bool):
    """Key blocks query block `m_block` visits (walked from the last one down): all of them,
    or under causal masking those up to the last key its last query sees."""
    n_blocks = (seqlen_k + block_n - 1) // block_n
    if causal:
        last_key = last_visible_key((m_block + 1) * block_m - 1, causal_offset)
        n_blocks = cutlass.min(n_blocks, (cutlass.max(last_key + 1, 0) + block_n - 1) // block_n)
    return n_blocks


def cta_work(seqlen_k, heads_q, heads_kv, block_m: int, block_n: int, causal_offset,
             causal: bool):
    """What this CTA computes: (query block, head, batch, K/V head, key blocks to visit).
    Under GQA/MQA heads_q / heads_kv consecutive query heads read one K/V head."""
    m_block, head, batch = block_coords(causal)
    head_kv = head // (heads_q // heads_kv)
    n_block_max = key_block_count(seqlen_k, m_block, block_m, block_n, causal_offset, causal)
    return m_block, head, batch, head_kv, n_block_max


def masked_round_count(block_m: int, block_n: int, causal: bool) -> int:
    """Key blocks, counted from the last one visited, that may need masking: the sequence
    tail, and under causal every block the diagonal of a block_m-row slab can cross."""
    return (-(-block_m // block_n) + 1) if causal else 1


@cute.jit
def apply_mask(acc_S_mn: cute.Tensor, row_offsets: cutlass.Constexpr, col_offsets: cutlass.Constexpr,
               query0, key0, seqlen_k, causal_offset, causal: cutlass.Constexpr):
    """Set to -inf every score whose key is past seqlen_k or, if causal, in the future.

    acc_S_mn is the S accumulator's (row, col) register view; the score in (r, c) is
    query query0 + row_offsets[r] against key key0 + col_offsets[c], the offsets being
    compile-time constants read from the layout. One limit per row is computed and
    compared with the constant column offsets, so no per-element coordinate stays live.
    -inf, not 0, so that the element weighs nothing in the max, the sum and P@V.
    """
    limit_past_end = seqlen_k - 1 - key0
    for r in cutlass.range_constexpr(len(row_offsets)):
        limit = limit_past_end
        if cutlass.const_expr(causal):
            limit = cutlass.min(
                last_visible_key(query0 + row_offsets[r], causal_offset) - key0, limit_past_end)
        for c in cutlass.range_constexpr(len(col_offsets)):
            if col_offsets[c] > limit:
                acc_S_mn[r, c] = -cutlass.Float32.inf
