"""Compile a chosen set of kernels up front (into memory and the on-disk cache).

`cute_fa.precompile(head_dims=(64, 128))` or, at import time, CUTE_FA_PRECOMPILE="64,128"
(both dtypes, causal and not, for the local GPU). It enumerates the calls of the chosen kinds
(one of every shape class the plan tells apart: short and long queries, grids that fill the
GPU and grids that do not, every decode tile, split or not) and plans each
(`runtime.plan.plan`): the kernels compiled are exactly those calls get, by the one rule.
"""

from __future__ import annotations

import itertools
import os
import time
import warnings
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch

from ..arch import Arch
from ..compile.cache import compiled_kernels, get_kernel, object_path, wait_for_saves
from ..layouts.config import canonical_dtype, check_head_dim
from ..runtime.call import (DENSE, FAR_LEFT, RAGGED, AttentionCall, BackwardCall,
                            ScoreFeatures)
from ..runtime.device import device, stand_in
from ..runtime.plan import plan
from .. import tuning
from ..tuning import (DECODE_MAX_SEQLEN_Q, MAX_PAGE_SIZE, MAX_SEQLEN_Q, PREFILL_ONLY,
                      check_backend, supported_page_size)

# query lengths and batch sizes of the prefill calls planned: short and long queries
# (`tuning.SM90_LONG_TILES` splits at 2048), one that a wgmma kernel runs persistent on a grid
# that fills the GPU (`tuning.SM90_PERSISTENT_SEQLEN`), grids that fill no GPU and grids that
# fill any (`tuning.is_small_grid`)
PREFILL_SEQLENS = (DECODE_MAX_SEQLEN_Q + 1, 1024, 2049, 65536)
PREFILL_BATCHES = (1, 65535)
# the decode calls' keys per entry: long enough that split-KV may split them
DECODE_SEQLEN_K = 1 << 17


class Step(NamedTuple):
    """One kernel of a precompile: the n-th of total, where it came from ('compiled', 'from
    the disk cache', 'in memory') and how long that took."""

    n: int
    total: int
    key: object
    where: str
    seconds: float

    def __str__(self) -> str:
        return (f"[{self.n}/{self.total}] {describe(self.key)}: {self.where} "
                f"({self.seconds:.1f} s)")


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


def _dtype(value) -> torch.dtype:
    try:
        return getattr(torch, canonical_dtype(value))
    except ValueError:
        raise ValueError(f"dtypes must name float16 or bfloat16, got {value!r}") from None


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must hold positive ints, got {value!r}")
    return value


def _page_size(value) -> int:
    if not supported_page_size(value):
        raise ValueError(f"page_sizes must hold multiples of 16 from 16 to {MAX_PAGE_SIZE}, "
                         f"got {value!r}")
    return value


def _features(causal: bool, local: bool, softcap: bool) -> ScoreFeatures:
    """Score features with these key fields (a window of 64 keys back; a softcap of 30)."""
    return ScoreFeatures(causal, local, 64 if local else FAR_LEFT, 0, 30.0 if softcap else 0.0)


def _packing_seqlens() -> tuple:
    """PREFILL_SEQLENS and the ends of the query ranges in which 'auto' packs a GQA group into
    the wgmma tiles (`tuning.SM90_PACK_GQA_SEQLEN`): one call on each side of every edge."""
    edges = {x for lo, hi in tuning.SM90_PACK_GQA_SEQLEN.values()
             for x in (lo - 1, lo, hi, hi + 1)}
    return tuple(sorted(set(PREFILL_SEQLENS) | {x for x in edges
                                                  if DECODE_MAX_SEQLEN_Q < x <= MAX_SEQLEN_Q}))


