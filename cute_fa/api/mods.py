"""`score_mod`, `mask_mod` and `sinks` at the public functions. The mods are traced at the call
(`cute_fa.mods.trace`; an operation outside the vocabulary raises a TypeError naming it), the
graphs put into the call's score features (the kernel key's fields: a new function compiles,
new values in the same tensors do not) and the tensors they index handed to the launch; the
sink logits are checked and handed over as float32; a block mask (cute_fa's or torch's) is
checked against the call, and its mask_mod becomes the call's."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from ..runtime.call import DENSE, AttentionCall
from .autograd import BlockBackward


class TracedMods(NamedTuple):
    """A call's traced mods (None: not given) and the tensors they capture, the score_mod's
    first (in slot order); its sink logits (heads_q,) as given (None: no sinks; they may
    require grad: `needs_grad`); its block mask (`cute_fa.mods.block_mask.BlockMask`, None:
    none)."""

    score_mod: object = None
    mask_mod: object = None
    captures: tuple = ()
    sinks: object = None
    block_mask: object = None

    def __bool__(self) -> bool:
        return self.score_mod is not None or self.mask_mod is not None \
            or self.sinks is not None or self.block_mask is not None


NONE = TracedMods()


def trace_mods(score_mod: Callable | None, mask_mod: Callable | None, q: torch.Tensor,
               softcap: float = 0.0, sinks: torch.Tensor | None = None,
               heads_q: int = 0, block_mask=None, call: AttentionCall | None = None
               ) -> TracedMods:
    """The call's mods traced and checked against it: callables, not with a softcap next to a
    score_mod, their captured tensors on q's device; sinks a float tensor (heads_q,) there;
    a block mask (only with `call`, a dense one) whose mask_mod is then the call's."""
    if block_mask is not None:
        block_mask = _block_mask(block_mask, mask_mod, q, call)
        mask_mod = block_mask.mask_mod
        traced = trace_mods(score_mod, mask_mod, q, softcap, sinks, heads_q)
        return traced._replace(block_mask=block_mask)
    if score_mod is None and mask_mod is None:
        return NONE if sinks is None else TracedMods(sinks=_sinks(sinks, q, heads_q))
    from ..mods.trace import trace_mask_mod, trace_score_mod

    traced = []
    for name, fn, tracer in (("score_mod", score_mod, trace_score_mod),
                             ("mask_mod", mask_mod, trace_mask_mod)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a function {_SIGNATURES[name]} or None, "
                            f"got {type(fn).__name__}")
        traced.append(tracer(fn) if fn is not None else (None, ()))
    return checked_mods(*traced, q, softcap, sinks, heads_q)


def checked_mods(score: tuple, mask: tuple, q: torch.Tensor, softcap: float,
                 sinks: torch.Tensor | None, heads_q: int) -> TracedMods:
    """The mods of traced (graph, captured tensors) pairs ((None, ()) where not given),
    checked against the call: not a softcap next to a score_mod, the tensors on q's device,
    the sinks `_sinks`'."""
    if score[0] is not None and softcap:
        raise ValueError("softcap and score_mod together: write the softcap into the score_mod "
                         "(softcap * torch.tanh(score / softcap)) or give one of them")
    (score_graph, score_captures), (mask_graph, mask_captures) = score, mask
    for name, tensors in (("score_mod", score_captures), ("mask_mod", mask_captures)):
        for t in tensors:
            if t.device != q.device:
                raise ValueError(f"{name} indexes a tensor on {t.device}: the tensors a mod "
                                 f"captures must be on q's device, {q.device}")
    return TracedMods(score_graph, mask_graph, score_captures + mask_captures,
                      None if sinks is None else _sinks(sinks, q, heads_q))


