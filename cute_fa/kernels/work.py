"""How the work is split: which query block, head, batch entry and key split a CTA computes and
the launch grid (`SingleTileScheduler`), how the tile's rows map to queries and heads
(`QueryRows`: one head, or the query heads of a GQA group packed together), the query and key
lengths of one batch entry (`SeqlenInfo`), and which key blocks a query block visits
(`BlockInfo`). The kernels take their tile, lengths and key-block range from these objects:
ragged batches (cu_seqlens) are per-entry offsets and lengths in `SeqlenInfo`, a sliding
window is a key range with a lower end in `BlockInfo`.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from ..visibility import first_visible_key, last_visible_key


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


def shifted(t: cute.Tensor, offset) -> cute.Tensor:
    """`t` moved by `offset` elements, a multiple of 8 (16 bytes: the offsets are sums of
    strides that the kernels' arguments guarantee to be multiples of 8), so 16-byte copies
    stay legal. How the kernels reach a row that is not affine in its index: a GQA-packed
    row, a key in a page, a ragged batch entry's first row."""
    return cute.make_tensor(t.iterator + cute.assume(offset, divby=8), t.layout)


@dataclass(frozen=True)
class SeqlenInfo:
    """The query and key lengths of one batch entry, and in a ragged batch where its rows
    start. The key length is the tensor's (dense), the page table's capacity (paged),
    `cu_seqlens_k[b + 1] - cu_seqlens_k[b]` (ragged) or `seqused_k[batch]` (a cache with room
    to grow). Ragged (varlen), Q, K, V and O are (1, total, heads, head_dim) and LSE is
    (1, heads, total): entry b's queries are rows offset_q ... offset_q + seqlen_q - 1."""

    seqlen_q: object
    seqlen_k: object
    offset_q: object = None
    offset_k: object = None

    @staticmethod
    def of(batch, seqlen_q, seqlen_k, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None):
        """Entry `batch`'s lengths: the tensors' (seqlen_q, seqlen_k) unless cu_seqlens or
        seqused_k give them per entry."""
        offset_q = offset_k = None
        if cu_seqlens_q is not None:
            offset_q = cu_seqlens_q[batch]
            seqlen_q = cu_seqlens_q[batch + 1] - offset_q
        if cu_seqlens_k is not None:
            offset_k = cu_seqlens_k[batch]
            seqlen_k = cu_seqlens_k[batch + 1] - offset_k
        if seqused_k is not None:
            seqlen_k = seqused_k[batch]
        return SeqlenInfo(seqlen_q, seqlen_k, offset_q, offset_k)

    def q_rows(self, mX: cute.Tensor, batch, head) -> cute.Tensor:
        """(seqlen, head_dim) rows of `head` of this entry in a Q-shaped tensor (Q, O)."""
        return _entry_rows(mX, batch, head, self.offset_q)

    def k_rows(self, mX: cute.Tensor, batch, head) -> cute.Tensor:
        """(seqlen, head_dim) rows of `head` of this entry in K or V."""
        return _entry_rows(mX, batch, head, self.offset_k)

    def lse_row(self, mLSE: cute.Tensor, batch, head) -> cute.Tensor:
        """The (seqlen,) LSE of `head` of this entry."""
        if self.offset_q is None:
            return mLSE[batch, head, None]
        return cute.domain_offset((self.offset_q,), mLSE[0, head, None])


def _entry_rows(mX: cute.Tensor, batch, head, offset):
    if offset is None:
        return mX[batch, None, head, None]
    return shifted(mX[0, None, head, None], offset * mX.stride[1])


@dataclass(frozen=True)
class BlockInfo:
    """Which key blocks a query block visits: all of them, or under causal masking (an upper
    edge) those up to the last key its last query sees (`cute_fa.visibility`), and with a
    sliding window (a lower edge, `local`) those from the first key its first query sees;
    with split-KV, the share of those of one split. Rounds walk them from the last one down,
    so the blocks that need the causal mask come first (and those the window's lower edge
    crosses last)."""

    block_m: int
    block_n: int
    causal: bool
    group: int = 1
    local: bool = False

    def n_block_max(self, seqlen: SeqlenInfo, m_block, causal_offset):
        n_blocks = (seqlen.seqlen_k + self.block_n - 1) // self.block_n
        if self.causal:
            last_row = (m_block + 1) * self.block_m - 1
            last_key = last_visible_key(QueryRows(self.group).query(last_row), causal_offset)
            n_blocks = cutlass.min(n_blocks,
                                   (cutlass.max(last_key + 1, 0) + self.block_n - 1) // self.block_n)
        return n_blocks

    def n_block_min(self, m_block, window_offset):
        """The first key block query block m_block visits under a window whose lower edge is
        key query + window_offset (`cute_fa.visibility.first_visible_key`)."""
        first_key = first_visible_key(QueryRows(self.group).query(m_block * self.block_m),
                                      window_offset)
        return cutlass.max(first_key, 0) // self.block_n

    def window_edge(self, m_block, window_offset):
        """Key blocks starting below this key hold keys under the lower edge of some row of
        query block m_block (its last row's is the highest) and need masking."""
        last_row = (m_block + 1) * self.block_m - 1
        return first_visible_key(QueryRows(self.group).query(last_row), window_offset)

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
