"""The public entry points: `forward` (flash-attn's layout), `forward_varlen` (a ragged batch
packed end to end, flash-attn's varlen layout) and `sdpa` (torch SDPA's layout).

Everything here is host code: argument checks (all of them before any launch,
so a bad call never touches `out`), kernel choice and the launch.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from typing import Literal, overload

import torch

from .compiler import get_kernel, memory_cache
from .arch import Arch
from .backends import MergeKey
from .layouts.config import check_head_dim
from .tuning import (BACKENDS, DECODE_MAX_SEQLEN_Q, MAX_PAGE_SIZE, MAX_SEQLEN_Q, MAX_SPLITS,
                     PREFILL_ONLY, auto_short_causal, check_backend, decode_ctas_per_sm,
                     decode_key, decode_rows_class, forced_tile_arch, is_small_grid,
                     kernel_key, num_splits_heuristic, supported_page_size)

Backend = Literal["auto", "sm80", "tma", "sm90"]

_DTYPES = (torch.float16, torch.bfloat16)
_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _check_tensor(name: str, t, layout: str = "(batch, seqlen, heads, head_dim)",
                  rank: int = 4) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} must be float16 or bfloat16, got {t.dtype}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D {layout}, got shape {tuple(t.shape)}")


def _check_layout(name: str, t, names=None) -> None:
    *outer, last = t.stride()
    if last != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), "
                         f"got strides {_shown(t.stride(), names or {})}")
    if any(s % 8 for s in outer):
        raise ValueError(f"{name} strides must be multiples of 8 elements (16 bytes), "
                         f"got {_shown(t.stride(), names or {})}")
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


def _window_ints(window_size) -> tuple[int, int]:
    """window_size as (left, right) ints, or a TypeError naming what it must be."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or any(
            isinstance(w, bool) or not isinstance(w, numbers.Integral) for w in window_size):
        raise TypeError(f"window_size must be a pair of ints (left, right), -1 for an unbounded "
                        f"side, got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


NO_WINDOW = (-1, -1)
# the lower edge of a window with an unbounded left side that still has a lower-edge kernel
# (its right side is bounded): further left than any key of any sequence
_FAR_LEFT = 1 << 30


@dataclasses.dataclass(frozen=True)
class ScoreFeatures:
    """What a call asks of the scores besides the scale: causal (an upper edge, moved right by
    window_right), a sliding window's lower edge (local, window_left keys left of the
    diagonal) and a softcap (0: none). `causal` and `local` are kernel key fields; the rest
    are kernel arguments."""

    causal: bool
    local: bool = False
    window_left: int = 0
    window_right: int = 0
    softcap: float = 0.0


def _score_features(causal: bool, window_size, softcap) -> ScoreFeatures:
    """window_size = (left, right) in flash-attn's sense: query i sees keys i + Sk - Sq - left
    ... i + Sk - Sq + right, -1 for an unbounded side. causal and a window both apply: the
    keys a query sees are those of the window up to the diagonal (right side 0), as in
    flash-attn."""
    if window_size is NO_WINDOW and softcap == 0.0:
        return ScoreFeatures(causal)
    left, right = _window_ints(window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size sides must be -1 (unbounded) or >= 0, got {(left, right)}")
    # a side past any sequence is unbounded (the kernels' key offsets stay within int32)
    left = -1 if left >= _FAR_LEFT else left
    right = -1 if right >= _FAR_LEFT else right
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float >= 0 (0: none), got {_type_name(softcap)} "
                        f"{softcap!r}")
    if not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be a finite float >= 0 (0: none), got {softcap!r}")
    if causal:
        right = 0
    local = left >= 0 or right > 0
    return ScoreFeatures(causal=causal or right >= 0, local=local,
                         window_left=left if left >= 0 else _FAR_LEFT,
                         window_right=max(right, 0), softcap=float(softcap))


_FORWARD_NAMES = {"causal": "causal", "softmax_scale": "softmax_scale"}
# sdpa's tensors reach the checks transposed to (B, S, H, D); its errors show them as written
_SDPA_NAMES = {"causal": "is_causal", "softmax_scale": "scale", "bhsd": True}


def _shown(dims, names) -> tuple:
    """A (B, S, H, D)-ordered shape or stride as the caller wrote it (sdpa: (B, H, S, D))."""
    dims = tuple(dims)
    return (dims[0], dims[2], dims[1], dims[3]) if names.get("bhsd") and len(dims) == 4 \
        else dims


def _check_args(q, k, v, out, softmax_scale, causal, return_lse, backend, names=_FORWARD_NAMES,
                seqused_k=None, page_table=None, num_splits=None, window_size=NO_WINDOW,
                softcap=0.0):
    """Every rule of a valid call, in the order a user fixes them: types, shapes, values,
    then where the tensors live. Returns (device index, ScoreFeatures, softmax_scale,
    return_lse, num_splits) with return_lse a Python bool, the scale a float or None and
    num_splits an int or None. With a page_table, k and v are a paged cache (num_pages,
    page_size, heads_kv, head_dim)."""
    paged = page_table is not None
    kv_layout = "(num_pages, page_size, heads_kv, head_dim)" if paged else \
        "(batch, seqlen, heads, head_dim)"
    _check_tensor("q", q)
    _check_tensor("k", k, kv_layout)
    _check_tensor("v", v, kv_layout)
    if not (k.dtype == q.dtype and v.dtype == q.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    causal = _as_bool(names["causal"], causal)
    return_lse = _as_bool("return_lse", return_lse)
    softmax_scale = _as_scale(names["softmax_scale"], softmax_scale)
    features = _score_features(causal, window_size, softcap)
    check_backend(backend)
    batch, seqlen_q, heads_q, head_dim = q.shape
    _, seqlen_k, heads_k, _ = k.shape
    if batch < 1 or seqlen_q < 1 or heads_q < 1:
        raise ValueError(f"q must have non-empty dimensions, got shape {_shown(q.shape, names)}")
    _check_query_blocks(f"seqlen_q (q.shape[{2 if names.get('bhsd') else 1}])", seqlen_q)
    check_head_dim("head_dim (q.shape[-1])", head_dim)
    if paged:
        if k.shape[0] < 1 or k.shape[3] != head_dim or heads_k < 1:
            raise ValueError(f"k must be a paged cache of shape (num_pages>=1, page_size, "
                             f"heads_kv>=1, head_dim={head_dim}), got {tuple(k.shape)}")
        if not supported_page_size(seqlen_k):
            raise ValueError(f"the page size (k.shape[1]) must be a multiple of 16 from 16 to "
                             f"{MAX_PAGE_SIZE}, got {seqlen_k}")
    elif k.shape[0] != batch or k.shape[3] != head_dim or seqlen_k < 1 or heads_k < 1:
        middle = "heads_k>=1, seqlen_k>=1" if names.get("bhsd") else "seqlen_k>=1, heads_k>=1"
        raise ValueError(f"k must have shape (batch={batch}, {middle}, head_dim={head_dim}), "
                         f"got {_shown(k.shape, names)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k, {_shown(k.shape, names)}, "
                         f"got {_shown(v.shape, names)}")
    if heads_q % heads_k:
        raise ValueError(f"the number of query heads ({heads_q}) must be a multiple of the number "
                         f"of key/value heads ({heads_k})")
    named = (("q", q), ("k", k), ("v", v)) + _checked_out(out, q, names)
    for name, t in named:
        _check_layout(name, t, names)
    num_splits = _check_decode_args(q, seqused_k, page_table, num_splits, backend)
    device_index = q.get_device()
    for name, t in named + (("seqused_k", seqused_k), ("page_table", page_table)):
        if t is not None:
            _check_device(name, t, device_index)
    if (seqused_k is not None or paged) and \
            os.environ.get("CUTE_FA_CHECK_INDICES", "") not in ("", "0"):
        _check_index_values(k, seqused_k, page_table)
    return device_index, features, softmax_scale, return_lse, num_splits


def _check_query_blocks(name: str, seqlen_q: int) -> None:
    """Causal kernels put the query blocks on the grid's y (longest first across heads), whose
    extent is at most 65535."""
    if seqlen_q > MAX_SEQLEN_Q:
        raise ValueError(f"{name} must be at most {MAX_SEQLEN_Q} (65535 query blocks of 64 "
                         f"rows), got {seqlen_q}")


def _checked_out(out, q, names=_FORWARD_NAMES, layout="(batch, seqlen, heads, head_dim)",
                 rank: int = 4) -> tuple:
    """(("out", out),) once `out` is a tensor of q's dtype and shape, () for None."""
    if out is None:
        return ()
    _check_tensor("out", out, layout, rank)
    if out.dtype != q.dtype:
        raise TypeError(f"out must have dtype {q.dtype} like q, got {out.dtype}")
    if out.shape != q.shape:
        raise ValueError(f"out must have the shape of q, {_shown(q.shape, names)}, "
                         f"got {_shown(out.shape, names)}")
    return (("out", out),)


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
            or seqlen_q > MAX_SEQLEN_Q \
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


def _kernel_ready(t: torch.Tensor) -> torch.Tensor:
    """`t` (3-D or 4-D) itself where its strides suit the kernels (last stride 1, the others
    multiples of 8 elements, 16-byte aligned), else a dense copy: what HF transformers' views
    and autograd's expanded gradients need. The kernels check the strides of size-1
    dimensions too, which `.contiguous()` leaves as they are, hence the clone."""
    s0, s1, s2, s3 = t.stride() if t.dim() == 4 else (0,) + t.stride()
    if s3 == 1 and not (s0 % 8 or s1 % 8 or s2 % 8 or t.data_ptr() % 16):
        return t
    return t.clone(memory_format=torch.contiguous_format)


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


_PLACEHOLDERS: dict = {}


def _placeholders(device_index: int) -> tuple:
    """Tensors a kernel takes but does not read (its key does not ask for them): LSE when
    none is returned, seqused_k and page_table without a cache of that kind."""
    held = _PLACEHOLDERS.get(device_index)
    if held is None:
        device = torch.device("cuda", device_index)
        held = _PLACEHOLDERS[device_index] = (
            torch.empty((1, 1, 1), device=device, dtype=torch.float32),
            torch.zeros((1,), device=device, dtype=torch.int32),
            torch.zeros((1, 1), device=device, dtype=torch.int32))
    return held


def _kernel_for(device_index: int, dtype, head_dim: int, features: ScoreFeatures, backend: str,
                lazy_rescale: bool = True, varlen: bool = False, small_grid: bool = False,
                seqlen_q: int | None = None):
    """The compiled kernel for a call without decode arguments; seqlen_q (the longest of a
    ragged batch) matters to 'auto' only through `tuning.auto_short_causal`."""
    tile_arch = forced_tile_arch()
    # what a call asks for, as the in-memory cache's second index (no key to build per call)
    request = (device_index, dtype, head_dim, features.causal, features.local,
               features.softcap > 0, varlen, backend, lazy_rescale, tile_arch, small_grid,
               backend == "auto" and auto_short_causal(tile_arch or _arch(device_index),
                                                       head_dim, features.causal, seqlen_q))
    kernel = memory_cache.get(request)
    if kernel is None:
        key = kernel_key(_arch(device_index), _DTYPE_NAMES[dtype], head_dim, features.causal,
                         backend, lazy_rescale, tile_arch, local=features.local,
                         softcap=features.softcap > 0, varlen=varlen, small_grid=small_grid,
                         seqlen_q=seqlen_q)
        kernel = memory_cache[request] = get_kernel(key)
    return kernel


def _check_cache_tensors(seqused_k, page_table, batch: int) -> None:
    """seqused_k int32 (batch,) and page_table int32 (batch, pages >= 1), each None or a tensor
    with a contiguous last dimension."""
    for name, t, rank, shape in (("seqused_k", seqused_k, 1, "(batch,)"),
                                 ("page_table", page_table, 2, "(batch, max_pages_per_seq)")):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {_type_name(t)}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be an int32 tensor, got {t.dtype}")
        if t.dim() != rank or t.shape[0] != batch or (rank == 2 and t.shape[1] < 1):
            raise ValueError(f"{name} must have shape {shape} with batch={batch}, "
                             f"got {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension, got strides "
                             f"{t.stride()}")


def _check_decode_args(q, seqused_k, page_table, num_splits, backend) -> int | None:
    """The rules of the KV-cache arguments but where they live; returns num_splits as an int
    or None. Values inside seqused_k and page_table are trusted, unless
    CUTE_FA_CHECK_INDICES=1 asks for them to be checked (a device sync, `_check_args`)."""
    batch = q.shape[0]
    _check_cache_tensors(seqused_k, page_table, batch)
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral):
            raise TypeError(f"num_splits must be an int or None, got {_type_name(num_splits)} "
                            f"{num_splits!r}")
        num_splits = int(num_splits)
        if not 1 <= num_splits <= MAX_SPLITS:
            raise ValueError(f"num_splits must be from 1 to {MAX_SPLITS} or None, "
                             f"got {num_splits}")
        if batch * num_splits > 65535:
            raise ValueError(f"num_splits * batch must be at most 65535 (the grid's z), got "
                             f"{num_splits} * {batch}")
    if backend in PREFILL_ONLY and (seqused_k is not None or page_table is not None
                                    or (num_splits or 1) > 1):
        raise ValueError(f"backend={backend!r} takes no seqused_k, page_table or num_splits > 1 "
                         f"(the cp.async kernel runs decode); use backend='sm80' or 'auto'")
    return num_splits


def _check_index_values(k, seqused_k, page_table) -> None:
    """CUTE_FA_CHECK_INDICES=1: every key count within the cache, every page index a key
    reads within the page pool (syncs with the device)."""
    if page_table is not None:
        page_size = k.shape[1]
        capacity = page_table.shape[1] * page_size
    else:
        capacity = k.shape[1]
    if seqused_k is not None:
        bad = (seqused_k < 0) | (seqused_k > capacity)
        if bool(bad.any()):
            b = int(bad.nonzero()[0, 0])
            raise ValueError(f"seqused_k[{b}] = {int(seqused_k[b])} is outside 0..{capacity} "
                             f"(the keys the cache holds)")
    if page_table is not None:
        used = seqused_k if seqused_k is not None else \
            torch.full((page_table.shape[0],), capacity, device=page_table.device)
        pages_used = (used.long() + page_size - 1) // page_size
        read = torch.arange(page_table.shape[1], device=page_table.device)[None, :] \
            < pages_used[:, None]
        bad = read & ((page_table < 0) | (page_table >= k.shape[0]))
        if bool(bad.any()):
            b, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"page_table[{b}, {j}] = {int(page_table[b, j])} is outside "
                             f"0..{k.shape[0] - 1} (the pages of k and v)")


