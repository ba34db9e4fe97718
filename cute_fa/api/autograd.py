"""Autograd for an eager call: a plain `torch.autograd.Function` around the forward and backward
implementations (`runtime.run`), so that a training step pays no torch.library dispatch on the
host. torch.compile traces the custom ops of `api.ops` instead, which run the same code."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..runtime.call import RAGGED, AttentionCall, backward_of
from ..runtime.device import device
from ..runtime.plan import plan
from ..runtime.run import kernel_ready, run_backward, run_forward, score_tensors


def _backward(ctx, dout, cu_seqlens_q=None, cu_seqlens_k=None) -> tuple:
    """(dq, dk, dv) of a call recorded without mods, whose q, k, v, o, lse the context saved
    first."""
    return backward_call(ctx.call, ctx.deterministic, dout, *ctx.saved_tensors[:5],
                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)


def backward_call(call: AttentionCall, deterministic: bool, dout, q, k, v, o, lse,
                  cu_seqlens_q=None, cu_seqlens_k=None, score_tensors=None,
                  capture_grads: tuple = (), grads: tuple = (), blocks=None) -> tuple:
    """(dq, dk, dv) of the forward call `call` and its q, k, v, o, lse; score_tensors: the
    tensors its mods read (`runtime.run.score_tensors`); grads: the float32 gradients of its
    score_mod's captures in the slots capture_grads, which the kernel adds to; blocks: a block
    mask's `BlockBackward` (its score features, and where they are block-sparse the query tile
    lists at the planned tile, between the two)."""
    call = backward_of(call, deterministic)._replace(capture_grads=capture_grads)
    if blocks is not None:
        call = call._replace(features=blocks.features)
    planned = plan(call, device(call.device_index))
    tensors = score_tensors or ()
    if blocks is not None and blocks.features.block_sparse:
        tile = planned.tile
        counts, indices = blocks.block_mask.query_tiles(tile.block_m, tile.block_n,
                                                        call.batch, call.heads_q)
        if cu_seqlens_q is not None:  # each entry's key tiles visit its own queries
            from ..mods.block_mask import per_sequence, sequence_tiles

            counts = per_sequence(counts, indices, sequence_tiles(cu_seqlens_k, tile.block_n),
                                  sequence_tiles(cu_seqlens_q, tile.block_m))
        tensors = tensors + (counts, indices)
    return run_backward(call, planned, kernel_ready(dout), q, k, v, o, lse,
                        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                        score_tensors=tensors + grads or None)


def _record(ctx, call, deterministic, lse, *saved) -> None:
    ctx.save_for_backward(*saved)
    ctx.call, ctx.deterministic = call, deterministic
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # no zeros are made for lse's (unused) gradient


class _Attention(torch.autograd.Function):
    """(o, lse) of a checked dense forward call; lse is not differentiable (as in flash-attn).
    Its own class, without the ragged batch's offsets: every argument of `apply` costs host
    time, and a training step makes this call once per layer."""

    @staticmethod
    def forward(ctx, call, deterministic, q, k, v):
        o, lse = run_forward(call, plan(call, device(call.device_index)), q, k, v,
                             return_lse=True)
        _record(ctx, call, deterministic, lse, q, k, v, o, lse)
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:  # o did not reach the loss
            return None, None, None, None, None
        return (None, None) + _backward(ctx, dout)


class _RaggedAttention(torch.autograd.Function):
    """`_Attention` over a ragged batch: the offsets are saved for the backward too."""

    @staticmethod
    def forward(ctx, call, deterministic, q, k, v, cu_seqlens_q, cu_seqlens_k):
        o, lse = run_forward(call, plan(call, device(call.device_index)), q, k, v,
                             cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                             return_lse=True)
        _record(ctx, call, deterministic, lse, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k)
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return None, None, None, None, None, None, None
        cu_q, cu_k = ctx.saved_tensors[5:]
        return (None, None) + _backward(ctx, dout, cu_q, cu_k) + (None, None)


class BlockBackward(NamedTuple):
    """A block-sparse call's backward (`api.mods.block_backward`): its forward's block mask
    (whose lists the forward kernel walks), the backward's score features (the mask as a
    mask_mod that reads the blocks' kinds, `mods.block_mask.exact_mask_mod`: the backward
    visits every key block) and the tensors that mask_mod reads past the forward's captures."""

    block_mask: object
    features: object
    extra: tuple


