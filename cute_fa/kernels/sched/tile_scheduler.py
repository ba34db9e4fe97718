"""The tile scheduler: which query block, head, batch entry and key split a CTA computes, and the
launch grid. Every forward kernel takes its `WorkTile` from here."""

from dataclasses import dataclass

import cutlass.cute as cute

from .seqlen import QueryRows


@dataclass(frozen=True)
class WorkTile:
    """One CTA's share: query block `m_block` of query head `head` (with GQA packing: of the
    group whose first query head is `head`) of batch entry `batch`, reading K/V head `head_kv`;
    with split-KV, key split `split`, whose partial results go to entry `out_batch` of the
    (split, batch)-flattened outputs."""

    m_block: object
    head: object
    batch: object
    head_kv: object
    split: object = 0
    out_batch: object = None



@dataclass(frozen=True)
class SingleTileScheduler:
    """One CTA per (query block, query head or GQA group, batch entry[, key split]). Under causal
    masking the query blocks are handed out last first: the longest rows (most key blocks)
    start first, which shortens the tail of the last wave. lpt (longest processing time
    first): the grid's x is the head and y the query block, so that the GPU, which starts
    CTAs in x-fastest order, starts every head's longest query blocks before any head's
    shorter ones (without it, only within a head). With split-KV the grid's z is
    split * batch + batch entry, the index of the CTA's partial outputs."""

    block_m: int
    causal: bool
    group: int = 1
    split_kv: bool = False
    lpt: bool = False

    def grid(self, seqlen_q, heads_q, batch, num_splits=None) -> tuple:
        """The launch grid (host side, while the kernel is traced)."""
        if self.lpt:
            return (cute.size(heads_q), cute.ceil_div(seqlen_q, self.block_m), cute.size(batch))
        if self.group == 1 and not self.split_kv:
            return (cute.ceil_div(seqlen_q, self.block_m), cute.size(heads_q), cute.size(batch))
        rows = QueryRows(self.group).count(seqlen_q)
        heads = heads_q // self.group if self.group > 1 else heads_q
        z = batch * num_splits if self.split_kv else batch
        return (cute.ceil_div(rows, self.block_m), cute.size(heads), cute.size(z))

    def tile(self, heads_q, heads_kv, batch_size=None) -> WorkTile:
        """This CTA's tile. Under GQA/MQA heads_q / heads_kv consecutive query heads read one
        K/V head; packed, the grid's y is that K/V head."""
        if self.lpt:
            head, m_block, batch = cute.arch.block_idx()
            m_block = cute.arch.grid_dim()[1] - 1 - m_block
            return WorkTile(m_block, head, batch, head // (heads_q // heads_kv))
        m_block, head, batch = cute.arch.block_idx()
        if self.causal:
            m_block = cute.arch.grid_dim()[0] - 1 - m_block
        if self.group == 1 and not self.split_kv:
            return WorkTile(m_block, head, batch, head // (heads_q // heads_kv))
        head_kv = head if self.group > 1 else head // (heads_q // heads_kv)
        head0 = head * self.group if self.group > 1 else head
        if self.split_kv:
            return WorkTile(m_block, head0, batch % batch_size, head_kv, batch // batch_size,
                            batch)
        return WorkTile(m_block, head0, batch, head_kv)
