"""Autograd for an eager call: a plain `torch.autograd.Function` around the forward and backward
implementations (`runtime.run`), so that a training step pays no torch.library dispatch on the
host. torch.compile traces the custom ops of `api.ops` instead, which run the same code."""

from __future__ import annotations

import torch

from ..runtime.call import RAGGED, AttentionCall, backward_of
from ..runtime.device import device
from ..runtime.plan import plan
from ..runtime.run import kernel_ready, run_backward, run_forward, score_tensors


def _backward(ctx, dout, cu_seqlens_q=None, cu_seqlens_k=None) -> tuple:
    """(dq, dk, dv) of a recorded call, whose q, k, v, o, lse the context saved first."""
    q, k, v, o, lse = ctx.saved_tensors[:5]
    call = backward_of(ctx.call, ctx.deterministic)
    return run_backward(call, plan(call, device(call.device_index)), kernel_ready(dout), q, k,
                        v, o, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)


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


class _SinkAttention(torch.autograd.Function):
    """`_Attention` (dense or ragged) with attention sinks, which get their gradient too. The
    backward kernels need nothing new: the forward's LSE holds the sink, so P = exp(S - LSE)
    is the real keys' weights. The sink of head h, a key of value 0, gets
    dL/dsink_h = -sum over rows of h of exp(sink_h - LSE) * D, D = rowsum(dO * O)."""

    @staticmethod
    def forward(ctx, call, deterministic, q, k, v, sinks, cu_seqlens_q, cu_seqlens_k):
        o, lse = run_forward(call, plan(call, device(call.device_index)), q, k, v,
                             cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                             return_lse=True, score_tensors=score_tensors((), sinks))
        ragged = call.layout == RAGGED
        _record(ctx, call, deterministic, lse, q, k, v, o, lse, sinks,
                *((cu_seqlens_q, cu_seqlens_k) if ragged else ()))
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return (None,) * 8
        q, k, v, o, lse, sinks = ctx.saved_tensors[:6]
        dq, dk, dv = _backward(ctx, dout, *ctx.saved_tensors[6:])
        d = (dout.float() * o.float()).sum(-1)  # (batch, seqlen, heads) or (total, heads)
        if ctx.call.layout == RAGGED:  # lse (heads, total)
            p_sink = torch.exp(sinks.float()[:, None] - lse)
            dsinks = -(p_sink * d.transpose(0, 1)).sum(1)
        else:  # lse (batch, heads, seqlen)
            p_sink = torch.exp(sinks.float()[None, :, None] - lse)
            dsinks = -(p_sink * d.transpose(1, 2)).sum((0, 2))
        return None, None, dq, dk, dv, dsinks.to(sinks.dtype), None, None


def attention(call: AttentionCall, deterministic: bool, q, k, v, cu_seqlens_q=None,
              cu_seqlens_k=None, sinks=None) -> tuple:
    """(o, lse) recorded by autograd; lse None unless the call returns it. sinks: the call's
    sink logits, (heads_q,), whose gradient autograd gets too."""
    if sinks is not None:
        o, lse = _SinkAttention.apply(call, deterministic, q, k, v, sinks, cu_seqlens_q,
                                      cu_seqlens_k)
    elif call.layout == RAGGED:
        o, lse = _RaggedAttention.apply(call, deterministic, q, k, v, cu_seqlens_q,
                                        cu_seqlens_k)
    else:
        o, lse = _Attention.apply(call, deterministic, q, k, v)
    return o, (lse if call.return_lse else None)