class _ScoredAttention(torch.autograd.Function):
    """`_Attention` (dense or ragged) with what the scores read: the mods' captured tensors
    and attention sinks, each with its gradient where it requires one. A float tensor the
    score_mod captures gets dL/dtensor from the backward kernel (`kernels.common.mods.
    add_capture_grads`, float32 sums cast to its dtype); one the mask_mod captures gets None
    (a mask is piecewise constant in it: its gradient is 0 almost everywhere). With sinks the
    backward kernels need nothing new: the forward's LSE holds the sink, so P = exp(S - LSE)
    is the real keys' weights, and the sink of head h, a key of value 0, gets
    dL/dsink_h = -sum over rows of h of exp(sink_h - LSE) * D, D = rowsum(dO * O). With mods
    the backward kernel runs them again (`call.features`, its key)."""

    @staticmethod
    def forward(ctx, call, deterministic, blocks, q, k, v, sinks, cu_seqlens_q, cu_seqlens_k,
                *captures):
        o, lse = run_forward(call, plan(call, device(call.device_index)), q, k, v,
                             cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                             return_lse=True, score_tensors=score_tensors(captures, sinks),
                             block_mask=blocks.block_mask if blocks is not None else None)
        ragged = call.layout == RAGGED
        _record(ctx, call, deterministic, lse, q, k, v, o, lse, sinks,
                *((cu_seqlens_q, cu_seqlens_k) if ragged else (None, None)), *captures)
        ctx.blocks = blocks
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        nothing = (None,) * len(ctx.saved_tensors)  # one per input of forward
        if dout is None:
            return nothing
        q, k, v, o, lse, sinks, cu_q, cu_k = ctx.saved_tensors[:8]
        captures = ctx.saved_tensors[8:]
        slots = capture_slots(ctx.call.features.score_mod, captures, ctx.needs_input_grad[9:])
        dq, dk, dv, dsinks, dcaptures = scored_backward(
            ctx.call, ctx.deterministic, dout, q, k, v, o, lse, sinks, cu_q, cu_k, captures,
            slots, ctx.blocks)
        return (None, None, None, dq, dk, dv, dsinks, None, None) + tuple(dcaptures)


def capture_slots(score_mod, captures, needs_grad) -> tuple:
    """The slots of the captures that get a gradient: the float tensors the score_mod reads
    (the first of `captures`; a mask_mod's get none) whose entry of needs_grad is true."""
    count = len(score_mod.captures) if score_mod is not None else 0
    return tuple(i for i in range(count) if needs_grad[i] and captures[i].is_floating_point())


def scored_backward(call: AttentionCall, deterministic: bool, dout, q, k, v, o, lse, sinks,
                    cu_seqlens_q, cu_seqlens_k, captures: tuple, slots: tuple,
                    blocks: BlockBackward | None = None) -> tuple:
    """(dq, dk, dv, dsinks, dcaptures) of a forward call with mods or sinks
    (`_ScoredAttention`; the custom op `cute_fa::bwd_mods`): dsinks None without sinks,
    dcaptures one per captured tensor, the gradient of those in `slots` (float tensors the
    score_mod reads), None for the others."""
    grads = tuple(torch.zeros(captures[i].shape or (1,), device=dout.device,
                              dtype=torch.float32) for i in slots)
    read = tuple(captures) + (blocks.extra if blocks is not None else ())
    dq, dk, dv = backward_call(call, deterministic, dout, q, k, v, o, lse, cu_seqlens_q,
                               cu_seqlens_k, score_tensors(read), slots, grads, blocks)
    dcaptures = [None] * len(captures)
    for i, grad in zip(slots, grads):
        dcaptures[i] = grad.reshape(captures[i].shape).to(captures[i].dtype)
    dsinks = None
    if sinks is not None:
        d = (dout.float() * o.float()).sum(-1)  # (batch, seqlen, heads) or (total, heads)
        if call.layout == RAGGED:  # lse (heads, total)
            p_sink = torch.exp(sinks.float()[:, None] - lse)
            dsinks = -(p_sink * d.transpose(0, 1)).sum(1)
        else:  # lse (batch, heads, seqlen)
            p_sink = torch.exp(sinks.float()[None, :, None] - lse)
            dsinks = -(p_sink * d.transpose(1, 2)).sum((0, 2))
        dsinks = dsinks.to(sinks.dtype)
    return dq, dk, dv, dsinks, dcaptures


def attention(call: AttentionCall, deterministic: bool, q, k, v, cu_seqlens_q=None,
              cu_seqlens_k=None, sinks=None, captures: tuple = (),
              blocks: BlockBackward | None = None) -> tuple:
    """(o, lse) recorded by autograd; lse None unless the call returns it. sinks: the call's
    sink logits, (heads_q,), whose gradient autograd gets too; captures: its mods' captured
    tensors (their gradients where they require one, `_ScoredAttention`); blocks: a
    block-sparse call's block mask and backward."""
    f = call.features
    if sinks is not None or f.score_mod is not None or f.mask_mod is not None \
            or blocks is not None:
        o, lse = _ScoredAttention.apply(call, deterministic, blocks, q, k, v, sinks,
                                        cu_seqlens_q, cu_seqlens_k, *captures)
    elif call.layout == RAGGED:
        o, lse = _RaggedAttention.apply(call, deterministic, q, k, v, cu_seqlens_q,
                                        cu_seqlens_k)
    else:
        o, lse = _Attention.apply(call, deterministic, q, k, v)
    return o, (lse if call.return_lse else None)