_SM_COUNT: dict = {}


def _num_sms(device_index: int) -> int:
    n = _SM_COUNT.get(device_index)
    if n is None:
        n = _SM_COUNT[device_index] = \
            torch.cuda.get_device_properties(device_index).multi_processor_count
    return n


def _arguments(device_index: int, q, k, v, out, lse, scale: float, causal_offset: int,
               write_lse: int, features: ScoreFeatures, cu_seqlens=(None, None),
               max_seqlen_q: int = 0, seqused_k=None, page_table=None,
               num_splits: int = 1) -> tuple:
    """A forward kernel's arguments in `backends.ARGUMENTS` order, placeholders where the call
    has no such tensor (the kernel's key decides which reach the device)."""
    held = _placeholders(device_index)
    cu_q, cu_k = cu_seqlens
    return (q, k, v, out, lse, scale, causal_offset, write_lse, features.window_left,
            features.window_right, features.softcap,
            cu_q if cu_q is not None else held[1], cu_k if cu_k is not None else held[1],
            max_seqlen_q, seqused_k if seqused_k is not None else held[1],
            page_table if page_table is not None else held[2], num_splits)


def _decode_plan(device_index, q, k, features: ScoreFeatures, seqused_k, page_table,
                 num_splits, varlen=None) -> tuple:
    """(compiled kernel, split count) of a call with decode features (tuning.decode_key and
    tuning.num_splits_heuristic say how they are chosen). varlen: (ragged queries, ragged
    keys) of a `forward_varlen` call, which is never split or packed."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    heads_kv = k.shape[2]
    paged = page_table is not None
    page_size = k.shape[1] if paged else 0
    capacity = page_table.shape[1] * page_size if paged else k.shape[1]
    varlen_q, varlen_k = varlen or (False, False)
    # what decode_key reads of seqlen_q: whether the call is short, and which decode tile its
    # packed rows take
    request = ("decode", device_index, q.dtype, head_dim, features.causal, features.local,
               features.softcap > 0, varlen_q, varlen_k, seqlen_q <= DECODE_MAX_SEQLEN_Q,
               decode_rows_class(head_dim, seqlen_q * (heads_q // heads_kv)),
               heads_q // heads_kv, page_size, seqused_k is not None, forced_tile_arch())
    # the key, its compiled kernels without and with split-KV once asked for, and the CTAs an
    # SM holds: a warm call costs a dict lookup and the (cached) split count
    held = memory_cache.get(request)
    if held is None:
        key = decode_key(
            _arch(device_index), _DTYPE_NAMES[q.dtype], head_dim, features.causal,
            seqlen_q=seqlen_q, group=heads_q // heads_kv, page_size=page_size,
            seqused_k=seqused_k is not None, split_kv=False, tile_arch=forced_tile_arch(),
            local=features.local, softcap=features.softcap > 0, varlen_q=varlen_q,
            varlen_k=varlen_k)
        held = memory_cache[request] = [
            key, None, None, decode_ctas_per_sm(key, forced_tile_arch() or _arch(device_index))]
    base = held[0]
    if num_splits is None:
        if seqlen_q > DECODE_MAX_SEQLEN_Q or varlen_q:
            num_splits = 1
        else:
            cfg = base.tile
            m_blocks = -(-seqlen_q * base.pack_gqa // cfg.block_m)
            heads = heads_kv if base.pack_gqa > 1 else heads_q
            keys = capacity
            if features.local:  # the keys a window lets the call's queries see
                keys = min(capacity, features.window_left + seqlen_q + features.window_right)
            num_splits = num_splits_heuristic(m_blocks * heads * batch,
                                              -(-keys // cfg.block_n), _num_sms(device_index),
                                              held[3])
    split = num_splits > 1
    kernel = held[1 + split]
    if kernel is None:
        kernel = held[1 + split] = get_kernel(dataclasses.replace(base, split_kv=True, lpt=False)
                                              if split else base)
    return kernel, num_splits


def _merge_kernel(device_index: int, in_dtype, out_dtype, head_dim: int):
    """The merge kernel from `in_dtype` parts to an `out_dtype` output (torch dtypes)."""
    request = ("merge", device_index, in_dtype, out_dtype, head_dim)
    kernel = memory_cache.get(request)
    if kernel is None:
        names = {torch.float32: "float32", **_DTYPE_NAMES}
        kernel = memory_cache[request] = get_kernel(
            MergeKey(_arch(device_index), head_dim, names[in_dtype], names[out_dtype]))
    return kernel


_PLAIN = {False: ScoreFeatures(False), True: ScoreFeatures(True)}


def _run(q, k, v, *, causal, bottom_right, softmax_scale, out, return_lse, backend,
         lazy_rescale=True, names=_FORWARD_NAMES, seqused_k=None, page_table=None,
         num_splits=None, window_size=NO_WINDOW, softcap=0.0):
    decode_args = seqused_k is not None or page_table is not None or num_splits is not None
    if not decode_args and softcap == 0.0 and type(window_size) is tuple and \
            window_size == NO_WINDOW and \
            _plainly_valid(q, k, v, out, softmax_scale, causal, return_lse, backend):
        device_index, features = q.get_device(), _PLAIN[causal]
    else:
        device_index, features, softmax_scale, return_lse, num_splits = _check_args(
            q, k, v, out, softmax_scale, causal, return_lse, backend, names, seqused_k,
            page_table, num_splits, window_size, softcap)
    batch, seqlen_q, heads_q, head_dim = q.shape
    causal_offset = k.shape[1] - seqlen_q if bottom_right else 0
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    if seqused_k is not None or page_table is not None or (num_splits or 1) > 1 or \
            (seqlen_q <= DECODE_MAX_SEQLEN_Q and backend not in PREFILL_ONLY):
        kernel, num_splits = _decode_plan(device_index, q, k, features, seqused_k, page_table,
                                          num_splits)
    else:
        small = features.causal and is_small_grid(seqlen_q, heads_q, batch,
                                                  _num_sms(device_index))
        kernel = _kernel_for(device_index, q.dtype, head_dim, features, backend, lazy_rescale,
                             small_grid=small, seqlen_q=seqlen_q)
        num_splits = 1
    if out is None:
        out = torch.empty_like(q)  # q's memory order where q is dense, else contiguous
    if return_lse:
        lse = torch.empty((batch, heads_q, seqlen_q), device=q.device, dtype=torch.float32)
    else:
        lse = _placeholders(device_index)[0]
    if q.requires_grad or k.requires_grad or v.requires_grad:
        q, k, v = q.detach(), k.detach(), v.detach()  # DLPack refuses tensors needing grad
    if num_splits == 1:
        _launch(device_index, kernel,
                _arguments(device_index, q, k, v, out, lse, scale, causal_offset,
                           int(return_lse), features, seqused_k=seqused_k,
                           page_table=page_table))
    else:  # float32 partials per split, then the merge writes out (and lse)
        # one allocation for both (a decode step is host-bound: each allocation is µs)
        rows = num_splits * batch * seqlen_q * heads_q
        parts = torch.empty(rows * (head_dim + 1), device=q.device, dtype=torch.float32)
        o_parts = parts[:rows * head_dim].view(num_splits, batch, seqlen_q, heads_q, head_dim)
        lse_parts = parts[rows * head_dim:].view(num_splits, batch, heads_q, seqlen_q)
        _launch(device_index, kernel,
                _arguments(device_index, q, k, v,
                           o_parts.view(num_splits * batch, seqlen_q, heads_q, head_dim),
                           lse_parts.view(num_splits * batch, heads_q, seqlen_q), scale,
                           causal_offset, 1, features, seqused_k=seqused_k,
                           page_table=page_table, num_splits=num_splits))
        _launch(device_index, _merge_kernel(device_index, torch.float32, q.dtype, head_dim),
                (o_parts, lse_parts, out, lse, int(return_lse)))
    return (out, lse) if return_lse else out


def _launch(device_index: int, kernel, args: tuple) -> None:
    """The kernel launches on the current stream of the current device."""
    if _single_gpu() or device_index == torch.cuda.current_device():
        kernel(*args)
    else:
        with torch.cuda.device(device_index):
            kernel(*args)


@overload
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = ...,
            softmax_scale: float | None = ..., return_lse: Literal[False] = ...,
            out: torch.Tensor | None = ..., backend: Backend = ..., *,
            window_size: tuple[int, int] = ..., softcap: float = ...,
            seqused_k: torch.Tensor | None = ..., page_table: torch.Tensor | None = ...,
            num_splits: int | None = ...) -> torch.Tensor: ...


@overload
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = ...,
            softmax_scale: float | None = ..., *, return_lse: Literal[True],
            out: torch.Tensor | None = ..., backend: Backend = ...,
            window_size: tuple[int, int] = ..., softcap: float = ...,
            seqused_k: torch.Tensor | None = ..., page_table: torch.Tensor | None = ...,
            num_splits: int | None = ...) -> tuple[torch.Tensor, torch.Tensor]: ...


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
            softmax_scale: float | None = None, return_lse: bool = False,
            out: torch.Tensor | None = None, backend: Backend = "auto", *,
            window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0,
            seqused_k: torch.Tensor | None = None, page_table: torch.Tensor | None = None,
            num_splits: int | None = None, deterministic: bool | None = None,
            ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention forward in flash-attn's layout, differentiable.

    q: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim),
    fp16 or bf16, heads_q a multiple of heads_kv (GQA/MQA). causal aligns the
    bottom-right corner (the last query sees the last key). Returns o, or
    (o, lse) with lse float32 (batch, heads_q, seqlen_q) in natural log; a query
    that sees no key gets o = 0 and lse = -inf.
    backend: 'sm80' (cp.async, any sm80+ GPU), 'tma' (TMA + mbarrier, sm90+), 'sm90'
    (warp-specialized TMA + wgmma, Hopper only) or 'auto' (the fastest measured for this GPU
    and call, see cute_fa/tuning.py).

    window_size = (left, right): a sliding window, flash-attn's: query i sees keys
    i + seqlen_k - seqlen_q - left ... i + seqlen_k - seqlen_q + right, -1 for an unbounded
    side; with causal=True the window ends at the diagonal (its right side is 0). Key blocks
    wholly outside the window are skipped, so the cost grows with the window, not seqlen_k.
    softcap = c > 0: scores s * softmax_scale become c * tanh(s * softmax_scale / c) before
    the softmax (Gemma 2's logit softcap); 0 for none.

    KV cache (decode), as flash-attn takes it:
    seqused_k: int32 (batch,), how many keys of each entry are valid (a cache with room to
    grow); causal is then bottom-right against each entry's own count.
    page_table: int32 (batch, max_pages_per_seq); k and v are then a paged cache
    (num_pages, page_size, heads_kv, head_dim), page_size a multiple of 16 up to 1024, and
    key j of entry b is row j % page_size of page page_table[b, j // page_size]. Without
    seqused_k an entry has max_pages_per_seq * page_size keys.
    The values inside seqused_k and page_table are trusted (checking them needs a device
    sync); set CUTE_FA_CHECK_INDICES=1 to have every call check them.
    num_splits: how many CTAs share one query block's keys (split-KV, merged by
    `merge_attention`'s kernel); None picks it (tuning.num_splits_heuristic), 1 never splits.
    Calls with at most 16 queries per sequence pack the query heads of a GQA group into one
    tile, so K and V are read once per group.

    Gradients: where q, k or v require grad, the output's grad_fn runs cute_fa's backward
    kernels (`cute_fa.backward`); lse is returned as a non-differentiable output. deterministic:
    True makes dq bitwise repeatable (its float32 sums formed in a fixed order, slower), None
    follows `torch.use_deterministic_algorithms`. The KV-cache arguments and out= have no
    backward: with inputs that require grad they raise. Under torch.compile the call is the
    custom op `cute_fa::fwd` (`cute_fa.ops`), traced without a graph break.
    """
    if deterministic is not None:  # without grad there is nothing to make deterministic
        _as_bool("deterministic", deterministic)
    if _needs_op(q, k, v):
        return _through_op(q, k, v, causal, softmax_scale, return_lse, out, backend, window_size,
                           softcap, deterministic, True,
                           seqused_k is not None or page_table is not None
                           or num_splits is not None,
                           dict(seqused_k=seqused_k, page_table=page_table,
                                num_splits=num_splits))
    return _run(q, k, v, causal=causal, bottom_right=True, softmax_scale=softmax_scale, out=out,
                return_lse=return_lse, backend=backend, seqused_k=seqused_k,
                page_table=page_table, num_splits=num_splits, window_size=window_size,
                softcap=softcap)


