"""The order a ragged batch's tiles start in (`KernelKey.varlen_order`): one entry per (batch
entry, query block), the one with the most key blocks to visit first, ties in (entry, query
block) order, the blocks past an entry's queries (no work) last. The kernels' CTAs take them in
this order, every query head of a tile before the next tile
(`kernels.sched.tile_scheduler.SingleTileScheduler`), so the longest tiles of the longest
sequences do not start last and leave the GPU a tail of a few long CTAs. Made on the device from
cu_seqlens (no host sync), a few small operations; kept per cu_seqlens tensor while it is
unchanged (the layers of one step share it)."""

from __future__ import annotations

import torch

# an entry packs (batch entry, query block): entry << BLOCK_BITS | block
BLOCK_BITS = 16


def tile_work(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor | None,
              seqused_k: torch.Tensor | None, seqlen_k: int, max_seqlen_q: int, block_m: int,
              block_n: int, causal: bool) -> torch.Tensor:
    """int64 (entries, query blocks): the key blocks each tile visits, -1 past the entry's
    queries. Causal is bottom-right per entry: query block m sees keys up to (m + 1) * block_m
    - 1 + seqlen_k - seqlen_q."""
    len_q = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
    if seqused_k is not None:
        len_k = seqused_k.long()
    elif cu_seqlens_k is not None:
        len_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).long()
    else:
        len_k = torch.full_like(len_q, seqlen_k)
    start = torch.arange(-(-max_seqlen_q // block_m), device=len_q.device) * block_m
    keys = len_k[:, None].expand(-1, start.shape[0])
    if causal:
        keys = torch.minimum(keys, torch.clamp(start[None] + block_m + (len_k - len_q)[:, None],
                                               min=0))
    return torch.where(start[None] < len_q[:, None], (keys + block_n - 1) // block_n, -1)


def tile_order(work: torch.Tensor) -> torch.Tensor:
    """int32 (entries x query blocks,): the tiles of `tile_work`, most work first (a stable
    sort: ties keep their (entry, query block) order), each as entry << BLOCK_BITS | block."""
    blocks = work.shape[1]
    if blocks >= 1 << BLOCK_BITS or work.shape[0] >= 1 << (31 - BLOCK_BITS):
        raise ValueError(f"a ragged batch of {work.shape[0]} entries and {blocks} query blocks "
                         f"is too large for an ordered grid")
    index = torch.sort(work.flatten(), descending=True, stable=True).indices
    return ((index // blocks) << BLOCK_BITS | index % blocks).to(torch.int32)


_HELD: dict = {}


def ragged_order(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor | None,
                 seqused_k: torch.Tensor | None, seqlen_k: int, max_seqlen_q: int,
                 block_m: int, block_n: int, causal: bool) -> torch.Tensor:
    """`tile_order` of the call's tiles, made once per set of unchanged index tensors (their
    storage and version counters, which an in-place write bumps)."""
    tensors = (cu_seqlens_q, cu_seqlens_k, seqused_k)
    held_key = tuple((t.data_ptr(), t._version, t.shape[0]) if t is not None else None
                     for t in tensors) + (seqlen_k, max_seqlen_q, block_m, block_n, causal)
    held = _HELD.get(held_key)
    if held is None or any(a is not b for a, b in zip(held[0], tensors)):
        order = tile_order(tile_work(cu_seqlens_q, cu_seqlens_k, seqused_k, seqlen_k,
                                     max_seqlen_q, block_m, block_n, causal))
        if len(_HELD) > 64:
            _HELD.clear()
        held = _HELD[held_key] = (tensors, order)
    return held[1]