def _block_mask(block_mask, mask_mod, q: torch.Tensor, call: AttentionCall | None):
    """cute_fa's BlockMask of `block_mask` (cute_fa's or torch's), checked against the call:
    without causal or a window (the mask says them), its batch and heads 1 or the call's, and
    made for the call's sequence lengths: a dense call's own, or for a ragged batch or a KV
    cache at least its longest sequence's (each sequence's positions are the mask's first,
    and its lists are cut to them, `BlockMask.per_sequence`), walked by one CTA per query
    tile (num_splits 1)."""
    from ..mods import block_mask as masks
    from ..mods.block_mask import BlockMask, from_torch

    if not isinstance(block_mask, BlockMask):
        if not hasattr(block_mask, "kv_num_blocks") or not hasattr(block_mask, "BLOCK_SIZE"):
            raise TypeError(f"block_mask must be a cute_fa.mods.block_mask.BlockMask or torch's "
                            f"FlexAttention BlockMask, got {type(block_mask).__name__}")
        block_mask = from_torch(block_mask)
    if mask_mod is not None:
        raise ValueError("pass the mask as mask_mod or as block_mask (its mask_mod), not both")
    if call is None:
        raise ValueError("block_mask is taken by forward, forward_varlen, sdpa and "
                         "flex_attention")
    per_sequence = call.layout != DENSE or bool(call.page_size) or call.seqused_k
    if per_sequence and not masks.SEQUENCE_BLOCK_MASKS:
        raise ValueError("block_mask is taken by dense calls (forward, sdpa, flex_attention) "
                         "without a KV cache: in forward_varlen and KV-cache calls it is built "
                         "but not yet checked on a GPU (cute_fa.mods.block_mask."
                         "SEQUENCE_BLOCK_MASKS); pass the mask as mask_mod there")
    if call.num_splits not in (None, 1):
        raise ValueError(f"block_mask with num_splits={call.num_splits}: a block mask's lists "
                         f"are walked by one CTA per query tile; pass num_splits=1 or None")
    f = call.features
    if f.causal or f.local:
        raise ValueError("block_mask with causal or window_size: put them in the mask (its "
                         "mask_mod), as FlexAttention does")
    lengths = (block_mask.seqlen_q, block_mask.seqlen_k)
    if (per_sequence and (lengths[0] < call.seqlen_q or lengths[1] < call.seqlen_k)) \
            or (not per_sequence and lengths != (call.seqlen_q, call.seqlen_k)):
        what = "at least its longest sequences'" if per_sequence else "the call's"
        raise ValueError(f"block_mask was made for (seqlen_q, seqlen_k) = {lengths}, it must "
                         f"be made for {what}, ({call.seqlen_q}, {call.seqlen_k})")
    batch, heads = block_mask.kv_num_blocks.shape[:2]
    if batch not in (1, call.batch) or heads not in (1, call.heads_q):
        raise ValueError(f"block_mask's batch and heads ({batch}, {heads}) must be 1 or the "
                         f"call's ({call.batch}, {call.heads_q})")
    if block_mask.kv_num_blocks.device != q.device:
        raise ValueError(f"block_mask must be on q's device, {q.device}, got "
                         f"{block_mask.kv_num_blocks.device}")
    return block_mask


def _sinks(sinks, q: torch.Tensor, heads_q: int) -> torch.Tensor:
    """The sink logits, checked: a float tensor, one per query head, on q's device (the launch
    hands the kernels a float32 copy, `runtime.run.score_tensors`)."""
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a tensor of one logit per query head, shape "
                        f"({heads_q},), or None, got {type(sinks).__name__}")
    if sinks.shape != (heads_q,) or not sinks.is_floating_point():
        raise ValueError(f"sinks must be a float tensor of shape (heads_q,) = ({heads_q},), "
                         f"got {sinks.dtype} {tuple(sinks.shape)}")
    if sinks.device != q.device:
        raise ValueError(f"sinks must be on q's device, {q.device}, got {sinks.device}")
    return sinks


_SIGNATURES = {"score_mod": "(score, b, h, q_idx, kv_idx) -> score",
               "mask_mod": "(b, h, q_idx, kv_idx) -> bool"}


