"""cute_fa as torch.library custom ops: what torch.compile traces.

    cute_fa::fwd(q, k, v, ...)                 -> (out, lse)
    cute_fa::bwd(dout, q, k, v, out, lse, ...) -> (dq, dk, dv)
    cute_fa::fwd_varlen / bwd_varlen           the same over a ragged batch

Each has a fake (meta) implementation, so torch.compile traces a model through them without
running a kernel and without a graph break, at any (dynamic) sequence length; `fwd` and
`fwd_varlen` have their backward registered (`register_autograd`). Their eager bodies check
their call again (`api.checks`: the device and CUTE_FA_CHECK_INDICES' rules, which a trace
cannot) and run the implementation an eager call runs (`runtime.run`). Eager calls never come
here: without grad they go straight to the kernels, with grad through `api.autograd`.

lse is returned as a non-differentiable output (as in flash-attn): a loss that uses it gets
no gradient through it.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..runtime.call import DENSE, RAGGED
from ..runtime.device import device
from ..runtime.plan import plan
from ..runtime.run import kernel_ready, run_backward, run_forward
from .checks import check_backward, check_forward


@torch.library.custom_op("cute_fa::fwd", mutates_args=(), device_types="cuda")
def fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: Optional[float],
        window_left: int, window_right: int, softcap: float, bottom_right: bool, backend: str,
        deterministic: bool) -> tuple[Tensor, Tensor]:
    """`forward` with return_lse=True; deterministic is kept for the backward."""
    call = check_forward(DENSE, q, k, v, softmax_scale=softmax_scale, causal=causal,
                         return_lse=True, backend=backend,
                         window_size=(window_left, window_right), softcap=softcap,
                         bottom_right=bottom_right)
    return run_forward(call, plan(call, device(call.device_index)), q, k, v)


def forward_outputs_like(q: Tensor, ragged: bool) -> tuple[Tensor, Tensor]:
    """Empty (o, lse) of a forward on q: lse float32 (batch, heads, seqlen), or (heads,
    total_q) for a ragged batch. The forward ops' fake outputs."""
    if ragged:
        total_q, heads_q, _ = q.shape
        return torch.empty_like(q), q.new_empty((heads_q, total_q), dtype=torch.float32)
    batch, seqlen_q, heads_q, _ = q.shape
    return torch.empty_like(q), q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)


@fwd.register_fake
def _(q, k, v, causal, softmax_scale, window_left, window_right, softcap, bottom_right, backend,
      deterministic):
    return forward_outputs_like(q, ragged=False)


@torch.library.custom_op("cute_fa::bwd", mutates_args=(), device_types="cuda")
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool,
        softmax_scale: Optional[float], window_left: int, window_right: int, softcap: float,
        bottom_right: bool, deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    dout = kernel_ready(dout)
    call = check_backward(DENSE, dout, q, k, v, out, lse, causal=causal,
                          softmax_scale=softmax_scale, window_size=(window_left, window_right),
                          softcap=softcap, deterministic=deterministic,
                          bottom_right=bottom_right)
    return run_backward(call, plan(call, device(call.device_index)), dout, q, k, v, out, lse)


@bwd.register_fake
def _(dout, q, k, v, out, lse, causal, softmax_scale, window_left, window_right, softcap,
      bottom_right, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _fwd_setup(ctx, inputs, output):
    q, k, v, causal, scale, left, right, softcap, bottom_right, _, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = (causal, scale, left, right, softcap, bottom_right, deterministic)
    ctx.inputs = len(inputs)  # the backward returns a gradient (or None) for each
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # no zeros are made for lse's (unused) gradient


def _fwd_backward(ctx, dout, _dlse):
    if dout is None:  # out did not reach the loss
        return (None,) * ctx.inputs
    q, k, v, out, lse = ctx.saved_tensors
    return bwd(dout, q, k, v, out, lse, *ctx.args) + (None,) * (ctx.inputs - 3)


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup)


@torch.library.custom_op("cute_fa::fwd_varlen", mutates_args=(), device_types="cuda")
def fwd_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               max_seqlen_q: int, max_seqlen_k: int, causal: bool,
               softmax_scale: Optional[float], window_left: int, window_right: int,
               softcap: float, backend: str, deterministic: bool) -> tuple[Tensor, Tensor]:
    """`forward_varlen` with return_lse=True."""
    call = check_forward(RAGGED, q, k, v, softmax_scale=softmax_scale, causal=causal,
                         return_lse=True, backend=backend,
                         window_size=(window_left, window_right), softcap=softcap,
                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    return run_forward(call, plan(call, device(call.device_index)), q, k, v,
                       cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)


@fwd_varlen.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
      window_left, window_right, softcap, backend, deterministic):
    return forward_outputs_like(q, ragged=True)


@torch.library.custom_op("cute_fa::bwd_varlen", mutates_args=(), device_types="cuda")
def bwd_varlen(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
               cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
               causal: bool, softmax_scale: Optional[float], window_left: int,
               window_right: int, softcap: float, deterministic: bool
               ) -> tuple[Tensor, Tensor, Tensor]:
    dout = kernel_ready(dout)
    call = check_backward(RAGGED, dout, q, k, v, out, lse, causal=causal,
                          softmax_scale=softmax_scale, window_size=(window_left, window_right),
                          softcap=softcap, deterministic=deterministic,
                          cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                          max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    return run_backward(call, plan(call, device(call.device_index)), dout, q, k, v, out, lse,
                        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)


@bwd_varlen.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
      softmax_scale, window_left, window_right, softcap, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _varlen_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, left, right, softcap, _, det = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, causal, scale, left, right, softcap, det)
    ctx.inputs = len(inputs)
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _varlen_backward(ctx, dout, _dlse):
    if dout is None:
        return (None,) * ctx.inputs
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    grads = bwd_varlen(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args)
    return grads + (None,) * (ctx.inputs - 3)


fwd_varlen.register_autograd(_varlen_backward, setup_context=_varlen_setup)
