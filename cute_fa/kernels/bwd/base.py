"""What the backward kernels share (`sm80.py`, `sm90.py`): which query blocks a key block's CTA
visits, which of those tiles need the mask, and the deterministic mode's turn order of the CTAs
adding into one query block's dQ sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from ...layouts import bwd as bwd_layouts
from ..sched.seqlen import SeqlenInfo


@dataclass(frozen=True)
class QueryBlocks:
    """The query blocks a key block's CTA visits, [m_lo, m_hi), and the edges of the keys its
    rows see: `upper` (causal: key <= query + upper) and `window_offset` (a window's lower
    edge: key >= query + window_offset; None without one)."""

    m_lo: object
    m_hi: object
    upper: object
    window_offset: object = None


class FlashBwdBase:
    """Built from a backward kernel key (`compile.keys.BwdKey`, `BwdSm90Key`)."""

    def __init__(self, key):
        self.cfg = key.tile
        self.causal = key.causal
        self.local = key.local
        self.softcap = key.softcap
        self.varlen_q = key.varlen_q
        self.varlen_k = key.varlen_k
        self.deterministic = key.deterministic
        self.ctas_per_sm = key.ctas_per_sm
        self.dq_vector = bwd_layouts.dq_vector(key.arch)

    @cute.jit
    def _query_blocks(self, n_block, seqlen: SeqlenInfo, causal_offset, window_left,
                      window_right) -> QueryBlocks:
        """The query blocks whose rows see a key of key block n_block: from the first query
        whose upper edge reaches the block's first key, to the last query whose lower edge
        is at or below its last key (the forward's `BlockInfo` rule turned around)."""
        bm, bn = self.cfg.block_m, self.cfg.block_n
        upper = causal_offset
        window_offset = None
        m_hi = cute.ceil_div(seqlen.seqlen_q, bm)
        if cutlass.const_expr(self.local):
            window_offset = causal_offset - window_left
            upper = causal_offset + window_right
            last_query = (n_block + 1) * bn - 1 - window_offset
            m_hi = cutlass.min(m_hi, cutlass.max(last_query + bm, 0) // bm)
        m_lo = 0
        if cutlass.const_expr(self.causal):
            m_lo = cutlass.max(n_block * bn - upper, 0) // bm
        return QueryBlocks(m_lo, m_hi, upper, window_offset)

    @cute.jit
    def _masked(self, m_block, n_block, blocks: QueryBlocks, seqlen: SeqlenInfo):
        """Whether the (m_block, n_block) tile holds a score the mask removes: a key past
        seqlen_k, one above a row's causal edge or below its window's lower edge."""
        bm, bn = self.cfg.block_m, self.cfg.block_n
        masked = (n_block + 1) * bn > seqlen.seqlen_k
        if cutlass.const_expr(self.causal):
            masked = masked | ((n_block + 1) * bn - 1 - m_block * bm > blocks.upper)
        if cutlass.const_expr(self.local):
            masked = masked | (n_block * bn - ((m_block + 1) * bm - 1) < blocks.window_offset)
        return masked

    @cute.jit
    def _turn(self, m_block, n_block, blocks: QueryBlocks, seqlen: SeqlenInfo):
        """deterministic: this key block's place among those adding into query block m_block.
        Causal: from the last key block down (the block on the diagonal starts its rows, so a
        CTA reaching its first query block never waits); else from the first key block up.
        Either way a CTA waits only for CTAs the grid starts before it (`kernel`)."""
        bm, bn = self.cfg.block_m, self.cfg.block_n
        if cutlass.const_expr(self.causal):
            last_key = (m_block + 1) * bm - 1 + blocks.upper
            n_last = cutlass.min(cute.ceil_div(seqlen.seqlen_k, bn),
                                 cutlass.max(last_key + 1 + bn - 1, 0) // bn) - 1
            return n_last - n_block
        if cutlass.const_expr(self.local):
            return n_block - cutlass.max(m_block * bm + blocks.window_offset, 0) // bn
        return n_block


@dataclass(frozen=True)
class RowData:
    """One query head's per-row inputs of this entry: LSE and D (seqlen,); dQaccum (all of it:
    `layouts.bwd.dq_accum_chunk` finds the head's blocks) and the head."""

    lse: object
    d: object
    dq_accum: object
    head: object
