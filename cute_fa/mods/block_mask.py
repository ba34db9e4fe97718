"""Block masks: for each (batch, head, query block), the key blocks a kernel visits, split into
those a mask_mod keeps whole (`full`: no mask to evaluate) and those it keeps in part
(`partial`: evaluate it per score); the others are skipped. The layout is torch's
FlexAttention `BlockMask`'s (counts, then indices in ascending order, the rest of each row
filled with the unlisted blocks), so either converts to the other. Positions past the
sequences count as masked, so a tail block is never full."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from .dense import evaluate, index_grid
from .graph import BOOL, INT, Capture, ModGraph, Node
from .trace import trace_mask_mod


# Whether the backward of a block mask visits only the query tiles that meet listed blocks
# (`BlockMask.query_tiles`, the backward keys' block_sparse) rather than every one, each masked
# by the blocks' kinds either way: 1.23x-29x the speed of visiting every one, gradients within
# 0.002 of it (H100, causal, window, document and prefix-LM masks, S 1k-16k,
# docs/perf/2026-12-07-h100-bwd-mods/). A deterministic backward visits every one.
SPARSE_BACKWARD = True

# Whether `BlockMask.kernel_blocks` marks the tiles inside full blocks, whose mask_mod the
# kernels then skip (as FlexAttention skips its full blocks'). The kernels read both forms:
# this one ran 1.64x-3.45x the speed of masking every listed tile, outputs bitwise equal
# (H100, the masks and lengths above, docs/perf/2026-12-07-h100-bwd-mods/).
WHOLE_TILES = True

# The same marking in the backward's lists (`BlockMask.query_tiles`): its kernels then skip
# the mask (the blocks' kinds and the mask_mod, read per score) on tiles inside full blocks.
# The backward kernels read both forms: this one ran 1.05x-1.42x the speed of masking every
# listed tile, gradients within 0.001 (H100, the masks above at S 4k and 16k, one run,
# docs/perf/2026-12-07-h100-first-call/).
WHOLE_TILES_BACKWARD = True

# Whether forward_varlen and KV-cache calls take a block mask: its lists cut to each sequence
# (`per_sequence`) and walked by the ragged and paged kernels as the dense ones walk them.
# Built, compiled and resource-checked on the CPU (2026-12-08, when no GPU was lent); off,
# such a call raises, until tests/test_mods_gpu.py's ragged and paged block-mask tests have
# passed on a GPU.
SEQUENCE_BLOCK_MASKS = False


@dataclass(frozen=True)
class BlockMask:
    """kv_num_blocks, full_kv_num_blocks: int32 (batch, heads, query blocks); kv_indices,
    full_kv_indices: int32 (batch, heads, query blocks, key blocks); batch and heads may be 1
    (the same for all). mask_mod: the function the partial blocks evaluate (None: every
    score of a listed block kept, as torch's `noop_mask`)."""

    kv_num_blocks: torch.Tensor
    kv_indices: torch.Tensor
    full_kv_num_blocks: torch.Tensor
    full_kv_indices: torch.Tensor
    block_size: tuple
    seqlen_q: int
    seqlen_k: int
    mask_mod: object = None
    # kernel_blocks' answers by (block_m, block_n, batch, heads): a mask is made once and used
    # by every layer of every step, and the conversion is ~25 small GPU operations
    _tiles: dict = field(default_factory=dict, compare=False, repr=False)

    def dense(self) -> torch.Tensor:
        """bool (batch, heads, seqlen_q, seqlen_k): True in full blocks, the mask_mod in
        partial ones, False in skipped blocks and past the sequences (what the block mask
        lets attention see)."""
        bq, bk = self.block_size
        batch, heads, q_blocks = self.kv_num_blocks.shape
        k_blocks = self.kv_indices.shape[-1]
        full = _listed(self.full_kv_num_blocks, self.full_kv_indices, k_blocks)
        partial = _listed(self.kv_num_blocks, self.kv_indices, k_blocks)
        full = full.repeat_interleave(bq, dim=2).repeat_interleave(bk, dim=3)
        partial = partial.repeat_interleave(bq, dim=2).repeat_interleave(bk, dim=3)
        full, partial = (t[:, :, :self.seqlen_q, :self.seqlen_k] for t in (full, partial))
        if self.mask_mod is None:
            return full | partial
        return full | (partial & _mask(self.mask_mod, batch, heads, self.seqlen_q,
                                       self.seqlen_k, partial.device))


    def kernel_blocks(self, block_m: int, block_n: int, batch: int, heads: int,
                      whole: bool | None = None) -> tuple:
        """(counts int32 (batch, heads, query tiles), indices int32 (..., key tiles)): for a
        kernel of block_m x block_n tiles, the key tiles each query tile visits, ascending,
        then the others (`_ordered`): every tile that overlaps a full or partial block of
        this mask. With whole (None: WHOLE_TILES), a tile that meets full blocks alone, every
        score of it kept, is listed as -(j + 1) (`kernel_tile`): the kernels skip the
        mask_mod there. Broadcast over batch and heads where the mask has one; no host sync.
        Kept per tile and shape: the mask's tensors must not change in place after a first
        call."""
        whole = WHOLE_TILES if whole is None else whole
        held = self._tiles.get((block_m, block_n, batch, heads, whole))
        if held is not None:
            return held
        met, rows, cols = self._tiles_met(block_m, block_n)
        counts, indices = _ordered(met)
        if whole:
            indices = _mark_whole(indices, self._kept_whole(rows, cols))
        held = self._tiles[(block_m, block_n, batch, heads, whole)] = _broadcast(
            counts, indices, batch, heads)
        return held

    def query_tiles(self, block_m: int, block_n: int, batch: int, heads: int,
                    whole: bool | None = None) -> tuple:
        """(counts int32 (batch, heads, key tiles), indices int32 (..., query tiles)): for a
        backward of block_m x block_n tiles, the query tiles each key tile visits, ascending,
        then the others: every tile that overlaps a full or partial block (a tile meeting
        none holds no kept score). whole (None: WHOLE_TILES_BACKWARD): a tile every score of
        which is kept is listed as -(i + 1), as in `kernel_blocks`. Broadcast over batch and
        heads as `kernel_blocks`."""
        whole = WHOLE_TILES_BACKWARD if whole is None else whole
        held = self._tiles.get(("query", block_m, block_n, batch, heads, whole))
        if held is None:
            met, rows, cols = self._tiles_met(block_m, block_n)
            counts, indices = _ordered(met.transpose(-1, -2))
            if whole:
                indices = _mark_whole(indices, self._kept_whole(rows, cols).transpose(-1, -2))
            held = self._tiles[("query", block_m, block_n, batch, heads, whole)] = _broadcast(
                counts, indices, batch, heads)
        return held

    def _kept_whole(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """bool (batch, heads, query tiles, key tiles): whether a tile meets full blocks alone
        (every score of it kept; `_tiles_met`'s rows and cols)."""
        full = _listed(self.full_kv_num_blocks, self.full_kv_indices, cols.shape[1])
        return (rows @ (~full).to(torch.float32) @ cols.T) == 0

    def _tiles_met(self, block_m: int, block_n: int) -> tuple:
        """(met, rows, cols): met bool (batch, heads, query tiles, key tiles), whether a
        block_m x block_n tile meets a full or partial block; rows / cols: float (tiles,
        blocks), which of the mask's query / key blocks each tile meets (`_overlap`)."""
        bq, bk = self.block_size
        k_blocks = self.kv_indices.shape[-1]
        kept = _listed(self.kv_num_blocks, self.kv_indices, k_blocks) | _listed(
            self.full_kv_num_blocks, self.full_kv_indices, k_blocks)
        rows = _overlap(-(-self.seqlen_q // block_m), block_m, kept.shape[2], bq, self.seqlen_q,
                        kept.device)
        cols = _overlap(-(-self.seqlen_k // block_n), block_n, k_blocks, bk, self.seqlen_k,
                        kept.device)
        return (rows @ kept.to(torch.float32) @ cols.T) > 0, rows, cols

    def exact_mod(self, mask_mod):
        """`exact_mask_mod` of `mask_mod` (this mask's traced mask_mod, or None) and this
        mask's block size, made once per graph."""
        held = self._tiles.get(("exact", mask_mod))
        if held is None:
            held = self._tiles[("exact", mask_mod)] = exact_mask_mod(mask_mod, self.block_size)
        return held

    def aligned(self, block_m: int, block_n: int) -> bool:
        """Whether each block_m x block_n kernel tile lies inside one block of the mask: then
        a listed tile is inside one listed block, and the block lists with the mask_mod (on
        tiles not listed whole) keep exactly what `dense` says."""
        bq, bk = self.block_size
        return bq % block_m == 0 and bk % block_n == 0

    def block_kinds(self, batch: int, heads: int) -> torch.Tensor:
        """int32 (batch, heads, query blocks, key blocks), broadcast where the mask has one
        batch entry or head: 2 where a block is full, 1 partial, 0 skipped. What
        `exact_mask_mod`'s graph reads, on kernels whose tiles are not `aligned`."""
        held = self._tiles.get(("kinds", batch, heads))
        if held is None:
            k_blocks = self.kv_indices.shape[-1]
            full = _listed(self.full_kv_num_blocks, self.full_kv_indices, k_blocks)
            partial = _listed(self.kv_num_blocks, self.kv_indices, k_blocks)
            kinds = torch.where(full, 2, partial.to(torch.int32)).to(torch.int32)
            held = self._tiles[("kinds", batch, heads)] = kinds.expand(
                (batch, heads) + tuple(kinds.shape[2:]))
        return held


def exact_mask_mod(graph: ModGraph | None, block_size: tuple) -> ModGraph:
    """The mask a block mask means, as a mask_mod for kernels whose tiles straddle its blocks:
    kinds[b, h, q_idx // bq, kv_idx // bk] == 2 (a full block: kept whatever `graph` says),
    or == 1 (partial) and `graph` (the mask's mask_mod; None: kept). `kinds` is
    `BlockMask.block_kinds`, one more captured tensor after graph's. Without it a tile that
    meets a listed block and an unlisted one would let the mask_mod decide the unlisted
    block's scores, which FlexAttention drops."""
    captures = graph.captures if graph is not None else ()
    kinds = Capture(len(captures), "int32", 4)
    bq, bk = block_size
    index = (Node("b", INT), Node("h", INT),
             Node("floordiv", INT, (Node("q_idx", INT), Node("const", INT, value=bq))),
             Node("floordiv", INT, (Node("kv_idx", INT), Node("const", INT, value=bk))))
    kind = Node("load", INT, index, kinds)
    full = Node("eq", BOOL, (kind, Node("const", INT, value=2)))
    partial = Node("eq", BOOL, (kind, Node("const", INT, value=1)))
    if graph is not None:
        partial = Node("and", BOOL, (partial, graph.root))
    return ModGraph("mask_mod", Node("or", BOOL, (full, partial)), captures + (kinds,))


def per_sequence(counts: torch.Tensor, indices: torch.Tensor, rows: torch.Tensor | int | None,
                 listed: torch.Tensor | int | None) -> torch.Tensor:
    """The counts of `kernel_blocks`' or `query_tiles`' lists (counts, indices) for a ragged
    batch or a KV cache, whose sequences may be shorter than the mask: each list's row is a
    tile of one side (a query tile in the forward's lists, a key tile in the backward's),
    its entries tiles of the other. rows, listed: int (batch,), sequence b's tiles on each
    side (`sequence_tiles`; an int: every sequence's; None: all the mask's). A row past its
    sequence's tiles lists nothing, and a row keeps its entries below the sequence's
    `listed` tiles: the first ones of its ascending list, so that only its count changes
    (the kernels read no entry past it), and its last tile is the one the sequence's end may
    cut (the first round, which masks). int32 (batch, heads, rows), a new tensor; no host
    sync."""
    count = counts
    if listed is not None:
        tile = kernel_tile(indices)[0]
        entry = torch.arange(indices.shape[-1], device=indices.device)
        inside = (entry < counts[..., None]) & (tile < _per_entry(listed, 3))
        count = inside.sum(-1)
    if rows is not None:
        row = torch.arange(counts.shape[2], device=counts.device)
        count = torch.where(row < _per_entry(rows, 2), count, 0)
    return count.to(torch.int32).contiguous()


def _per_entry(tiles, dims: int):
    """tiles (batch,) shaped to broadcast over `dims` more dimensions; an int as it is."""
    return tiles.reshape((-1,) + (1,) * dims) if isinstance(tiles, torch.Tensor) else tiles


def sequence_tiles(cu_seqlens: torch.Tensor | None, tile: int, used: torch.Tensor | None = None,
                   length: int | None = None) -> torch.Tensor | int | None:
    """The tiles of `tile` positions each sequence of a ragged batch or KV cache spans: int
    (batch,) from its used length (`used`, seqused_k), else from its cu_seqlens; else the
    same for all, an int, from `length`; None where none is given."""
    lengths = used if used is not None else (
        None if cu_seqlens is None else cu_seqlens[1:] - cu_seqlens[:-1])
    if lengths is None:
        return None if length is None else -(-length // tile)
    return (lengths.long() + tile - 1) // tile


def _broadcast(counts: torch.Tensor, indices: torch.Tensor, batch: int, heads: int) -> tuple:
    """counts and indices expanded to the call's (batch, heads): a mask made for one batch
    entry or head serves all."""
    shape = (batch, heads) + tuple(counts.shape[2:])
    return counts.expand(shape), indices.expand(shape + indices.shape[-1:])


def _mark_whole(indices: torch.Tensor, kept_whole: torch.Tensor) -> torch.Tensor:
    """A list's entries (`_ordered`'s, along the last dimension of kept_whole) as the kernels
    read them: -(j + 1) where tile j is kept whole, j elsewhere."""
    return torch.where(kept_whole.gather(-1, indices.long()), -indices - 1, indices)


def kernel_tile(listed: torch.Tensor) -> tuple:
    """(key tile, whether every score of it is kept) of `BlockMask.kernel_blocks`' entries."""
    return torch.where(listed < 0, -listed - 1, listed), listed < 0


def _overlap(tiles: int, tile: int, blocks: int, block: int, length: int, device) -> torch.Tensor:
    """float (tiles, blocks): 1 where tile i's positions (i * tile ... up to length) meet
    block j's (j * block ...)."""
    start = torch.arange(tiles, device=device)[:, None] * tile
    end = torch.clamp(start + tile, max=length)
    first = torch.arange(blocks, device=device)[None, :] * block
    return ((start < first + block) & (first < end)).to(torch.float32)


def _listed(counts, indices, k_blocks) -> torch.Tensor:
    """bool (batch, heads, query blocks, key blocks): the blocks a row's count of indices names."""
    take = torch.arange(indices.shape[-1], device=indices.device) < counts[..., None].long()
    out = torch.zeros(*counts.shape, k_blocks, dtype=torch.bool, device=indices.device)
    return out.scatter_(-1, indices.long(), take)


def _mask(mask_mod, batch, heads, seqlen_q, seqlen_k, device) -> torch.Tensor:
    graph, captured = trace_mask_mod(mask_mod)
    out = evaluate(graph, captured, **index_grid(batch, heads, seqlen_q, seqlen_k, device))
    return out.expand(batch, heads, seqlen_q, seqlen_k)


def _ordered(blocks: torch.Tensor) -> tuple:
    """(counts, indices) of bool (..., key blocks): each row's marked blocks ascending, then
    the others ascending (a stable sort on 'not marked'). Both dense, whatever the strides of
    `blocks` (a transposed one for the query lists): the kernels take the lists' last
    dimension at stride 1."""
    order = torch.sort((~blocks).to(torch.int8).contiguous(), dim=-1, stable=True).indices
    return blocks.sum(-1).to(torch.int32).contiguous(), order.to(torch.int32)


def create_block_mask(mask_mod, batch: int | None, heads: int | None, seqlen_q: int,
                      seqlen_k: int, block_size=128, device="cpu") -> BlockMask:
    """The block mask of `mask_mod(b, h, q_idx, kv_idx)` (as torch's `create_block_mask`):
    the mask evaluated densely (`dense.evaluate`), one query block row at a time, then each
    block classified full (every position kept), partial (some) or skipped (none). batch or
    heads None: one for all (the mask must not read b or h then)."""
    bq, bk = (block_size, block_size) if isinstance(block_size, int) else tuple(block_size)
    batch, heads = batch or 1, heads or 1
    q_blocks, k_blocks = -(-seqlen_q // bq), -(-seqlen_k // bk)
    graph, captured = trace_mask_mod(mask_mod)
    full = torch.zeros(batch, heads, q_blocks, k_blocks, dtype=torch.bool, device=device)
    some = torch.zeros_like(full)
    kv = torch.arange(seqlen_k, device=device)
    for m in range(q_blocks):
        # the mask at the block row's queries inside the sequences only (a captured table
        # need not reach past them), False past them
        q = torch.arange(m * bq, min((m + 1) * bq, seqlen_q), device=device)
        kept = torch.zeros(batch, heads, bq, k_blocks * bk, dtype=torch.bool, device=device)
        kept[:, :, :len(q), :seqlen_k] = evaluate(graph, captured,
                                                  **index_grid(batch, heads, q, kv, device))
        kept = kept.reshape(batch, heads, bq, k_blocks, bk)
        full[:, :, m] = kept.all(dim=4).all(dim=2)
        some[:, :, m] = kept.any(dim=4).any(dim=2)
    kv_num, kv_idx = _ordered(some & ~full)
    full_num, full_idx = _ordered(full)
    return BlockMask(kv_num, kv_idx, full_num, full_idx, (bq, bk), seqlen_q, seqlen_k, mask_mod)


_FROM_TORCH: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def from_torch(block_mask) -> BlockMask:
    """A torch FlexAttention `BlockMask` as cute_fa's (the same tensors, int32), made once per
    torch mask object (so that its kernel tiles are converted once, `kernel_blocks`)."""
    try:
        held = _FROM_TORCH.get(block_mask)
    except TypeError:  # not weakly referenceable or not hashable: converted every call
        return _from_torch(block_mask)
    if held is None:
        held = _FROM_TORCH[block_mask] = _from_torch(block_mask)
    return held


def _from_torch(block_mask) -> BlockMask:
    seqlen_q, seqlen_k = block_mask.seq_lengths
    full_num = block_mask.full_kv_num_blocks
    full_idx = block_mask.full_kv_indices
    if full_num is None:  # a mask of partial blocks only
        full_num = torch.zeros_like(block_mask.kv_num_blocks)
        full_idx = block_mask.kv_indices
    mask_mod = block_mask.mask_mod
    if mask_mod is _torch_noop_mask():  # from_kv_blocks' default: the blocks alone say it
        mask_mod = None
    return BlockMask(block_mask.kv_num_blocks.to(torch.int32),
                     block_mask.kv_indices.to(torch.int32), full_num.to(torch.int32),
                     full_idx.to(torch.int32), tuple(block_mask.BLOCK_SIZE), seqlen_q, seqlen_k,
                     mask_mod)


def _torch_noop_mask():
    from torch.nn.attention.flex_attention import noop_mask

    return noop_mask