def with_mods(call: AttentionCall, mods: TracedMods) -> AttentionCall:
    """The checked call with its mods among its score features."""
    if not mods:
        return call
    blocks = ()
    if mods.block_mask is not None:  # its block size, and its heads (1: shared by all)
        mask = mods.block_mask
        blocks = tuple(mask.block_size) + (mask.kv_num_blocks.shape[1],)
    return call._replace(features=call.features._replace(
        score_mod=mods.score_mod, mask_mod=mods.mask_mod, sinks=mods.sinks is not None,
        block_sparse=blocks))


def exact_blocks(call: AttentionCall, mods: TracedMods, planned, plan_of: Callable) -> tuple:
    """(call, mods, plan) of a block-sparse call whose planned kernel's tiles straddle the
    mask's blocks (`BlockMask.aligned`): its mask_mod becomes the mask's block kinds with
    it (`exact_mask_mod`, re-planned by plan_of(call)), so that an unlisted block's scores
    in a listed tile are dropped and a full block's kept whatever the mask_mod says, as
    FlexAttention does. Unchanged where the tiles lie inside the blocks and the kernel skips
    the mask_mod on tiles inside full blocks (`block_mask.WHOLE_TILES`), or there is no
    mask_mod."""
    from ..mods import block_mask

    mask, tile = mods.block_mask, planned.key.tile
    if mask.aligned(tile.block_m, tile.block_n) and (block_mask.WHOLE_TILES
                                                     or mods.mask_mod is None):
        return call, mods, planned
    mods = mods._replace(mask_mod=mask.exact_mod(mods.mask_mod), captures=mods.captures + (
        mask.block_kinds(call.batch, call.heads_q),))
    call = with_mods(call, mods)
    return call, mods, plan_of(call)


def needs_grad(mods: TracedMods) -> bool:
    """Whether the call's sinks or captured tensors make autograd record it (one of them
    requires grad, in grad mode)."""
    return torch.is_grad_enabled() and (
        (mods.sinks is not None and mods.sinks.requires_grad)
        or any(t.requires_grad for t in mods.captures))


def block_backward(call: AttentionCall, mods: TracedMods, deterministic: bool):
    """The backward of a block-sparse call (`api.autograd.BlockBackward`): the mask as a
    mask_mod reading the blocks' kinds (`exact_mask_mod`) among the forward's features, the
    kinds the one tensor more it reads; with `block_mask.SPARSE_BACKWARD` (not
    deterministic, whose turns count every query block) it walks the query tiles that meet
    listed blocks, else it visits every one (each masked there). Made from the call's mods
    before `exact_blocks`."""
    from ..mods import block_mask

    mask = mods.block_mask
    sparse = block_mask.SPARSE_BACKWARD and not deterministic
    features = call.features._replace(mask_mod=mask.exact_mod(mods.mask_mod),
                                      block_sparse=call.features.block_sparse if sparse else ())
    return BlockBackward(mask, features, (mask.block_kinds(call.batch, call.heads_q),))



def refuse_without_backward(mods: TracedMods) -> None:
    """What a call autograd must record cannot have: a score_mod indexing a captured tensor
    that requires grad through the score (`mods.grad.capture_derivatives` refuses it)."""
    if mods.score_mod is not None:
        from ..mods.grad import capture_derivatives

        slots = tuple(i for i, t in enumerate(mods.captures[:len(mods.score_mod.captures)])
                      if t.requires_grad)
        capture_derivatives(mods.score_mod, slots)


def refuse_under_compile(mods: TracedMods) -> None:
    """Mods met on fake tensors outside torch.compile (make_fx, export's tracing): their
    Python functions and captured tensors are read at the call, which a graph cannot hold
    (torch.compile takes them: `api.graph_mods`)."""
    if mods:
        raise ValueError("score_mod, mask_mod, sinks and block_mask cannot be traced into a "
                         "graph by make_fx or torch.export; torch.compile takes them")
