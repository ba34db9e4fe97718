"""The backward pass, host side: `backward` (flash-attn's layout) and `backward_varlen` (a ragged
batch), the gradients of `forward` / `forward_varlen` given dout, the forward's out and lse.

Three launches (`kernels/bwd_preprocess.py`, `bwd_sm80.py`, `bwd_postprocess.py`): D =
rowsum(dout * out) and LSE in log2 units; the main kernel (dK, dV per key block, dQ summed
into float32 with atomics); dQ converted. Every check runs before the first launch, so a bad
call leaves dq/dk/dv untouched. Autograd (`cute_fa.ops`) calls these.
"""

from __future__ import annotations

import math

import torch

from . import interface as itf
from .compiler import get_kernel, memory_cache
from .tuning import bwd_keys, forced_tile_arch


def _check_grad_shape(name: str, t, like, like_name: str, layout: str) -> None:
    """dout, out (or a given dq/dk/dv): a tensor of `like`'s shape and dtype."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {itf._type_name(t)}")
    if t.dtype != like.dtype:
        raise TypeError(f"{name} must have dtype {like.dtype} like {like_name}, got {t.dtype}")
    if t.shape != like.shape:
        raise ValueError(f"{name} must have the shape of {like_name}, {layout} = "
                         f"{tuple(like.shape)}, got {tuple(t.shape)}")


def _check_grad_place(name: str, t, like) -> None:
    """... and the layout the kernels read (unit last stride, strides multiples of 8, 16-byte
    aligned), on `like`'s device."""
    itf._check_layout(name, t)
    itf._check_device(name, t, like.get_device())


def _check_lse(lse, shape: tuple, layout: str) -> None:
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"lse must be a torch.Tensor, got {itf._type_name(lse)}")
    if lse.dtype != torch.float32:
        raise TypeError(f"lse must be float32 (the forward's return_lse=True), got {lse.dtype}")
    if tuple(lse.shape) != shape:
        raise ValueError(f"lse must have shape {layout} = {shape}, got {tuple(lse.shape)}")
    if lse.stride(-1) != 1:
        raise ValueError(f"lse must have a contiguous last dimension, got strides "
                         f"{lse.stride()}")


def _check_all(tensors, q, layout: str) -> None:
    """tensors: (name, tensor, like name, like), each None or a gradient-like tensor: every
    shape and dtype first, then every layout and device (the order a user fixes them)."""
    given = [(name, t, like_name, like) for name, t, like_name, like in tensors if t is not None]
    for name, t, like_name, like in given:
        _check_grad_shape(name, t, like, like_name, layout)
    for name, t, _, like in given:
        _check_grad_place(name, t, like)


def _kernels(device_index: int, dtype, head_dim: int, features, varlen: bool,
             deterministic: bool) -> tuple:
    """The compiled (preprocess, main, postprocess) of one kind of call."""
    tile_arch = forced_tile_arch()
    request = ("bwd", device_index, dtype, head_dim, features.causal, features.local,
               features.softcap > 0, varlen, deterministic, tile_arch)
    held = memory_cache.get(request)
    if held is None:
        keys = bwd_keys(itf._arch(device_index), itf._DTYPE_NAMES[dtype], head_dim,
                        features.causal, local=features.local, softcap=features.softcap > 0,
                        varlen=varlen, deterministic=deterministic, tile_arch=tile_arch)
        held = memory_cache[request] = (tuple(get_kernel(k) for k in keys), keys[1].tile)
    return held


def _launch_backward(device_index, kernels, tile, dout4, q4, k4, v4, out4, lse3, dq4, dk4, dv4,
                     scale: float, causal_offset: int, features, deterministic: bool,
                     cu_seqlens=(None, None), max_seqlen_q: int = 0,
                     max_seqlen_k: int = 0) -> None:
    """The three launches over (batch, seqlen, heads, head_dim) views (ragged: batch 1)."""
    from .layouts.bwd import dq_accum_blocks

    pre, main, post = kernels
    batch, seqlen_q, heads_q, _ = q4.shape
    device = q4.device
    cu_q, cu_k = cu_seqlens
    entries = cu_q.shape[0] - 1 if cu_q is not None else 0
    rows = torch.empty((2, batch, heads_q, seqlen_q), device=device, dtype=torch.float32)
    lse_log2, dpsum = rows[0], rows[1]
    blocks = dq_accum_blocks(seqlen_q, tile.block_m, seqlen_q if entries else 0, entries)
    dq_accum = torch.zeros((batch, heads_q, blocks * tile.block_m * tile.head_dim_padded),
                           device=device, dtype=torch.float32)
    held = itf._placeholders(device_index)
    if deterministic:
        semaphore = torch.zeros((entries or batch, heads_q, dq_accum_blocks(
            max_seqlen_q if entries else seqlen_q, tile.block_m)), device=device,
            dtype=torch.int32)
    else:
        semaphore = held[1].view(1, 1, 1)
    cu_q = cu_q if cu_q is not None else held[1]
    itf._launch(device_index, pre, (out4, dout4, lse3, lse_log2, dpsum))
    itf._launch(device_index, main, (
        q4, k4, v4, dout4, lse_log2, dpsum, dq_accum, dk4, dv4, scale, causal_offset,
        features.window_left, features.window_right, features.softcap, cu_q,
        cu_k if cu_k is not None else held[1], max_seqlen_k, semaphore))
    itf._launch(device_index, post, (dq_accum, dq4, scale, cu_q, max_seqlen_q))


