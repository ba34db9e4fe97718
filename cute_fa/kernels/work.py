"""How the work is split: which query block, head, batch entry and key split a CTA computes and
the launch grid (`SingleTileScheduler`), how the tile's rows map to queries and heads
(`QueryRows`: one head, or the query heads of a GQA group packed together), the query and key
lengths of one batch entry (`SeqlenInfo`), and which key blocks a query block visits
(`BlockInfo`). The kernels take their tile, lengths and key-block range from these objects, so
ragged batches (per-entry offsets and lengths), a sliding window (a key range with a lower end)
and persistent CTAs (a loop over tiles) each change one of them.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from ..visibility import last_visible_key


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
class QueryRows:
    """How a tile's rows map to (query, query head). Without packing (group 1) row r is query r
    of the CTA's head. With GQA packing the `group` query heads that share a K/V head are
    processed in one tile, so K and V are read once per group: row r is query r // group of
    head head0 + r % group, and a tile row's address is no longer affine in r (the kernels
    shift a base row's pointer per row)."""

    group: int = 1

    def count(self, seqlen_q):
        """Rows of the packed index space: every (query, head) pair of the group."""
        return seqlen_q * self.group if self.group > 1 else seqlen_q

    def query(self, row):
        return row // self.group if self.group > 1 else row

    def head(self, head0, row):
        return head0 + row % self.group if self.group > 1 else head0

    def offset(self, row, base_row, stride_seq, stride_head):
        """Element offset from the address of (query base_row, head0) to that of `row`: what a
        copy built on an affine tile adds to its row `base_row` to reach packed row `row`."""
        return (self.query(row) - base_row) * stride_seq + (row % self.group) * stride_head


@dataclass(frozen=True)
class SingleTileScheduler:
    """One CTA per (query block, query head or GQA group, batch entry[, key split]). Under causal
    masking the query blocks are handed out last first: the longest rows (most key blocks)
    start first, which shortens the tail of the last wave. With split-KV the grid's z is
    split * batch + batch entry, the index of the CTA's partial outputs."""

    block_m: int
    causal: bool
    group: int = 1
    split_kv: bool = False

    def grid(self, seqlen_q, heads_q, batch, num_splits=None) -> tuple:
        """The launch grid (host side, while the kernel is traced)."""
        if self.group == 1 and not self.split_kv:
            return (cute.ceil_div(seqlen_q, self.block_m), cute.size(heads_q), cute.size(batch))
        rows = QueryRows(self.group).count(seqlen_q)
        heads = heads_q // self.group if self.group > 1 else heads_q
        z = batch * num_splits if self.split_kv else batch
        return (cute.ceil_div(rows, self.block_m), cute.size(heads), cute.size(z))

    def tile(self, heads_q, heads_kv, batch_size=None) -> WorkTile:
        """This CTA's tile. Under GQA/MQA heads_q / heads_kv consecutive query heads read one
        K/V head; packed, the grid's y is that K/V head."""
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


@dataclass(frozen=True)
class SeqlenInfo:
    """The query and key lengths of one batch entry. The key length is the tensor's (dense),
    the page table's capacity (paged), or `seqused_k[batch]` (a cache with room to grow);
    ragged batches (cu_seqlens) change this object."""

    seqlen_q: object
    seqlen_k: object


@dataclass(frozen=True)
class BlockInfo:
    """Which key blocks a query block visits: all of them, or under causal masking those up
    to the last key its last query sees (`cute_fa.visibility`); with split-KV, the share of
    those of one split. Rounds walk them from the last one down, so the blocks that need
    masking come first."""

    block_m: int
    block_n: int
    causal: bool
    group: int = 1

    def n_block_max(self, seqlen: SeqlenInfo, m_block, causal_offset):
        n_blocks = (seqlen.seqlen_k + self.block_n - 1) // self.block_n
        if self.causal:
            last_row = (m_block + 1) * self.block_m - 1
            last_key = last_visible_key(QueryRows(self.group).query(last_row), causal_offset)
            n_blocks = cutlass.min(n_blocks,
                                   (cutlass.max(last_key + 1, 0) + self.block_n - 1) // self.block_n)
        return n_blocks

    @staticmethod
    def split_range(n_blocks, split, num_splits):
        """Key blocks [lo, hi) of split `split` out of `num_splits`: equal shares of the query
        block's n_blocks, the last ones short or empty."""
        per_split = (n_blocks + num_splits - 1) // num_splits
        lo = cutlass.min(split * per_split, n_blocks)
        return lo, cutlass.min(lo + per_split, n_blocks)

    def masked_rounds(self) -> int:
        """Key blocks, counted from the last visible one down, that may need masking: the
        sequence tail, and under causal every block the diagonal of a block_m-row slab can
        cross (with packing the slab spans fewer queries, so this stays an upper bound)."""
        return (-(-self.block_m // self.block_n) + 1) if self.causal else 1
