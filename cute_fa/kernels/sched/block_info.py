"""Which key blocks a query block visits: all of them, or those a causal edge, a sliding window's
lower edge or a key split leave it (`BlockInfo`); a block mask's list entries (`list_entry`)."""

from dataclasses import dataclass

import cutlass

from ...visibility import first_visible_key, last_visible_key
from .seqlen import QueryRows, SeqlenInfo


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


def list_entry(entry):
    """(tile, whether its mask_mod must run) of an entry of a block mask's tile list: an entry
    -(j + 1) is tile j with every score kept (`BlockMask.kernel_blocks`, `query_tiles`), j
    itself one the mask_mod decides."""
    return cutlass.select_(entry < 0, ~entry, entry), entry >= 0
