"""How the work is split: which query block, head and batch a CTA computes and the launch grid
(`SingleTileScheduler`), the query and key lengths of one batch entry (`SeqlenInfo`), and which
key blocks a query block visits (`BlockInfo`). The kernels take their tile, lengths and key-block
range from these objects (they build `SeqlenInfo` from the tensors' extents, the one place that
reads them), so ragged batches (per-entry offsets and lengths), a sliding window (a key range with
a lower end), split-KV (a range per split) and persistent CTAs (a loop over tiles) each change one
of them.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from ..visibility import last_visible_key


@dataclass(frozen=True)
class WorkTile:
    """One CTA's share: query block `m_block` of query head `head` of batch entry `batch`,
    reading K/V head `head_kv`."""

    m_block: object
    head: object
    batch: object
    head_kv: object


@dataclass(frozen=True)
class SingleTileScheduler:
    """One CTA per (query block, query head, batch entry). Under causal masking the query
    blocks are handed out last first: the longest rows (most key blocks) start first, which
    shortens the tail of the last wave."""

    block_m: int
    causal: bool

    def grid(self, seqlen_q, heads_q, batch) -> tuple:
        """The launch grid (host side, while the kernel is traced)."""
        return (cute.ceil_div(seqlen_q, self.block_m), cute.size(heads_q), cute.size(batch))

    def tile(self, heads_q, heads_kv) -> WorkTile:
        """This CTA's tile. Under GQA/MQA heads_q / heads_kv consecutive query heads read one
        K/V head."""
        m_block, head, batch = cute.arch.block_idx()
        if self.causal:
            m_block = cute.arch.grid_dim()[0] - 1 - m_block
        return WorkTile(m_block, head, batch, head // (heads_q // heads_kv))


@dataclass(frozen=True)
class SeqlenInfo:
    """The query and key lengths of one batch entry. Today every entry has the whole
    tensor's lengths; ragged batches (cu_seqlens) and a paged K/V cache change this object."""

    seqlen_q: object
    seqlen_k: object


@dataclass(frozen=True)
class BlockInfo:
    """Which key blocks a query block visits: all of them, or under causal masking those up
    to the last key its last query sees (`cute_fa.visibility`). Rounds walk them from the last
    one down, so the blocks that need masking come first."""

    block_m: int
    block_n: int
    causal: bool

    def n_block_max(self, seqlen: SeqlenInfo, m_block, causal_offset):
        n_blocks = (seqlen.seqlen_k + self.block_n - 1) // self.block_n
        if self.causal:
            last_key = last_visible_key((m_block + 1) * self.block_m - 1, causal_offset)
            n_blocks = cutlass.min(n_blocks,
                                   (cutlass.max(last_key + 1, 0) + self.block_n - 1) // self.block_n)
        return n_blocks

    def masked_rounds(self) -> int:
        """Rounds, counted from the first, that may need masking: the sequence tail, and under
        causal every block the diagonal of a block_m-row slab can cross."""
        return (-(-self.block_m // self.block_n) + 1) if self.causal else 1
