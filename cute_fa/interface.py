"""The public entry points: `forward` (flash-attn's layout) and `sdpa` (torch SDPA's layout).

Everything here is host code: argument checks (all of them before any launch,
so a bad call never touches `out`), kernel choice and the launch.
"""

from __future__ import annotations

import math

import torch

from .compiler import KernelKey, get_kernel
from .tuning import tile_config

_DTYPES = (torch.float16, torch.bfloat16)
_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} must be float16 or bfloat16, got {t.dtype}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D, got shape {tuple(t.shape)}")


def _check_layout(name: str, t) -> None:
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), "
                         f"got strides {t.stride()}")
    if any(s % 8 for s in t.stride()[:-1]):
        raise ValueError(f"{name} strides must be multiples of 8 elements (16 bytes), "
                         f"got {t.stride()}")
    if t.data_ptr() % 16:
        raise ValueError(f"{name} must start at a 16-byte aligned address")


def _check_device(name: str, t, device) -> None:
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device, got device '{t.device}'")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} like q, got {t.device}")


def _check_args(q, k, v, out, softmax_scale, causal, return_lse):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    if not (k.dtype == q.dtype and v.dtype == q.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    batch, seqlen_q, heads_q, head_dim = q.shape
    _, seqlen_k, heads_k, _ = k.shape
    if batch < 1 or seqlen_q < 1 or heads_q < 1:
        raise ValueError(f"q must have non-empty dimensions, got shape {tuple(q.shape)}")
    if head_dim % 8 or not 8 <= head_dim <= 256:
        raise ValueError(f"head_dim (q.shape[-1]) must be a multiple of 8 in [8, 256], got {head_dim}")
    expected_k = (batch, seqlen_k, heads_k, head_dim)
    if k.shape[0] != batch or k.shape[3] != head_dim or seqlen_k < 1 or heads_k < 1:
        raise ValueError(f"k must have shape (batch={batch}, seqlen_k>=1, heads_k>=1, "
                         f"head_dim={head_dim}), got {tuple(k.shape)}")
    if tuple(v.shape) != expected_k:
        raise ValueError(f"v must have the shape of k, {expected_k}, got {tuple(v.shape)}")
    if heads_q % heads_k:
        raise ValueError(f"the number of query heads ({heads_q}) must be a multiple of the number "
                         f"of key/value heads ({heads_k})")
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
                or not math.isfinite(softmax_scale) or softmax_scale <= 0:
            raise ValueError(f"softmax_scale must be a positive finite number or None, "
                             f"got {softmax_scale!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    if out is not None:
        _check_tensor("out", out)
        if out.dtype != q.dtype:
            raise TypeError(f"out must have dtype {q.dtype} like q, got {out.dtype}")
        if tuple(out.shape) != tuple(q.shape):
            raise ValueError(f"out must have the shape of q, {tuple(q.shape)}, got {tuple(out.shape)}")
    named = [(n, t) for n, t in (("q", q), ("k", k), ("v", v), ("out", out)) if t is not None]
    for name, t in named:
        _check_layout(name, t)
    for name, t in named:
        _check_device(name, t, q.device)


def _arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        raise RuntimeError(f"cute_fa needs an sm80 or newer GPU, {device} is sm{major}{minor}")
    suffix = "a" if major in (9, 10, 12) else ""
    return f"sm_{major}{minor}{suffix}"


def _run(q, k, v, *, causal, causal_offset, softmax_scale, out, return_lse):
    _check_args(q, k, v, out, softmax_scale, causal, return_lse)
    if not torch.cuda.is_available():
        raise RuntimeError("cute_fa needs a CUDA GPU and none is available")
    batch, seqlen_q, heads_q, head_dim = q.shape
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    key = KernelKey(_arch(q.device), causal,
                    tile_config(_arch(q.device), _DTYPE_NAMES[q.dtype], head_dim, causal))
    kernel = get_kernel(key)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, heads_q, seqlen_q, device=q.device, dtype=torch.float32)
    with torch.cuda.device(q.device):
        kernel(q.detach(), k.detach(), v.detach(), out.detach(), lse, scale, causal_offset)
    return (out, lse) if return_lse else out


def forward(q, k, v, causal=False, softmax_scale=None, return_lse=False, out=None):
    """FlashAttention forward in flash-attn's layout.

    q: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim),
    fp16 or bf16, heads_q a multiple of heads_kv (GQA/MQA). causal aligns the
    bottom-right corner (the last query sees the last key). Returns o, or
    (o, lse) with lse float32 (batch, heads_q, seqlen_q) in natural log; a query
    that sees no key gets o = 0 and lse = -inf.
    """
    causal_offset = k.shape[1] - q.shape[1] if isinstance(k, torch.Tensor) and isinstance(q, torch.Tensor) \
        and k.dim() == 4 and q.dim() == 4 else 0
    return _run(q, k, v, causal=causal, causal_offset=causal_offset, softmax_scale=softmax_scale,
                out=out, return_lse=return_lse)


def sdpa(q, k, v, is_causal=False, scale=None):
    """Like torch.nn.functional.scaled_dot_product_attention on (batch, heads, seqlen, head_dim).

    Top-left causal, as torch does; same kernel as `forward`, reached through strides.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seqlen, head_dim), got shape {tuple(t.shape)}")
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _run(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=is_causal,
         causal_offset=0, softmax_scale=scale, out=out.transpose(1, 2), return_lse=False)
    return out
