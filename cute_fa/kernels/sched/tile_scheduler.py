"""The tile scheduler: which query block, head, batch entry and key split a CTA computes, and the
launch grid. Every forward kernel takes its `WorkTile` from here: one CTA per tile
(`SingleTileScheduler`), or a persistent grid whose CTAs loop over the tiles
(`PersistentTileScheduler`)."""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from .seqlen import QueryRows

# a ragged batch's tile list packs (entry, query block) as entry << BLOCK_BITS | block
# (`runtime.ragged_order`, which imports no DSL and says the same)
BLOCK_BITS = 16


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
    shorter ones (without it, only within a head); with GQA packing the x is the K/V head.
    With split-KV the grid's z is split * batch + batch entry, the index of the CTA's partial
    outputs. ordered (a ragged Q, `KernelKey.varlen_order`): the grid's x is place * heads +
    head, the place in a list of the batch's (entry, query block) tiles, most work first
    (`runtime.ragged_order`), so every head of a tile starts before the next tile (one
    dimension: a grid's y and z stop at 65535, a long batch's tiles would not)."""

    block_m: int
    causal: bool
    group: int = 1
    split_kv: bool = False
    lpt: bool = False
    ordered: bool = False

    def grid(self, seqlen_q, heads_q, batch, num_splits=None) -> tuple:
        """The launch grid (host side, while the kernel is traced)."""
        if self.ordered:  # every (entry, query block) of the longest entry's extent
            return (cute.ceil_div(seqlen_q, self.block_m) * batch * heads_q, 1, 1)
        if self.lpt:
            if self.group > 1:
                return (cute.size(heads_q // self.group),
                        cute.ceil_div(QueryRows(self.group).count(seqlen_q), self.block_m),
                        cute.size(batch))
            return (cute.size(heads_q), cute.ceil_div(seqlen_q, self.block_m), cute.size(batch))
        if self.group == 1 and not self.split_kv:
            return (cute.ceil_div(seqlen_q, self.block_m), cute.size(heads_q), cute.size(batch))
        rows = QueryRows(self.group).count(seqlen_q)
        heads = heads_q // self.group if self.group > 1 else heads_q
        z = batch * num_splits if self.split_kv else batch
        return (cute.ceil_div(rows, self.block_m), cute.size(heads), cute.size(z))

    def tile(self, heads_q, heads_kv, batch_size=None, order=None) -> WorkTile:
        """This CTA's tile. Under GQA/MQA heads_q / heads_kv consecutive query heads read one
        K/V head; packed, the grid's y is that K/V head. order: the ordered grid's list of
        tiles, each entry << BLOCK_BITS | query block (`runtime.ragged_order`)."""
        if self.ordered:
            cta, _, _ = cute.arch.block_idx()
            head, packed = cta % heads_q, order[cta // heads_q]
            return WorkTile(packed & ((1 << BLOCK_BITS) - 1), head, packed >> BLOCK_BITS,
                            head // (heads_q // heads_kv))
        if self.lpt:
            head, m_block, batch = cute.arch.block_idx()
            m_block = cute.arch.grid_dim()[1] - 1 - m_block
            if self.group > 1:  # the grid's x is the K/V head
                return WorkTile(m_block, head * self.group, batch, head)
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


def tile_coords(t, m_blocks, heads, causal: bool, lpt: bool) -> tuple:
    """(m_block, head, batch) of tile t in `SingleTileScheduler`'s launch order (the order the
    GPU starts its CTAs in, x fastest): without lpt query blocks fastest, under causal masking
    the last (longest) first; with lpt heads fastest, then query blocks last first. Plain
    arithmetic: it runs on Python ints (the tests) and on DSL integers (the kernel) alike."""
    if lpt:
        head, rest = t % heads, t // heads
        return m_blocks - 1 - rest % m_blocks, head, rest // m_blocks
    m_block, rest = t % m_blocks, t // m_blocks
    if causal:
        m_block = m_blocks - 1 - m_block
    return m_block, rest % heads, rest // heads


@dataclass(frozen=True)
class PersistentTileScheduler:
    """A grid of at most `ctas` CTAs (the GPU's SMs, one CTA each) over the tiles of
    `tile_coords`' order, tile t's coordinates `tile(t)`: CTA c starts on tile c, and takes
    c + gridDim.x, c + 2 gridDim.x, ... next, or (`Sm90Key.dynamic_tiles`) the next in line
    when it finishes, from a counter (the kernel's producer warp fetches them). A CTA's next
    tile's loads start under its current tile's epilogue instead of behind a new CTA's
    prologue. Dense calls without split-KV or GQA packing."""

    block_m: int
    causal: bool
    lpt: bool
    ctas: int

    def tiles(self, seqlen_q, heads_q, batch):
        """How many tiles the call has: query blocks x query heads x batch entries."""
        return cute.ceil_div(seqlen_q, self.block_m) * heads_q * batch

    def grid(self, seqlen_q, heads_q, batch) -> tuple:
        """The launch grid (host side, while the kernel is traced)."""
        return (cutlass.max(cutlass.min(self.tiles(seqlen_q, heads_q, batch), self.ctas), 1),
                1, 1)

    def tile(self, t, seqlen_q, heads_q, heads_kv) -> WorkTile:
        """Tile t (`tile_coords`), reading K/V head head // (heads_q // heads_kv)."""
        m_block, head, batch = tile_coords(t, cute.ceil_div(seqlen_q, self.block_m), heads_q,
                                           self.causal, self.lpt)
        return WorkTile(m_block, head, batch, head // (heads_q // heads_kv))

