"""Float64 attention with mods, on torch tensors in cute_fa's layout: the reference a kernel's
score_mod / mask_mod will be checked against. FlexAttention's order: the scores are scaled,
then the score_mod sees them, then the mask_mod's False keys get -inf. A query with no key
left gets o = 0 and lse = -inf (as cute_fa's other kernels)."""

from __future__ import annotations

import math

import torch

from .dense import evaluate, index_grid
from .trace import trace_mask_mod, trace_score_mod


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, score_mod=None,
              mask_mod=None, block_mask=None, scale: float | None = None,
              sinks: torch.Tensor | None = None) -> tuple:
    """(o, lse) in float64 for q (batch, seqlen_q, heads_q, d), k and v (batch, seqlen_k,
    heads_kv, d) with heads_q a multiple of heads_kv (GQA: query head h reads K/V head
    h // (heads_q // heads_kv)); o as q, lse (batch, heads_q, seqlen_q) in natural log. The
    mods are traced (`trace.py`) and evaluated densely (`dense.py`). block_mask
    (`block_mask.BlockMask`), as FlexAttention's: its full blocks are seen whole, its partial
    ones through its own mask_mod, the rest not at all (then mask_mod must be None). sinks
    (heads_q,): a logit per query head, one more term of every row's softmax, of a key with
    value 0 (gpt-oss's attention sinks)."""
    if block_mask is not None and mask_mod is not None:
        raise ValueError("pass the mask as mask_mod or in block_mask (its mask_mod), not both")
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    qd, kd, vd = (t.detach().to(torch.float64).transpose(1, 2) for t in (q, k, v))
    kd, vd = (t.repeat_interleave(group, dim=1) for t in (kd, vd))
    s = torch.einsum("bhqd,bhkd->bhqk", qd, kd) * scale
    device = s.device
    index = index_grid(batch, heads_q, seqlen_q, seqlen_k, device)
    if score_mod is not None:
        graph, captured = trace_score_mod(score_mod)
        s = evaluate(graph, captured, score=s, **index).expand_as(s)
    if mask_mod is not None:
        graph, captured = trace_mask_mod(mask_mod)
        s = torch.where(evaluate(graph, captured, **index), s, -math.inf)
    if block_mask is not None:
        s = torch.where(block_mask.dense().to(device), s, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    if sinks is not None:
        sink = sinks.detach().to(device, torch.float64)[None, :, None].expand_as(lse)
        lse = torch.logaddexp(lse, sink)
    empty = torch.isneginf(lse)
    p = torch.exp(s - torch.where(empty, 0.0, lse)[..., None])
    o = torch.einsum("bhqk,bhkd->bhqd", p, vd).masked_fill(empty[..., None], 0.0)
    return o.transpose(1, 2), lse