def _requires_grad(q, k, v) -> bool:
    """Autograd must record the call: grad mode is on and an input requires grad."""
    return torch.is_grad_enabled() and (
        getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
        or getattr(v, "requires_grad", False))


def _needs_op(q, k, v) -> bool:
    """The call must go through the custom op: torch.compile is tracing it, or autograd must
    record it. (A few attribute reads: the eager inference call stays off the dispatcher.)"""
    return torch.compiler.is_compiling() or _requires_grad(q, k, v)


def _as_deterministic(value) -> bool:
    """deterministic=None follows torch.use_deterministic_algorithms."""
    if value is None:
        return torch.are_deterministic_algorithms_enabled()
    return _as_bool("deterministic", value)


def _op_scalars(causal, softmax_scale, window_size, softcap, deterministic, names) -> tuple:
    """The Python arguments as the custom op's schema takes them, checked as `forward` checks
    them (the op's eager body checks the tensors)."""
    left, right = _window_ints(window_size)
    if not torch.compiler.is_compiling():
        # eagerly, a bad value raises here, before the op; under torch.compile the op's eager
        # body checks them when the graph runs (before any launch, as here)
        causal = _as_bool(names["causal"], causal)
        softmax_scale = _as_scale(names["softmax_scale"], softmax_scale)
        _score_features(causal, (left, right), softcap)
    return (bool(causal), None if softmax_scale is None else float(softmax_scale), left, right,
            float(softcap), _as_deterministic(deterministic))


