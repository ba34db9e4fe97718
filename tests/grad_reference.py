"""A float64 reference for attention gradients, on the GPU: plain torch ops (scores, mask,
softmax, P V) differentiated by torch.autograd, independent of cute_fa's kernels. GQA repeats
K/V heads here (the reference may; the kernels must not), so the gradients of the repeated heads
sum back into their K/V head through autograd. Which key a query sees is written here, from
flash-attn's definition (not imported from cute_fa.visibility, so that a convention bug in the
kernels' rule cannot pass unseen)."""

from __future__ import annotations

import math

import torch



def key_visible(query, key, *, causal: bool, causal_offset: int, window_size=(-1, -1)):
    """flash-attn's rule, bottom-right aligned by causal_offset = Sk - Sq (0: top-left): query
    i sees key j iff i + offset - left <= j <= i + offset + right, an unbounded side being -1;
    causal is right = 0."""
    left, right = window_size
    if causal:
        right = 0
    visible = True
    if right >= 0:
        visible = key <= query + causal_offset + right
    if left >= 0:
        visible = visible & (key >= query + causal_offset - left)
    return visible


def attention(q, k, v, *, causal=False, causal_offset=None, window_size=(-1, -1), softcap=0.0,
              scale=None):
    """o of (batch, seqlen, heads, head_dim) tensors in their own dtype (float64 for the
    reference): causal bottom-right unless causal_offset is given (0: top-left)."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    offset = sk - sq if causal_offset is None else causal_offset
    kr = k.repeat_interleave(hq // hk, dim=2)
    vr = v.repeat_interleave(hq // hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kr) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    qi = torch.arange(sq, device=q.device)[:, None]
    ki = torch.arange(sk, device=q.device)[None, :]
    seen = key_visible(qi, ki, causal=causal, causal_offset=offset, window_size=window_size)
    seen = torch.as_tensor(seen, device=q.device).expand(sq, sk)
    s = s.masked_fill(~seen, -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no visible key: o = 0
    return torch.einsum("bhqk,bkhd->bqhd", p.to(v.dtype), vr)


def grads(q, k, v, dout, **kw):
    """(o, dq, dk, dv) of `attention` at q, k, v (computed in q's dtype)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = attention(q, k, v, **kw)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), dout.to(o.dtype))
    return o.detach(), dq, dk, dv


def max_err(x, ref) -> float:
    return (x.double() - ref.double()).abs().max().item()


def check_grads(got, q, k, v, dout, **kw):
    """flash-attn's criterion for got = (dq, dk, dv): each one's error against the float64
    reference at most twice torch's own error (the same reference ops run in q's dtype) plus
    1e-3, in q's dtype and shape, without NaN."""
    ref = grads(q.double(), k.double(), v.double(), dout.double(), **kw)
    low = grads(q, k, v, dout, **kw)
    for name, mine, r, l in zip(("dq", "dk", "dv"), got, ref[1:], low[1:]):
        assert mine.dtype == q.dtype and mine.shape == r.shape, name
        assert not torch.isnan(mine).any(), f"NaN in {name}"
        err, torch_err = max_err(mine, r), max_err(l, r)
        assert err <= 2 * torch_err + 1e-3, f"{name}: {err} vs torch {torch_err}"
