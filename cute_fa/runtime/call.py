"""Frozen descriptions of a checked call: what `runtime.plan.plan` decides from and what
`runtime.run` launches with. `cute_fa.api` builds them from a caller's tensors (after every
argument rule); `precompile` and the benchmarks build them from numbers. NamedTuples: a call
builds one on the warm path, where a frozen dataclass would cost microseconds.
"""

from __future__ import annotations

from typing import NamedTuple

NO_WINDOW = (-1, -1)
# the lower edge of a window with an unbounded left side that still has a lower-edge kernel (its
# right side is bounded): further left than any key of any sequence
FAR_LEFT = 1 << 30

DENSE, RAGGED = "dense", "ragged"


class ScoreFeatures(NamedTuple):
    """What a call asks of the scores besides the scale: causal (an upper edge, moved right by
    window_right), a sliding window's lower edge (local, window_left keys left of the
    diagonal), a softcap (0: none), traced mods (`cute_fa.mods.ModGraph`, None: none),
    attention sinks (a logit per query head) and a block mask (block_sparse: its (query, key)
    block size, which the tile is fitted to, and its heads, 1 where every head shares its
    lists; () without one). `causal`, `local`, the mods,
    `sinks` and `block_sparse` are kernel key fields (a bool there); the rest are kernel
    arguments (the mods' captured tensors, the sink logits and the block lists too)."""

    causal: bool
    local: bool = False
    window_left: int = 0
    window_right: int = 0
    softcap: float = 0.0
    score_mod: object = None
    mask_mod: object = None
    sinks: bool = False
    block_sparse: tuple = ()


PLAIN = {False: ScoreFeatures(False), True: ScoreFeatures(True)}


class AttentionCall(NamedTuple):
    """One forward call. layout: DENSE (q (batch, seqlen_q, heads_q, head_dim)) or RAGGED (a
    batch packed end to end; seqlen_q / seqlen_k are then the longest entry's). seqlen_k: the
    keys per entry a kernel may see (a paged cache: its page table's capacity). causal_offset:
    where the diagonal sits (a ragged or cache call computes it per entry on the device).
    page_size > 0: k and v are a paged cache; seqused_k: per-entry key counts are given;
    ragged_k: k and v are ragged too (cu_seqlens_k given). num_splits: the caller's split
    count (None: the plan picks it)."""

    layout: str
    dtype: object  # torch.float16 or torch.bfloat16
    head_dim: int
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    features: ScoreFeatures
    softmax_scale: float
    causal_offset: int
    return_lse: bool
    backend: str
    device_index: int
    page_size: int = 0
    seqused_k: bool = False
    ragged_k: bool = False
    num_splits: int | None = None


class BackwardCall(NamedTuple):
    """One backward call (`cute_fa.backward` / `backward_varlen`, or autograd's): the forward's
    features and scale, dq's summation mode, for a ragged batch its longest entries (which
    size the grids), and the work's extent: batch (a ragged batch's entries), heads, keys per
    entry (a ragged batch's longest). head_splits: over how many CTAs the wgmma backward
    splits a K/V group's query heads (None: the plan picks, `tuning_bwd.bwd_head_splits`).
    capture_grads: the slots of the score_mod's captured tensors whose gradients the main
    kernel adds up (`compile.keys.BwdKey.capture_grads`)."""

    layout: str
    dtype: object
    head_dim: int
    features: ScoreFeatures
    softmax_scale: float
    causal_offset: int
    deterministic: bool
    device_index: int
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    backend: str = "auto"  # the main kernel: "auto", "sm80" (mma.sync) or "sm90" (wgmma)
    batch: int = 1
    heads_q: int = 1
    heads_kv: int = 1
    seqlen_k: int = 0
    head_splits: int | None = None
    capture_grads: tuple = ()


class MergeCall(NamedTuple):
    """A merge of attention over disjoint key sets (`merge_attention`, split-KV's second step)."""

    in_dtype: object  # torch.float32 (split-KV's partials), float16 or bfloat16
    out_dtype: object
    head_dim: int
    device_index: int


def backward_of(call: AttentionCall, deterministic: bool) -> BackwardCall:
    """The backward of a checked forward call (a ragged one's longest entries size its grids)."""
    ragged = call.layout == RAGGED
    return BackwardCall(call.layout, call.dtype, call.head_dim, call.features,
                        call.softmax_scale, call.causal_offset, deterministic,
                        call.device_index, call.seqlen_q if ragged else 0,
                        call.seqlen_k if ragged else 0, "auto", call.batch, call.heads_q,
                        call.heads_kv, call.seqlen_k)