def _op_result(o, lse, out, return_lse: bool):
    """What `forward` returns from the op's (o, lse): o copied into `out` if one was given."""
    if out is not None:
        out.copy_(o)
        o = out
    return (o, lse) if return_lse else o


def _through_op(q, k, v, causal, softmax_scale, return_lse, out, backend, window_size, softcap,
                deterministic, bottom_right: bool, decode: bool, decode_args: dict,
                names=_FORWARD_NAMES):
    """`forward` / `sdpa` as the custom op `cute_fa::fwd` (autograd, torch.compile)."""
    from . import ops

    grad = _requires_grad(q, k, v)
    if decode:
        if grad:
            raise ValueError("seqused_k, page_table and num_splits (a KV cache) have no backward: "
                             "call forward under torch.no_grad() or without inputs that require "
                             "grad")
        # outside torch.compile's graph: the decode plan's host logic reads the cache
        return torch.compiler.disable(_run)(
            q, k, v, causal=causal, bottom_right=bottom_right, softmax_scale=softmax_scale,
            out=out, return_lse=return_lse, backend=backend, names=names,
            window_size=window_size, softcap=softcap, **decode_args)
    if out is not None and grad:
        raise ValueError("out= has no backward: leave it None when q, k or v require grad")
    return_lse = _as_bool("return_lse", return_lse)
    check_backend(backend)
    causal, scale, left, right, softcap, det = _op_scalars(causal, softmax_scale, window_size,
                                                           softcap, deterministic, names)
    o, lse = ops.fwd(q, k, v, causal, scale, left, right, softcap, bottom_right, backend, det)
    return _op_result(o, lse, out, return_lse)


