"""Autograd for an eager call: a plain `torch.autograd.Function` around the forward and backward
implementations (`runtime.run`), so that a training step pays no torch.library dispatch on the
host. torch.compile traces the custom ops of `api.ops` instead, which run the same code."""

from __future__ import annotations

import torch

from ..runtime.call import RAGGED, AttentionCall, backward_of
from ..runtime.device import device
from ..runtime.plan import plan
from ..runtime.run import kernel_ready, run_backward, run_forward, score_tensors


def _backward(ctx, dout, cu_seqlens_q=None, cu_seqlens_k=None, score_tensors=None,
              capture_grads: tuple = ()) -> tuple:
    """(dq, dk, dv) of a recorded call, whose q, k, v, o, lse the context saved first;
    score_tensors: the tensors its mods read (`runtime.run.score_tensors`), then the float32
    gradients of its score_mod's captures in the slots capture_grads, which the kernel adds to."""
    q, k, v, o, lse = ctx.saved_tensors[:5]
    call = backward_of(ctx.call, ctx.deterministic)._replace(capture_grads=capture_grads)
    return run_backward(call, plan(call, device(call.device_index)), kernel_ready(dout), q, k,
                        v, o, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                        score_tensors=score_tensors)


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
    def forward(ctx, call, deterministic, q, k, v, sinks, cu_seqlens_q, cu_seqlens_k,
                *captures):
        o, lse = run_forward(call, plan(call, device(call.device_index)), q, k, v,
                             cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                             return_lse=True, score_tensors=score_tensors(captures, sinks))
        ragged = call.layout == RAGGED
        _record(ctx, call, deterministic, lse, q, k, v, o, lse, sinks,
                *((cu_seqlens_q, cu_seqlens_k) if ragged else (None, None)), *captures)
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        nothing = (None,) * len(ctx.saved_tensors)  # one per input of forward
        if dout is None:
            return nothing
        _, _, _, o, lse, sinks, cu_q, cu_k = ctx.saved_tensors[:8]
        captures = ctx.saved_tensors[8:]
        score_mod = ctx.call.features.score_mod
        slots = tuple(i for i in range(len(score_mod.captures) if score_mod is not None else 0)
                      if ctx.needs_input_grad[8 + i] and captures[i].is_floating_point())
        grads = tuple(torch.zeros(captures[i].shape or (1,), device=dout.device,
                                  dtype=torch.float32) for i in slots)
        dq, dk, dv = _backward(ctx, dout, cu_q, cu_k,
                               (score_tensors(captures) or ()) + grads or None, slots)
        dcaptures = [None] * len(captures)
        for i, grad in zip(slots, grads):
            dcaptures[i] = grad.reshape(captures[i].shape).to(captures[i].dtype)
        dsinks = None
        if sinks is not None:
            d = (dout.float() * o.float()).sum(-1)  # (batch, seqlen, heads) or (total, heads)
            if ctx.call.layout == RAGGED:  # lse (heads, total)
                p_sink = torch.exp(sinks.float()[:, None] - lse)
                dsinks = -(p_sink * d.transpose(0, 1)).sum(1)
            else:  # lse (batch, heads, seqlen)
                p_sink = torch.exp(sinks.float()[None, :, None] - lse)
                dsinks = -(p_sink * d.transpose(1, 2)).sum((0, 2))
            dsinks = dsinks.to(sinks.dtype)
        return (None, None, dq, dk, dv, dsinks, None, None) + tuple(dcaptures)


def attention(call: AttentionCall, deterministic: bool, q, k, v, cu_seqlens_q=None,
              cu_seqlens_k=None, sinks=None, captures: tuple = ()) -> tuple:
    """(o, lse) recorded by autograd; lse None unless the call returns it. sinks: the call's
    sink logits, (heads_q,), whose gradient autograd gets too; captures: its mods' captured
    tensors (their gradients where they require one, `_ScoredAttention`)."""
    f = call.features
    if sinks is not None or f.score_mod is not None or f.mask_mod is not None:
        o, lse = _ScoredAttention.apply(call, deterministic, q, k, v, sinks, cu_seqlens_q,
                                        cu_seqlens_k, *captures)
    elif call.layout == RAGGED:
        o, lse = _RaggedAttention.apply(call, deterministic, q, k, v, cu_seqlens_q,
                                        cu_seqlens_k)
    else:
        o, lse = _Attention.apply(call, deterministic, q, k, v)
    return o, (lse if call.return_lse else None)
