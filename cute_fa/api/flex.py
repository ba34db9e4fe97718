"""`flex_attention`: torch's `torch.nn.attention.flex_attention.flex_attention` call, on
cute_fa's kernels (`forward` with score_mod and block_mask), for code written against torch's."""

from __future__ import annotations

from typing import Callable

import torch

from .checks import check_tensor
from .forward import Backend, forward


def flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   score_mod: Callable | None = None, block_mask: object = None,
                   scale: float | None = None, enable_gqa: bool = False,
                   return_lse: bool = False, *, sinks: torch.Tensor | None = None,
                   backend: Backend = "auto"
                   ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """torch's flex_attention on (batch, heads, seqlen, head_dim) tensors, fp16 or bf16:
    score_mod(score, b, h, q_idx, kv_idx) and block_mask (torch's `create_block_mask`'s or
    cute_fa's, `cute_fa.mods.block_mask.create_block_mask`) as torch takes them; scale
    defaults to 1/sqrt(head_dim). Returns out (batch, heads, seqlen_q, head_dim), and with
    return_lse the natural-log LSE (batch, heads, seqlen_q). Where key and value have fewer
    heads than query (GQA), enable_gqa must be True, as in torch. What `forward`'s score_mod,
    block_mask and sinks document holds here, their gradients included."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_tensor(name, t, "(batch, heads, seqlen, head_dim)")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    if not enable_gqa and query.shape[1] != key.shape[1]:
        raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass "
                         f"enable_gqa=True for grouped-query attention")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    got = forward(q, k, v, softmax_scale=scale, return_lse=return_lse, backend=backend,
                  score_mod=score_mod, block_mask=block_mask, sinks=sinks)
    if return_lse:
        return got[0].transpose(1, 2), got[1]
    return got.transpose(1, 2)