def _check_cu_seqlens(name: str, t, batch: int | None) -> int:
    """An int32 (batch + 1,) contiguous tensor of offsets; returns batch."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {_type_name(t)}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be an int32 tensor, got {t.dtype}")
    want = "(batch + 1,)" if batch is None else f"(batch + 1,) = ({batch + 1},) like cu_seqlens_q"
    if t.dim() != 1 or t.shape[0] < 2 or (batch is not None and t.shape[0] != batch + 1):
        raise ValueError(f"{name} must have shape {want} with batch >= 1, got {tuple(t.shape)}")
    if t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous, got stride {t.stride()}")
    return t.shape[0] - 1


def _as_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {_type_name(value)} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def _check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
                       softmax_scale, causal, window_size, softcap, return_lse, backend,
                       seqused_k, page_table):
    """`forward_varlen`'s rules, in the order a user fixes them; returns (device index,
    ScoreFeatures, softmax_scale, return_lse, max_seqlen_q)."""
    paged = page_table is not None
    _check_tensor("q", q, "(total_q, heads, head_dim)", rank=3)
    kv_layout = "(num_pages, page_size, heads_kv, head_dim)" if paged else \
        "(total_k, heads_kv, head_dim)"
    _check_tensor("k", k, kv_layout, rank=4 if paged else 3)
    _check_tensor("v", v, kv_layout, rank=4 if paged else 3)
    if not (k.dtype == q.dtype and v.dtype == q.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    causal = _as_bool("causal", causal)
    return_lse = _as_bool("return_lse", return_lse)
    softmax_scale = _as_scale("softmax_scale", softmax_scale)
    features = _score_features(causal, window_size, softcap)
    check_backend(backend)
    batch = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, None)
    if cu_seqlens_k is None:
        if not paged:
            raise ValueError("cu_seqlens_k may be None only with a page_table (a paged k/v, "
                             "whose lengths come from seqused_k)")
    else:
        _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, batch)
    max_seqlen_q = _as_count("max_seqlen_q", max_seqlen_q)
    _as_count("max_seqlen_k", max_seqlen_k)
    if max_seqlen_q > q.shape[0]:
        raise ValueError(f"max_seqlen_q ({max_seqlen_q}) must be at most the number of query "
                         f"rows, total_q = q.shape[0] = {q.shape[0]}")
    _check_query_blocks("max_seqlen_q", max_seqlen_q)
    if batch > 65535:
        raise ValueError(f"cu_seqlens_q holds {batch} sequences; at most 65535 (the grid's z)")
    total_q, heads_q, head_dim = q.shape
    if heads_q < 1:
        raise ValueError(f"q must have at least one head, got shape {tuple(q.shape)}")
    check_head_dim("head_dim (q.shape[-1])", head_dim)
    if paged:
        if k.shape[0] < 1 or k.shape[3] != head_dim or k.shape[2] < 1:
            raise ValueError(f"k must be a paged cache of shape (num_pages>=1, page_size, "
                             f"heads_kv>=1, head_dim={head_dim}), got {tuple(k.shape)}")
        if not supported_page_size(k.shape[1]):
            raise ValueError(f"the page size (k.shape[1]) must be a multiple of 16 from 16 to "
                             f"{MAX_PAGE_SIZE}, got {k.shape[1]}")
    elif k.shape[2] != head_dim or k.shape[1] < 1:
        raise ValueError(f"k must have shape (total_k, heads_kv>=1, head_dim={head_dim}), got "
                         f"{tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k, {tuple(k.shape)}, got {tuple(v.shape)}")
    heads_k = k.shape[-2]
    if heads_q % heads_k:
        raise ValueError(f"the number of query heads ({heads_q}) must be a multiple of the number "
                         f"of key/value heads ({heads_k})")
    if backend in PREFILL_ONLY and (paged or seqused_k is not None):
        raise ValueError(f"backend={backend!r} takes no seqused_k or page_table (the cp.async "
                         f"kernel reads a KV cache); use backend='sm80' or 'auto'")
    named = (("q", q), ("k", k), ("v", v)) + _checked_out(
        out, q, layout="(total_q, heads, head_dim)", rank=3)
    for name, t in named:
        _check_layout(name, t)
    _check_cache_tensors(seqused_k, page_table, batch)
    device_index = q.get_device()
    for name, t in named + (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                            ("seqused_k", seqused_k), ("page_table", page_table)):
        if t is not None:
            _check_device(name, t, device_index)
    if os.environ.get("CUTE_FA_CHECK_INDICES", "") not in ("", "0"):
        _check_varlen_values(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, paged, seqused_k,
                             page_table)
        if paged:
            _check_index_values(k, seqused_k, page_table)
    return device_index, features, softmax_scale, return_lse, max_seqlen_q


def _check_varlen_values(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, paged, seqused_k,
                         page_table) -> None:
    """CUTE_FA_CHECK_INDICES=1: cu_seqlens start at 0, never decrease and end within the
    tensors; max_seqlen_q is at least every query length; each sequence's keys (seqused_k or
    cu_seqlens_k's lengths) lie within its own rows of k (ragged) or its pages (paged). Syncs
    with the device."""
    lengths_k = None
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, q.shape[0]),
                            ("cu_seqlens_k", cu_seqlens_k, None if paged else k.shape[0])):
        if cu is None:
            continue
        lengths = (cu[1:] - cu[:-1]).tolist()
        first, last = int(cu[0]), int(cu[-1])
        if first != 0 or min(lengths) < 0 or (total is not None and last > total):
            raise ValueError(f"{name} must start at 0, never decrease and end at most at "
                             f"{total}, got {cu.tolist()}")
        if name == "cu_seqlens_q" and max(lengths) > max_seqlen_q:
            raise ValueError(f"max_seqlen_q ({max_seqlen_q}) is less than the longest query "
                             f"sequence ({max(lengths)})")
        if name == "cu_seqlens_k":
            lengths_k = lengths
    used = seqused_k.tolist() if seqused_k is not None else lengths_k
    if used is None:
        return
    room = [page_table.shape[1] * k.shape[1]] * len(used) if paged else lengths_k
    for b, (n, limit) in enumerate(zip(used, room)):
        if not 0 <= n <= limit:
            what = "its pages hold" if paged else "cu_seqlens_k gives it"
            raise ValueError(f"sequence {b} uses {n} keys, outside 0..{limit} ({what})")


@overload
def forward_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor | None,
                   max_seqlen_q: int, max_seqlen_k: int, causal: bool = ...,
                   softmax_scale: float | None = ..., window_size: tuple[int, int] = ...,
                   softcap: float = ..., return_lse: Literal[False] = ...,
                   out: torch.Tensor | None = ..., backend: Backend = ..., *,
                   seqused_k: torch.Tensor | None = ...,
                   page_table: torch.Tensor | None = ...) -> torch.Tensor: ...


@overload
def forward_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor | None,
                   max_seqlen_q: int, max_seqlen_k: int, causal: bool = ...,
                   softmax_scale: float | None = ..., window_size: tuple[int, int] = ...,
                   softcap: float = ..., *, return_lse: Literal[True],
                   out: torch.Tensor | None = ..., backend: Backend = ...,
                   seqused_k: torch.Tensor | None = ...,
                   page_table: torch.Tensor | None = ...) -> tuple[torch.Tensor, torch.Tensor]:
    ...


def forward_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor | None,
                   max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                   softmax_scale: float | None = None, window_size: tuple[int, int] = NO_WINDOW,
                   softcap: float = 0.0, return_lse: bool = False,
                   out: torch.Tensor | None = None, backend: Backend = "auto", *,
                   seqused_k: torch.Tensor | None = None,
                   page_table: torch.Tensor | None = None, deterministic: bool | None = None,
                   ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention forward over a ragged batch packed end to end (flash-attn's
    `flash_attn_varlen_func`), in one launch, with no host sync and no copy; differentiable
    as `forward` is (then max_seqlen_k must be at least the longest key sequence: it sizes
    the backward's grid).

    q: (total_q, heads_q, head_dim); k, v: (total_k, heads_kv, head_dim); sequence b's
    queries are rows cu_seqlens_q[b] ... cu_seqlens_q[b + 1] - 1 of q, its keys rows
    cu_seqlens_k[b] ... of k and v. cu_seqlens_q/k: int32 (batch + 1,), starting at 0;
    max_seqlen_q: at least the longest query sequence (it sizes the grid); max_seqlen_k is
    taken for flash-attn's signature. Sequences may be empty; rows of q past
    cu_seqlens_q[-1] belong to no sequence, and their rows of o are not written. causal is
    bottom-right per sequence (its last query sees its last key); window_size, softcap,
    softmax_scale and backend are `forward`'s. Returns o (total_q, heads_q, head_dim), or (o, lse) with lse
    float32 (heads_q, total_q).

    seqused_k: int32 (batch,), the keys of each sequence actually used (from its first).
    page_table: int32 (batch, max_pages_per_seq): k and v are then a paged cache (num_pages,
    page_size, heads_kv, head_dim) as in `forward`; cu_seqlens_k may then be None (each
    sequence has seqused_k[b] keys, or the page table's capacity).
    cu_seqlens, seqused_k and page_table values and max_seqlen_q are trusted (checking them
    needs a device sync); CUTE_FA_CHECK_INDICES=1 checks them on every call. The TMA kernel
    (backend 'auto' on sm90 at head_dim 64 and 128) reads a sequence's last K/V tile whole,
    into the next sequence's rows (or past cu_seqlens_k[-1]): those keys weigh exactly zero,
    but rows of k and v below total_k must hold finite values (0 x NaN is NaN).
    """
    if deterministic is not None:
        _as_bool("deterministic", deterministic)
    if _needs_op(q, k, v):
        return _varlen_through_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, causal, softmax_scale, window_size, softcap,
                                  return_lse, out, backend, seqused_k, page_table,
                                  deterministic)
    return _forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal=causal, softmax_scale=softmax_scale, window_size=window_size,
                           softcap=softcap, return_lse=return_lse, out=out, backend=backend,
                           seqused_k=seqused_k, page_table=page_table)