def calls(head_dims, dtypes, causal, backend, decode_groups, page_sizes, features,
          backward: bool, device_index: int, deterministic: bool = False):
    """Every call precompile plans: (head_dim, dtype, causal) x features of each kind asked."""
    def attention(layout, dtype, head_dim, batch, seqlen_q, heads_q, f, **cache):
        return AttentionCall(layout, dtype, head_dim, batch, seqlen_q, DECODE_SEQLEN_K,
                             heads_q, 1, f, 1.0, 0, False, backend, device_index, **cache)

    for head_dim, dtype, is_causal, (local, cap, ragged) in itertools.product(
            head_dims, dtypes, causal, features):
        f = _features(is_causal, local, cap)
        for seqlen_q, batch in itertools.product(PREFILL_SEQLENS, PREFILL_BATCHES):
            yield attention(RAGGED if ragged else DENSE, dtype, head_dim, batch, seqlen_q, 1, f,
                            ragged_k=ragged)
        if not ragged:  # GQA prefill, whose wgmma tiles may pack the group (sm90_pack_gqa)
            for group, seqlen_q in itertools.product(decode_groups, _packing_seqlens()):
                yield attention(DENSE, dtype, head_dim, 1, seqlen_q, group, f)
        if backward:
            for det in (False, True) if deterministic else (False,):
                grad = BackwardCall(RAGGED if ragged else DENSE, dtype, head_dim, f, 1.0, 0,
                                    det, device_index)
                yield grad
                # a K/V group's query heads split over CTAs (the wgmma backward's small grids)
                yield grad._replace(heads_q=2, head_splits=2)
        if ragged:  # forward_varlen against a cache: seqused_k, or a paged K/V
            for page_size, seqused_k, ragged_k in itertools.product(
                    (0,) + page_sizes, (False, True), (False, True)):
                if page_size or (seqused_k and ragged_k):
                    yield attention(RAGGED, dtype, head_dim, 1, DECODE_MAX_SEQLEN_Q + 1, 1, f,
                                    page_size=page_size, seqused_k=seqused_k, ragged_k=ragged_k)
            continue
        # decode: every query length up to DECODE_MAX_SEQLEN_Q (they take different tiles)
        for group, page_size, seqused_k, num_splits, seqlen_q in itertools.product(
                decode_groups, (0,) + page_sizes, (False, True), (1, 2),
                range(1, DECODE_MAX_SEQLEN_Q + 1)):
            yield attention(DENSE, dtype, head_dim, 1, seqlen_q, group, f, page_size=page_size,
                            seqused_k=seqused_k, num_splits=num_splits)


