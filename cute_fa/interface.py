"""The public entry points: `forward` (flash-attn's layout) and `sdpa` (torch SDPA's layout).

Everything here is host code: argument checks (all of them before any launch,
so a bad call never touches `out`), kernel choice and the launch.
"""

from __future__ import annotations

import math
import numbers
from typing import Literal, overload

import torch

from .compiler import get_kernel, memory_cache
from .arch import Arch
from .layouts.config import check_head_dim
from .tuning import BACKENDS, check_backend, forced_tile_arch, kernel_key

Backend = Literal["auto", "sm80", "tma"]

_DTYPES = (torch.float16, torch.bfloat16)
_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _check_tensor(name: str, t, layout: str = "(batch, seqlen, heads, head_dim)") -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} must be float16 or bfloat16, got {t.dtype}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D {layout}, got shape {tuple(t.shape)}")


def _check_layout(name: str, t) -> None:
    s0, s1, s2, s3 = t.stride()
    if s3 != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), "
                         f"got strides {t.stride()}")
    if s0 % 8 or s1 % 8 or s2 % 8:
        raise ValueError(f"{name} strides must be multiples of 8 elements (16 bytes), "
                         f"got {t.stride()}")
    if t.data_ptr() % 16:
        raise ValueError(f"{name} must start at a 16-byte aligned address")


def _check_device(name: str, t, device_index: int) -> None:
    if not t.is_cuda:
        why = "" if torch.cuda.is_available() else \
            " (and torch sees no CUDA GPU here: torch.cuda.is_available() is False)"
        raise ValueError(f"{name} must be on a CUDA device, got device '{t.device}'{why}")
    if t.get_device() != device_index:
        raise ValueError(f"{name} must be on cuda:{device_index} like q, got {t.device}")


def _type_name(value) -> str:
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _as_bool(name: str, value) -> bool:
    """A Python bool, or numpy's (np.bool_, e.g. from a config array) taken as one."""
    if value is True or value is False:
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {_type_name(value)} {value!r}")


def _as_scale(name: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive finite float or None, "
                        f"got {_type_name(value)} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite float or None, got {value!r}")
    return float(value)


_FORWARD_NAMES = {"causal": "causal", "softmax_scale": "softmax_scale"}
_SDPA_NAMES = {"causal": "is_causal", "softmax_scale": "scale"}