def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, causal: bool = False,
             softmax_scale: float | None = None, *, window_size: tuple[int, int] = itf.NO_WINDOW,
             softcap: float = 0.0, deterministic: bool | None = None,
             dq: torch.Tensor | None = None, dk: torch.Tensor | None = None,
             dv: torch.Tensor | None = None, bottom_right: bool = True,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of `forward(q, k, v, causal, softmax_scale, window_size=...,
    softcap=...)` given dout (its output's gradient), the forward's out and lse
    (`return_lse=True`). dq, dk, dv: tensors to write into (else new ones).
    deterministic: True forms dq's float32 sums in a fixed order (bitwise repeatable, slower),
    None follows `torch.use_deterministic_algorithms`. bottom_right=False: the top-left causal
    alignment of `sdpa`. GQA/MQA: dk, dv are summed over each K/V head's query heads.
    """
    layout = "(batch, seqlen_q, heads, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        itf._check_tensor(name, t)
    for name, t in (("dout", dout), ("out", out)):
        _check_grad_shape(name, t, q, "q", layout)
    batch, seqlen_q, heads_q, head_dim = q.shape
    _check_lse(lse, (batch, heads_q, seqlen_q), "(batch, heads_q, seqlen_q)")
    device_index, features, softmax_scale, _, _ = itf._check_args(
        q, k, v, None, softmax_scale, causal, False, "auto", window_size=window_size,
        softcap=softcap)
    _check_all((("dout", dout, "q", q), ("out", out, "q", q), ("dq", dq, "q", q),
                ("dk", dk, "k", k), ("dv", dv, "v", v)), q, layout)
    itf._check_device("lse", lse, device_index)
    deterministic = itf._as_deterministic(deterministic)
    kernels, tile = _kernels(device_index, q.dtype, head_dim, features, False, deterministic)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    causal_offset = k.shape[1] - seqlen_q if bottom_right else 0
    _launch_backward(device_index, kernels, tile, dout.detach(), q.detach(), k.detach(),
                     v.detach(), out.detach(), lse.detach(), dq, dk, dv, scale, causal_offset,
                     features, deterministic)
    return dq, dk, dv


def backward_varlen(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                    causal: bool = False, softmax_scale: float | None = None, *,
                    window_size: tuple[int, int] = itf.NO_WINDOW, softcap: float = 0.0,
                    deterministic: bool | None = None,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of `forward_varlen` (q (total_q, heads, head_dim), k, v (total_k,
    heads_kv, head_dim), lse (heads, total_q)); max_seqlen_k must be at least the longest key
    sequence (it sizes the grid). Rows of q past cu_seqlens_q[-1] get dq = 0, rows of k, v
    past cu_seqlens_k[-1] are not written."""
    layout = "(total_q, heads, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        itf._check_tensor(name, t, layout, rank=3)
    for name, t in (("dout", dout), ("out", out)):
        _check_grad_shape(name, t, q, "q", layout)
    total_q, heads_q, head_dim = q.shape
    _check_lse(lse, (heads_q, total_q), "(heads_q, total_q)")
    if cu_seqlens_k is None:
        raise ValueError("backward_varlen needs cu_seqlens_k (a paged K/V cache has no "
                         "gradient here)")
    device_index, features, softmax_scale, _, max_seqlen_q = itf._check_varlen_args(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, None, softmax_scale,
        causal, window_size, softcap, False, "auto", None, None)
    max_seqlen_k = itf._as_count("max_seqlen_k", max_seqlen_k)
    _check_all((("dout", dout, "q", q), ("out", out, "q", q)), q, layout)
    itf._check_device("lse", lse, device_index)
    if max_seqlen_k > k.shape[0]:
        raise ValueError(f"max_seqlen_k ({max_seqlen_k}) must be at most total_k = "
                         f"k.shape[0] = {k.shape[0]}")
    deterministic = itf._as_deterministic(deterministic)
    kernels, tile = _kernels(device_index, q.dtype, head_dim, features, True, deterministic)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    # rows outside every sequence get zero gradients (the kernels never write them)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if total_q and max_seqlen_q and max_seqlen_k:
        _launch_backward(device_index, kernels, tile, dout.detach()[None], q.detach()[None],
                         k.detach()[None], v.detach()[None], out.detach()[None],
                         lse.detach()[None], dq[None], dk[None], dv[None], scale, 0, features,
                         deterministic, (cu_seqlens_q, cu_seqlens_k), max_seqlen_q,
                         max_seqlen_k)
    else:
        dq.zero_()
    return dq, dk, dv
