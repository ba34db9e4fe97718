"""One batch entry's rows: how a tile's rows map to (query, query head) (`QueryRows`: one head,
or the query heads of a GQA group packed together), the query and key lengths of an entry and,
in a ragged batch (cu_seqlens), where its rows start (`SeqlenInfo`), and `shifted`, the one way
kernels reach a row that is not affine in its index."""

from dataclasses import dataclass

import cutlass.cute as cute


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



def packed_lse(mLSE: cute.Tensor, group: int) -> cute.Tensor:
    """A (batch, heads, seqlen) LSE as (batch, heads / group, (group, seqlen)): row r of K/V
    head h is query r // group of head h * group + r % group, the rows of
    `layouts.tma.tma_view(., group)`, so a packed tile stores its LSE by row index."""
    (batch, heads, seqlen), (s_b, s_h, s_s) = mLSE.shape, mLSE.stride
    return cute.make_tensor(mLSE.iterator, cute.make_layout(
        (batch, heads // group, (group, seqlen)), stride=(s_b, s_h * group, (s_h, s_s))))


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


def tma_entry_rows(tma_X: cute.Tensor, batch, head, offset):
    """The (seqlen, head_dim) TMA coordinates of one batch entry's rows of `head` in a tensor
    viewed as (seqlen, head_dim, heads, batch) (`layouts.tma.tma_view`); in a ragged batch
    (offset: the entry's first row), those of the packed (total, ...) tensor from that row. Its
    tiles may run into the next entry's rows: those are read but masked (K), multiplied by
    zero weights (V) or not stored (Q's rows past the entry)."""
    if offset is None:
        return tma_X[None, None, head, batch]
    return cute.domain_offset((offset, 0), tma_X[None, None, head, 0])