def _varlen_through_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                       softmax_scale, window_size, softcap, return_lse, out, backend, seqused_k,
                       page_table, deterministic):
    """`forward_varlen` as the custom op `cute_fa::fwd_varlen` (autograd, torch.compile)."""
    from . import ops

    grad = _requires_grad(q, k, v)
    if seqused_k is not None or page_table is not None or cu_seqlens_k is None:
        if grad:
            raise ValueError("seqused_k and page_table (a KV cache) have no backward: call "
                             "forward_varlen under torch.no_grad() or without inputs that "
                             "require grad")
        return torch.compiler.disable(_forward_varlen)(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
            softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
            return_lse=return_lse, out=out, backend=backend, seqused_k=seqused_k,
            page_table=page_table)
    if out is not None and grad:
        raise ValueError("out= has no backward: leave it None when q, k or v require grad")
    return_lse = _as_bool("return_lse", return_lse)
    check_backend(backend)
    causal, scale, left, right, softcap, det = _op_scalars(causal, softmax_scale, window_size,
                                                           softcap, deterministic,
                                                           _FORWARD_NAMES)
    o, lse = ops.fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, _as_count("max_seqlen_q",
                                                                            max_seqlen_q),
                            _as_count("max_seqlen_k", max_seqlen_k), causal, scale, left, right,
                            softcap, backend, det)
    return _op_result(o, lse, out, return_lse)