def precompile(head_dims: int | Iterable[int] = (64, 128),
               dtypes: str | Iterable[str] = ("bfloat16", "float16"),
               causal: bool | Iterable[bool] = (False, True),
               arch: str | None = None, backend: str = "auto",
               decode_groups: int | Iterable[int] = (),
               page_sizes: int | Iterable[int] = (), *, varlen: bool = False,
               windows: bool = False, softcap: bool = False, backward: bool = False,
               deterministic: bool = False,
               progress: Callable[[Step], object] | None = None) -> list:
    """Compile every (head_dim, dtype, causal) combination for `arch` (default: this GPU's,
    e.g. 'sm_90a'; needed where there is no GPU) and `backend` ('auto' compiles what
    `forward` would pick). Each of head_dims, dtypes and causal is one value or a sequence;
    dtypes are names ('bfloat16', 'fp16', ...) or torch dtypes.

    decode_groups (query heads per K/V head, e.g. 4 for 32 query heads on 8 K/V heads) adds
    the decode kernels `forward` runs for at most 16 queries per sequence with that GQA ratio:
    with and without split-KV, with and without seqused_k, on a dense cache and on a paged
    one of each of page_sizes, and the merge of split-KV's partials; and the prefill kernels
    whose wgmma tiles pack that group (`tuning.sm90_pack_gqa`), where 'auto' packs one.

    varlen, windows, softcap add the kernels of calls with those features, alone and together:
    `forward_varlen` (ragged batches; with page_sizes, also against a paged cache), a
    `window_size` with a bounded left side, a softcap (for the decode kernels too).

    backward adds the backward's kernels (training: the preprocess, the main kernel and the
    postprocess) of each (head_dim, dtype, causal) and feature combination above; with
    deterministic, also those of the deterministic mode (`deterministic=True`, whose main
    kernels are others), which are otherwise compiled on first use.

    progress: called with a `Step` per kernel as it is compiled or found in the cache (its str is a
    line; the CLI prints them). Every argument is checked before anything compiles. Returns the
    kernel keys, in the order they were compiled."""
    head_dims = tuple(check_head_dim("head_dims", h)
                      for h in _as_tuple("head_dims", head_dims, (int,), "an int"))
    dtypes = tuple(_dtype(d) for d in _as_tuple("dtypes", dtypes, (str, torch.dtype),
                                                "a dtype"))
    causal = _as_tuple("causal", causal, (bool,), "a bool")
    for c in causal:
        if not isinstance(c, bool):
            raise TypeError(f"causal must be a bool or a sequence of bools, got {c!r}")
    check_backend(backend)
    for name, flag in (("varlen", varlen), ("windows", windows), ("softcap", softcap),
                       ("backward", backward), ("deterministic", deterministic)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    if deterministic and not backward:
        raise ValueError("deterministic needs backward=True (it adds the deterministic "
                         "mode's backward kernels)")
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
        if not torch.cuda.is_available():
            raise RuntimeError("precompile needs arch= (e.g. arch='sm_90a') when no CUDA GPU "
                               "is visible; torch.cuda.is_available() is False here")
        target = device(torch.cuda.current_device())
    else:
        target = stand_in(Arch.parse(arch).name)
    # (local, softcap, varlen) of the calls: each feature asked for, alone and together
    features = list(itertools.product(*((False, True) if on else (False,)
                                        for on in (windows, softcap, varlen))))
    planned = [plan(call, target, compile=False) for call in calls(
        head_dims, dtypes, causal, backend, decode_groups, page_sizes, features, backward,
        target.index, deterministic)]
    # every kernel those plans run, once each, in order
    keys = list(dict.fromkeys(key for p in planned for key in p.kernel_keys()))
    for n, key in enumerate(keys, 1):
        start = time.perf_counter()
        where = "in memory" if key in compiled_kernels else \
            "from the disk cache" if object_path(key).is_file() else "compiled"
        get_kernel(key)
        if progress is not None:
            progress(Step(n, len(keys), key, where, time.perf_counter() - start))
    wait_for_saves()
    return keys


def describe(key) -> str:
    """A kernel key in a few words: backend, arch, dtype, head_dim, its switched-on fields."""
    tile = getattr(key, "tile", None)
    parts = [key.backend, key.arch]
    if tile is not None:
        # the backward's row kernels (D = rowsum(dO * O), dQ's conversion) tile rows only
        size = (f"{tile.block_m}x{tile.block_n}" if hasattr(tile, "block_n")
                else f"{tile.block_m} rows")
        parts += [tile.dtype, f"head_dim {tile.head_dim}", size]
    else:
        parts += [f"{key.in_dtype}->{key.out_dtype}", f"head_dim {key.head_dim}"]
    flags = [name for name in ("causal", "local", "softcap", "varlen_q", "varlen_k", "split_kv",
                               "seqused_k", "deterministic", "varlen")
             if getattr(key, name, False) is True]
    if getattr(key, "pack_gqa", 1) > 1:
        flags.append(f"pack_gqa={key.pack_gqa}")
    if getattr(key, "page_size", 0):
        flags.append(f"page_size={key.page_size}")
    if getattr(key, "persistent", 0):
        flags.append(f"persistent={key.persistent}")
    return " ".join(parts + flags)


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
    if not torch.cuda.is_available():
        warnings.warn("CUTE_FA_PRECOMPILE is set but no CUDA GPU is visible: nothing compiled "
                      "(cute_fa.precompile(..., arch='sm_90a') compiles for a named GPU)",
                      RuntimeWarning, stacklevel=2)
        return
    precompile(head_dims=head_dims)
