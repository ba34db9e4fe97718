"""The backward entry points: `backward` (flash-attn's layout) and `backward_varlen` (a ragged
batch), the gradients of `forward` / `forward_varlen` given dout, the forward's out and lse.

Three launches (`kernels/bwd/`): D = rowsum(dout * out) and LSE in log2 units; the main kernel
(dK, dV per key block, dQ summed into float32); dQ converted. A fourth converts dK and dV where
the wgmma kernel splits a K/V group's query heads over CTAs (small GQA grids,
`tuning_bwd.bwd_head_splits`), which then sum them in float32 too. Every check runs before the
first launch, so a bad call leaves dq/dk/dv untouched. Autograd runs the same implementation
(`runtime.run.run_backward`).
"""

from __future__ import annotations

import torch

from ..runtime.call import DENSE, NO_WINDOW, RAGGED
from ..runtime.device import device
from ..runtime.plan import plan
from ..runtime.run import run_backward
from .checks import check_backward


def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, causal: bool = False,
             softmax_scale: float | None = None, *, window_size: tuple[int, int] = NO_WINDOW,
             softcap: float = 0.0, deterministic: bool | None = None,
             dq: torch.Tensor | None = None, dk: torch.Tensor | None = None,
             dv: torch.Tensor | None = None, bottom_right: bool = True, backend: str = "auto",
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of `forward(q, k, v, causal, softmax_scale, window_size=...,
    softcap=...)` given dout (its output's gradient), the forward's out and lse
    (`return_lse=True`). dq, dk, dv: tensors to write into (else new ones).
    deterministic: True forms dq's float32 sums in a fixed order (bitwise repeatable, slower),
    None follows `torch.use_deterministic_algorithms`. bottom_right=False: the top-left causal
    alignment of `sdpa`. GQA/MQA: dk, dv are summed over each K/V head's query heads.
    backend: the main kernel, "sm80" (mma.sync, any GPU), "sm90" (wgmma, Hopper, head_dim up
    to 128) or "auto" (`tuning_bwd.bwd_backend`'s choice).
    """
    call = check_backward(DENSE, dout, q, k, v, out, lse, causal=causal,
                          softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
                          deterministic=deterministic, dq=dq, dk=dk, dv=dv,
                          bottom_right=bottom_right, backend=backend)
    return run_backward(call, plan(call, device(call.device_index)), dout, q, k, v, out, lse,
                        dq, dk, dv)


def backward_varlen(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                    causal: bool = False, softmax_scale: float | None = None, *,
                    window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0,
                    deterministic: bool | None = None, backend: str = "auto",
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of `forward_varlen` (q (total_q, heads, head_dim), k, v (total_k,
    heads_kv, head_dim), lse (heads, total_q)). Rows of q past cu_seqlens_q[-1] get dq = 0, rows
    of k, v past cu_seqlens_k[-1] are not written.

    max_seqlen_q and max_seqlen_k must be at least the longest query and key sequence (they
    size the grids): each is checked to be at most its tensor's rows, and against cu_seqlens
    under CUTE_FA_CHECK_INDICES=1 (a device sync); otherwise a value too small gives keys past
    it no gradient (dk = dv = 0 there) and queries past it dq = 0, without an error.
    backend: as `backward`'s."""
    call = check_backward(RAGGED, dout, q, k, v, out, lse, causal=causal,
                          softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
                          deterministic=deterministic, cu_seqlens_q=cu_seqlens_q,
                          cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                          max_seqlen_k=max_seqlen_k, backend=backend)
    return run_backward(call, plan(call, device(call.device_index)), dout, q, k, v, out, lse,
                        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