def _forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal,
                    softmax_scale, window_size, softcap, return_lse, out, backend,
                    seqused_k=None, page_table=None):
    """`forward_varlen`'s eager body."""
    device_index, features, softmax_scale, return_lse, max_seqlen_q = _check_varlen_args(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, softmax_scale,
        causal, window_size, softcap, return_lse, backend, seqused_k, page_table)
    total_q, heads_q, head_dim = q.shape
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    paged = page_table is not None
    if out is None:
        out = torch.empty_like(q)
    lse = torch.empty((heads_q, total_q), device=q.device, dtype=torch.float32) \
        if return_lse else None
    if total_q and max_seqlen_q:
        if q.requires_grad or k.requires_grad or v.requires_grad:
            q, k, v = q.detach(), k.detach(), v.detach()  # DLPack refuses tensors needing grad
        q4 = q[None]
        k4, v4 = (k, v) if paged else (k[None], v[None])
        varlen_k = cu_seqlens_k is not None
        if paged or seqused_k is not None:
            kernel, _ = _decode_plan(device_index, q4, k4, features, seqused_k, page_table, 1,
                                     varlen=(True, varlen_k))
        else:
            kernel = _kernel_for(device_index, q.dtype, head_dim, features, backend,
                                 varlen=True, seqlen_q=max_seqlen_q)
        _launch(device_index, kernel,
                _arguments(device_index, q4, k4, v4, out[None],
                           lse[None] if return_lse else _placeholders(device_index)[0], scale,
                           0, int(return_lse), features, (cu_seqlens_q, cu_seqlens_k),
                           max_seqlen_q, seqused_k, page_table))
    elif return_lse:
        lse.fill_(-math.inf)
    return (out, lse) if return_lse else out