def _check_args(q, k, v, out, softmax_scale, causal, return_lse, backend, names=_FORWARD_NAMES):
    """Every rule of a valid call, in the order a user fixes them: types, shapes, values,
    then where the tensors live. Returns (device index, causal, softmax_scale, return_lse)
    with the flags as Python bools and the scale as a float or None."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    if not (k.dtype == q.dtype and v.dtype == q.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    causal = _as_bool(names["causal"], causal)
    return_lse = _as_bool("return_lse", return_lse)
    softmax_scale = _as_scale(names["softmax_scale"], softmax_scale)
    check_backend(backend)
    batch, seqlen_q, heads_q, head_dim = q.shape
    _, seqlen_k, heads_k, _ = k.shape
    if batch < 1 or seqlen_q < 1 or heads_q < 1:
        raise ValueError(f"q must have non-empty dimensions, got shape {tuple(q.shape)}")
    check_head_dim("head_dim (q.shape[-1])", head_dim)
    if k.shape[0] != batch or k.shape[3] != head_dim or seqlen_k < 1 or heads_k < 1:
        raise ValueError(f"k must have shape (batch={batch}, seqlen_k>=1, heads_k>=1, "
                         f"head_dim={head_dim}), got {tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k, {tuple(k.shape)}, got {tuple(v.shape)}")
    if heads_q % heads_k:
        raise ValueError(f"the number of query heads ({heads_q}) must be a multiple of the number "
                         f"of key/value heads ({heads_k})")
    named = (("q", q), ("k", k), ("v", v))
    if out is not None:
        _check_tensor("out", out)
        if out.dtype != q.dtype:
            raise TypeError(f"out must have dtype {q.dtype} like q, got {out.dtype}")
        if out.shape != q.shape:
            raise ValueError(f"out must have the shape of q, {tuple(q.shape)}, got {tuple(out.shape)}")
        named += (("out", out),)
    for name, t in named:
        _check_layout(name, t)
    device_index = q.get_device()
    for name, t in named:
        _check_device(name, t, device_index)
    return device_index, causal, softmax_scale, return_lse


def _plainly_valid(q, k, v, out, softmax_scale, causal, return_lse, backend) -> bool:
    """A fast yes for the common valid call; anything else goes through `_check_args`,
    which accepts the same calls and names the problem in the others."""
    T = torch.Tensor
    if type(q) is not T or type(k) is not T or type(v) is not T:
        return False
    if (causal is not True and causal is not False) or \
            (return_lse is not True and return_lse is not False):
        return False
    if softmax_scale is not None and not (type(softmax_scale) is float
                                          and 0.0 < softmax_scale < math.inf):
        return False
    if backend not in BACKENDS:
        return False
    dtype = q.dtype
    if dtype not in _DTYPES or k.dtype != dtype or v.dtype != dtype:
        return False
    qs, ks = q.shape, k.shape
    if len(qs) != 4 or len(ks) != 4 or v.shape != ks:
        return False
    batch, seqlen_q, heads_q, head_dim = qs
    if ks[0] != batch or ks[3] != head_dim or min(batch, seqlen_q, heads_q, ks[1], ks[2]) < 1 \
            or head_dim % 8 or not 8 <= head_dim <= 256 or heads_q % ks[2]:
        return False
    tensors = (q, k, v)
    if out is not None:
        if type(out) is not T or out.dtype != dtype or out.shape != qs:
            return False
        tensors = (q, k, v, out)
    device = q.get_device()
    for t in tensors:
        s0, s1, s2, s3 = t.stride()
        if s3 != 1 or s0 % 8 or s1 % 8 or s2 % 8 or t.data_ptr() % 16 or not t.is_cuda \
                or t.get_device() != device:
            return False
    return True


_ARCH: dict = {}


def _arch(device_index: int) -> str:
    arch = _ARCH.get(device_index)
    if arch is None:
        if not torch.cuda.is_available():
            raise RuntimeError("cute_fa needs a CUDA GPU and none is available")
        major, minor = torch.cuda.get_device_capability(device_index)
        if major < 8:
            raise RuntimeError(f"cute_fa needs an sm80 or newer GPU, cuda:{device_index} is "
                               f"sm{major}{minor}")
        arch = _ARCH[device_index] = Arch(major, minor).name
    return arch


_GPU_COUNT: list = []


def _single_gpu() -> bool:
    if not _GPU_COUNT:
        _GPU_COUNT.append(torch.cuda.device_count())
    return _GPU_COUNT[0] == 1


_NO_LSE: dict = {}  # device index -> placeholder LSE tensor (the kernel does not write it)


def _kernel_for(device_index: int, dtype, head_dim: int, causal: bool, backend: str,
                lazy_rescale: bool = True):
    tile_arch = forced_tile_arch()
    # what a call asks for, as the in-memory cache's second index (no key to build per call)
    request = (device_index, dtype, head_dim, causal, backend, lazy_rescale, tile_arch)
    kernel = memory_cache.get(request)
    if kernel is None:
        key = kernel_key(_arch(device_index), _DTYPE_NAMES[dtype], head_dim, causal, backend,
                         lazy_rescale, tile_arch)
        kernel = memory_cache[request] = get_kernel(key)
    return kernel


def _run(q, k, v, *, causal, bottom_right, softmax_scale, out, return_lse, backend,
         lazy_rescale=True, names=_FORWARD_NAMES):
    if _plainly_valid(q, k, v, out, softmax_scale, causal, return_lse, backend):
        device_index = q.get_device()
    else:
        device_index, causal, softmax_scale, return_lse = _check_args(
            q, k, v, out, softmax_scale, causal, return_lse, backend, names)
    batch, seqlen_q, heads_q, head_dim = q.shape
    causal_offset = k.shape[1] - seqlen_q if bottom_right else 0
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    kernel = _kernel_for(device_index, q.dtype, head_dim, causal, backend, lazy_rescale)
    if out is None:
        out = torch.empty_like(q)  # q's memory order where q is dense, else contiguous
    if return_lse:
        lse = torch.empty((batch, heads_q, seqlen_q), device=q.device, dtype=torch.float32)
    else:
        lse = _NO_LSE.get(device_index)
        if lse is None:
            lse = _NO_LSE[device_index] = torch.empty((1, 1, 1), device=q.device,
                                                      dtype=torch.float32)
    if q.requires_grad or k.requires_grad or v.requires_grad:
        q, k, v = q.detach(), k.detach(), v.detach()  # DLPack refuses tensors needing grad
    # the kernel launches on the current stream of the current device
    if _single_gpu() or device_index == torch.cuda.current_device():
        kernel(q, k, v, out, lse, scale, causal_offset, int(return_lse))
    else:
        with torch.cuda.device(device_index):
            kernel(q, k, v, out, lse, scale, causal_offset, int(return_lse))
    return (out, lse) if return_lse else out


@overload
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = ...,
            softmax_scale: float | None = ..., return_lse: Literal[False] = ...,
            out: torch.Tensor | None = ..., backend: Backend = ...) -> torch.Tensor: ...


@overload
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = ...,
            softmax_scale: float | None = ..., *, return_lse: Literal[True],
            out: torch.Tensor | None = ...,
            backend: Backend = ...) -> tuple[torch.Tensor, torch.Tensor]: ...


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
            softmax_scale: float | None = None, return_lse: bool = False,
            out: torch.Tensor | None = None,
            backend: Backend = "auto") -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention forward in flash-attn's layout.

    q: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim),
    fp16 or bf16, heads_q a multiple of heads_kv (GQA/MQA). causal aligns the
    bottom-right corner (the last query sees the last key). Returns o, or
    (o, lse) with lse float32 (batch, heads_q, seqlen_q) in natural log; a query
    that sees no key gets o = 0 and lse = -inf.
    backend: 'sm80' (cp.async, any sm80+ GPU), 'tma' (TMA + mbarrier, sm90+) or
    'auto' (the faster of the two measured for this GPU, see cute_fa/tuning.py).
    """
    return _run(q, k, v, causal=causal, bottom_right=True, softmax_scale=softmax_scale, out=out,
                return_lse=return_lse, backend=backend)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
         scale: float | None = None, backend: Backend = "auto") -> torch.Tensor:
    """Like torch.nn.functional.scaled_dot_product_attention on (batch, heads, seqlen, head_dim).

    Top-left causal, as torch does; same kernel as `forward`, reached through strides.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):  # before the transposes below
        _check_tensor(name, t, "(batch, heads, seqlen, head_dim)")
    out = torch.empty_like(q)
    _run(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=is_causal,
         bottom_right=False, softmax_scale=scale, out=out.transpose(1, 2), return_lse=False,
         backend=backend, names=_SDPA_NAMES)
    return out
