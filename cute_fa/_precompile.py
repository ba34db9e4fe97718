"""Compile a chosen set of kernels up front (into memory and the on-disk cache).

`cute_fa.precompile(head_dims=(64, 128))` or, at import time,
CUTE_FA_PRECOMPILE="64,128" (both dtypes, causal and not, for the local GPU). The module's
name is private so that importing it does not replace the function `cute_fa.precompile`.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Iterable

from .backends import MergeKey
from .compiler import get_kernel, wait_for_saves
from .layouts.config import canonical_dtype, check_head_dim
from .arch import Arch
from .tuning import (DECODE_MAX_SEQLEN_Q, MAX_PAGE_SIZE, PREFILL_ONLY, bwd_keys,
                     check_backend, decode_key, decode_rows_class, kernel_key,
                     supported_page_size)


def _as_tuple(name: str, value, single: tuple, what: str) -> tuple:
    """A single value (an instance of `single`) or an iterable of values, as a tuple."""
    if isinstance(value, single):
        return (value,)
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        values = tuple(value)
        if not values:
            raise ValueError(f"{name} must not be empty")
        return values
    raise TypeError(f"{name} must be {what} or a sequence of them, got {value!r}")


def _dtype_name(value) -> str:
    try:
        return canonical_dtype(value)
    except ValueError:
        raise ValueError(f"dtypes must name float16 or bfloat16, got {value!r}") from None


def precompile(head_dims: int | Iterable[int] = (64, 128),
               dtypes: str | Iterable[str] = ("bfloat16", "float16"),
               causal: bool | Iterable[bool] = (False, True),
               arch: str | None = None, backend: str = "auto",
               decode_groups: int | Iterable[int] = (),
               page_sizes: int | Iterable[int] = (), *, varlen: bool = False,
               windows: bool = False, softcap: bool = False, backward: bool = False) -> list:
    """Compile every (head_dim, dtype, causal) combination for `arch` (default: this GPU's,
    e.g. 'sm_90a'; needed where there is no GPU) and `backend` ('auto' compiles what
    `forward` would pick). Each of head_dims, dtypes and causal is one value or a sequence;
    dtypes are names ('bfloat16', 'fp16', ...) or torch dtypes.

    decode_groups (query heads per K/V head, e.g. 4 for 32 query heads on 8 K/V heads) adds
    the decode kernels `forward` runs for at most 16 queries per sequence with that GQA ratio:
    with and without split-KV, with and without seqused_k, on a dense cache and on a paged
    one of each of page_sizes, and the merge of split-KV's partials.

    varlen, windows, softcap add the kernels of calls with those features, alone and together:
    `forward_varlen` (ragged batches; with page_sizes, also against a paged cache), a
    `window_size` with a bounded left side or a right side past the diagonal, a softcap (for
    the decode kernels too, with decode_groups).

    backward adds the backward's kernels (training: the preprocess, the main kernel and the
    postprocess) of each (head_dim, dtype, causal) and feature combination above; the
    deterministic mode's are compiled on first use.

    Every argument is checked before anything compiles. Returns the kernel keys."""
    import torch

    head_dims = tuple(check_head_dim("head_dims", h)
                      for h in _as_tuple("head_dims", head_dims, (int,), "an int"))
    dtypes = tuple(_dtype_name(d) for d in _as_tuple("dtypes", dtypes, (str, torch.dtype),
                                                         "a dtype"))
    causal = _as_tuple("causal", causal, (bool,), "a bool")
    for c in causal:
        if not isinstance(c, bool):
            raise TypeError(f"causal must be a bool or a sequence of bools, got {c!r}")
    check_backend(backend)
    for name, flag in (("varlen", varlen), ("windows", windows), ("softcap", softcap),
                       ("backward", backward)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    decode_groups = () if decode_groups == () else tuple(
        _positive_int("decode_groups", g)
        for g in _as_tuple("decode_groups", decode_groups, (int,), "an int"))
    page_sizes = () if page_sizes == () else tuple(
        _page_size(p) for p in _as_tuple("page_sizes", page_sizes, (int,), "an int"))
    if page_sizes and not decode_groups:
        raise ValueError("page_sizes needs decode_groups (the decode kernels it is for)")
    if decode_groups and backend in PREFILL_ONLY:
        raise ValueError("decode_groups needs backend='auto' or 'sm80': decode runs on the "
                         "cp.async kernel")
    if arch is None:
        from .interface import _arch

        if not torch.cuda.is_available():
            raise RuntimeError("precompile needs arch= (e.g. arch='sm_90a') when no CUDA GPU "
                               "is visible; torch.cuda.is_available() is False here")
        arch = _arch(torch.cuda.current_device())
    else:
        arch = Arch.parse(arch).name
    # (local, softcap, varlen) of the prefill kernels, (local, softcap) of the decode ones
    features = [f for f in itertools.product(*((False, True) if on else (False,)
                                                for on in (windows, softcap, varlen)))]
    keys = [kernel_key(arch, dtype, head_dim, is_causal, backend, local=local, softcap=cap,
                       varlen=ragged)
            for head_dim, dtype, is_causal, (local, cap, ragged) in itertools.product(
                head_dims, dtypes, causal, features)]
    # short causal calls may take another kernel (tuning.AUTO_SHORT_CAUSAL; seqlen_q=1 stands
    # for any short one), and calls too small to fill the GPU once another tile
    # (tuning.SMALL_GRID_TILES)
    if True in causal:
        keys += [kernel_key(arch, dtype, head_dim, True, backend, local=local, softcap=cap,
                            varlen=ragged, seqlen_q=1)
                 for head_dim, dtype, (local, cap, ragged) in itertools.product(
                     head_dims, dtypes, features)]
        keys += [kernel_key(arch, dtype, head_dim, True, backend, small_grid=True,
                            seqlen_q=seqlen_q)
                 for head_dim, dtype, seqlen_q in itertools.product(head_dims, dtypes,
                                                                    (None, 1))]
    # every decode tile a call of 1..DECODE_MAX_SEQLEN_Q queries can take: one query length per
    # class of packed rows (queries x group; tuning.decode_rows_class)
    decode_features = sorted({(local, cap) for local, cap, _ in features})
    for head_dim, dtype, is_causal, group, page_size, seqused_k, split_kv, (local, cap) in \
            itertools.product(head_dims, dtypes, causal, decode_groups, (0,) + page_sizes,
                              (False, True), (False, True), decode_features):
        lengths = {decode_rows_class(head_dim, n * group): n
                   for n in range(DECODE_MAX_SEQLEN_Q, 0, -1)}
        for seqlen_q in sorted(lengths.values()):
            keys.append(decode_key(arch, dtype, head_dim, is_causal, seqlen_q=seqlen_q,
                                   group=group, page_size=page_size, seqused_k=seqused_k,
                                   split_kv=split_kv, local=local, softcap=cap))
    if varlen:  # forward_varlen with seqused_k or a paged cache (given cu_seqlens_k or not)
        for head_dim, dtype, is_causal, page_size, seqused_k, ragged_k, (local, cap) in \
                itertools.product(head_dims, dtypes, causal, (0,) + page_sizes, (False, True),
                                  (False, True), decode_features):
            if page_size == 0 and not (seqused_k and ragged_k):
                continue  # without a cache: kernel_key's varlen kernel, above
            keys.append(decode_key(arch, dtype, head_dim, is_causal,
                                   seqlen_q=DECODE_MAX_SEQLEN_Q + 1, group=1,
                                   page_size=page_size, seqused_k=seqused_k, split_kv=False,
                                   local=local, softcap=cap, varlen_q=True,
                                   varlen_k=ragged_k))
    if decode_groups:
        keys += [MergeKey(arch, head_dim, "float32", dtype)
                 for head_dim, dtype in itertools.product(head_dims, dtypes)]
    if backward:
        for head_dim, dtype, is_causal, (local, cap, ragged) in itertools.product(
                head_dims, dtypes, causal, features):
            keys += bwd_keys(arch, dtype, head_dim, is_causal, local=local, softcap=cap,
                             varlen=ragged)
    keys = list(dict.fromkeys(keys))  # once each, in order
    for key in keys:
        get_kernel(key)
    wait_for_saves()
    return keys


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must hold positive ints, got {value!r}")
    return value


def _page_size(value) -> int:
    if not supported_page_size(value):
        raise ValueError(f"page_sizes must hold multiples of 16 from 16 to {MAX_PAGE_SIZE}, "
                         f"got {value!r}")
    return value


def parse_head_dims(spec: str, source: str) -> tuple[int, ...]:
    """'64,128' -> (64, 128); `source` names where the text came from in the error."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"{source} must be comma-separated head dims such as '64,128', "
                         f"got {spec!r}")
    return tuple(check_head_dim(source, int(p)) for p in parts)


def precompile_from_env() -> None:
    """CUTE_FA_PRECOMPILE at import: a malformed value raises; with no GPU to compile for,
    a warning says that nothing was compiled (the import itself goes on)."""
    spec = os.environ.get("CUTE_FA_PRECOMPILE", "").strip()
    if not spec:
        return
    head_dims = parse_head_dims(spec, "CUTE_FA_PRECOMPILE")
    import torch

    if not torch.cuda.is_available():
        warnings.warn("CUTE_FA_PRECOMPILE is set but no CUDA GPU is visible: nothing compiled "
                      "(cute_fa.precompile(..., arch='sm_90a') compiles for a named GPU)",
                      RuntimeWarning, stacklevel=2)
        return
    precompile(head_dims=head_dims)