def merge_attention(o_parts: torch.Tensor,
                    lse_parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine attention over disjoint key sets into attention over their union.

    o_parts: (parts, batch, seqlen, heads, head_dim), float32, float16 or bfloat16; lse_parts:
    float32 (parts, batch, heads, seqlen), natural log: part p as `forward(...,
    return_lse=True)` returns it for its keys. Returns (o, lse): o (batch, seqlen, heads,
    head_dim) in o_parts' dtype and lse float32 (batch, heads, seqlen), exactly the attention
    over all the parts' keys (up to rounding). A part with lse = -inf saw no key and counts for
    nothing; a row whose parts all have -inf gets o = 0 and lse = -inf. What split-KV does
    internally; also what prefix caching and context-parallel attention need.
    """
    if not isinstance(o_parts, torch.Tensor):
        raise TypeError(f"o_parts must be a torch.Tensor, got {_type_name(o_parts)}")
    if not isinstance(lse_parts, torch.Tensor):
        raise TypeError(f"lse_parts must be a torch.Tensor, got {_type_name(lse_parts)}")
    if o_parts.dtype not in (torch.float32,) + _DTYPES:
        raise TypeError(f"o_parts must be float32, float16 or bfloat16, got {o_parts.dtype}")
    if lse_parts.dtype != torch.float32:
        raise TypeError(f"lse_parts must be float32, got {lse_parts.dtype}")
    if o_parts.dim() != 5:
        raise ValueError(f"o_parts must be 5-D (parts, batch, seqlen, heads, head_dim), got "
                         f"shape {tuple(o_parts.shape)}")
    parts, batch, seqlen, heads, head_dim = o_parts.shape
    if min(parts, batch, seqlen, heads) < 1:
        raise ValueError(f"o_parts must have non-empty dimensions, got {tuple(o_parts.shape)}")
    check_head_dim("head_dim (o_parts.shape[-1])", head_dim)
    if tuple(lse_parts.shape) != (parts, batch, heads, seqlen):
        raise ValueError(f"lse_parts must have shape (parts, batch, heads, seqlen) = "
                         f"{(parts, batch, heads, seqlen)}, got {tuple(lse_parts.shape)}")
    if o_parts.stride(-1) != 1 or any(x % 8 for x in o_parts.stride()[:-1]) or \
            o_parts.data_ptr() % 16:
        raise ValueError(f"o_parts must have a contiguous last dimension, strides that are "
                         f"multiples of 8 and a 16-byte aligned start, got strides "
                         f"{o_parts.stride()}")
    if lse_parts.stride(-1) != 1:
        raise ValueError(f"lse_parts must have a contiguous last dimension, got strides "
                         f"{lse_parts.stride()}")
    if not o_parts.is_cuda:
        _check_device("o_parts", o_parts, 0)
    device_index = o_parts.get_device()
    _check_device("lse_parts", lse_parts, device_index)
    out = torch.empty((batch, seqlen, heads, head_dim), device=o_parts.device,
                      dtype=o_parts.dtype)
    lse = torch.empty((batch, heads, seqlen), device=o_parts.device, dtype=torch.float32)
    _launch(device_index, _merge_kernel(device_index, o_parts.dtype, o_parts.dtype, head_dim),
            (o_parts.detach(), lse_parts.detach(), out, lse, 1))
    return out, lse


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
         scale: float | None = None, backend: Backend = "auto", *,
         deterministic: bool | None = None) -> torch.Tensor:
    """Like torch.nn.functional.scaled_dot_product_attention on (batch, heads, seqlen, head_dim).

    Top-left causal, as torch does; same kernel as `forward`, reached through strides, and
    differentiable as `forward` is.
    """
    if deterministic is not None:
        _as_bool("deterministic", deterministic)
    if _needs_op(q, k, v):
        for name, t in (("q", q), ("k", k), ("v", v)):
            _check_tensor(name, t, "(batch, heads, seqlen, head_dim)")
        o = _through_op(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal,
                        scale, False, None, backend, NO_WINDOW, 0.0, deterministic, False,
                        False, {}, _SDPA_NAMES)
        return o.transpose(1, 2)
    for name, t in (("q", q), ("k", k), ("v", v)):  # before the transposes below
        _check_tensor(name, t, "(batch, heads, seqlen, head_dim)")
    out = torch.empty_like(q)
    _run(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=is_causal,
         bottom_right=False, softmax_scale=scale, out=out.transpose(1, 2), return_lse=False,
         backend=backend, names=_SDPA_NAMES)
    return out
