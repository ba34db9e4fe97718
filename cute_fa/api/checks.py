"""Every argument rule of a call, written once, in the order a user fixes them: types, shapes,
values, then where the tensors live. Each public function runs its call through here before
anything else (with or without grad, eagerly or while torch.compile traces it), so bad input
gets a TypeError/ValueError naming the argument before any launch, and a user's `out=` is
untouched. `check_forward` covers the dense and the ragged layout (and a paged K/V cache in
either) and returns the frozen `runtime.call.AttentionCall` the plan decides from.

While a call is traced (torch.compile, export, make_fx), the tensors are fakes: the rules run on
their shapes, dtypes and strides (make_fx's fakes' alignment read from their storage offset), and
the rules that need the memory itself (a CUDA device, addresses under torch.compile,
CUTE_FA_CHECK_INDICES' values) run when the graph runs, in the custom op's body, which checks its
call again.
"""

from __future__ import annotations

import math
import numbers
import os

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..layouts.config import check_head_dim
from ..runtime.call import (DENSE, FAR_LEFT, NO_WINDOW, PLAIN, RAGGED, AttentionCall,
                            BackwardCall, MergeCall, ScoreFeatures, backward_of)
from ..tuning import (BACKENDS, MAX_PAGE_SIZE, MAX_SEQLEN_Q, MAX_SPLITS, PREFILL_ONLY,
                      check_backend, supported_page_size)
from ..tuning_bwd import check_bwd_backend

DTYPES = (torch.float16, torch.bfloat16)

# how a public function names its arguments in errors: forward's and forward_varlen's, sdpa's
# (whose tensors reach the checks transposed to (B, S, H, D) and are shown as written)
FORWARD_NAMES = {"causal": "causal", "softmax_scale": "softmax_scale"}
SDPA_NAMES = {"causal": "is_causal", "softmax_scale": "scale", "bhsd": True}

_LAYOUTS = {DENSE: "(batch, seqlen, heads, head_dim)", RAGGED: "(total_q, heads, head_dim)"}
_PAGED = "(num_pages, page_size, heads_kv, head_dim)"


def type_name(value) -> str:
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def indices_checked() -> bool:
    """CUTE_FA_CHECK_INDICES=1: every call checks the values inside its index tensors (a sync)."""
    return os.environ.get("CUTE_FA_CHECK_INDICES", "") not in ("", "0")


def check_tensor(name: str, t, layout: str = _LAYOUTS[DENSE], rank: int = 4) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in DTYPES:
        raise TypeError(f"{name} must be float16 or bfloat16, got {t.dtype}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D {layout}, got shape {tuple(t.shape)}")


def shown(dims, names) -> tuple:
    """A (B, S, H, D)-ordered shape or stride as the caller wrote it (sdpa: (B, H, S, D))."""
    dims = tuple(dims)
    return (dims[0], dims[2], dims[1], dims[3]) if names.get("bhsd") and len(dims) == 4 \
        else dims


def tracing(t) -> bool:
    """Whether `t` is being traced into a graph rather than computed on (torch.compile or
    export, or make_fx over fake tensors): its memory is not there."""
    return torch.compiler.is_compiling() or isinstance(t, FakeTensor)


def misaligned(t) -> bool:
    """Whether `t` starts off a 16-byte boundary: a fake tensor's from its storage offset (it
    has no address; torch's allocations are aligned). torch.compile traces neither: the custom
    op's body checks q, k and v when the graph runs, and a traced out= is filled by a copy."""
    if torch.compiler.is_compiling():
        return False
    if isinstance(t, FakeTensor):
        return bool(t.storage_offset() * t.element_size() % 16)
    return bool(t.data_ptr() % 16)


def check_layout(name: str, t, names=None) -> None:
    """What the kernels read and write: a unit last stride, the others multiples of 8
    elements (16 bytes), a 16-byte aligned start."""
    *outer, last = t.stride()
    if last != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), "
                         f"got strides {shown(t.stride(), names or {})}")
    if any(s % 8 for s in outer):
        raise ValueError(f"{name} strides must be multiples of 8 elements (16 bytes), "
                         f"got {shown(t.stride(), names or {})}")
    if misaligned(t):
        raise ValueError(f"{name} must start at a 16-byte aligned address")


def check_device(name: str, t, device_index: int) -> None:
    if not t.is_cuda:
        why = "" if torch.cuda.is_available() else \
            " (and torch sees no CUDA GPU here: torch.cuda.is_available() is False)"
        raise ValueError(f"{name} must be on a CUDA device, got device '{t.device}'{why}")
    if t.get_device() != device_index:
        raise ValueError(f"{name} must be on cuda:{device_index} like q, got {t.device}")


def check_devices(named, device_index: int) -> None:
    """Each (name, tensor or None) on cuda:device_index. While tracing only their agreement
    is checked (a CPU trace records a graph that never runs); the op's body checks the rest."""
    if any(t is not None and tracing(t) for _, t in named):
        for name, t in named:
            if t is not None and t.get_device() != device_index:
                raise ValueError(f"{name} must be on q's device, got {t.device}")
        return
    for name, t in named:
        if t is not None:
            check_device(name, t, device_index)


def finite(x) -> bool:
    """math.isfinite in comparisons, which torch.compile traces on a symbolic float too."""
    return x == x and x != math.inf and x != -math.inf


def as_bool(name: str, value) -> bool:
    """A Python bool, or numpy's (np.bool_, e.g. from a config array) taken as one."""
    if value is True or value is False:
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type_name(value)} {value!r}")


def as_scale(name: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive finite float or None, "
                        f"got {type_name(value)} {value!r}")
    if not finite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite float or None, got {value!r}")
    return float(value)


def as_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type_name(value)} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def as_deterministic(value) -> bool:
    """deterministic=None follows torch.use_deterministic_algorithms."""
    if value is None:
        return torch.are_deterministic_algorithms_enabled()
    return as_bool("deterministic", value)


def window_ints(window_size) -> tuple[int, int]:
    """window_size as (left, right) ints, or a TypeError naming what it must be."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or any(
            isinstance(w, bool) or not isinstance(w, numbers.Integral) for w in window_size):
        raise TypeError(f"window_size must be a pair of ints (left, right), -1 for an unbounded "
                        f"side, got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def score_features(causal: bool, window_size, softcap) -> ScoreFeatures:
    """window_size = (left, right) in flash-attn's sense: query i sees keys i + Sk - Sq - left
    ... i + Sk - Sq + right, -1 for an unbounded side. causal and a window both apply: the
    keys a query sees are those of the window up to the diagonal (right side 0), as in
    flash-attn."""
    if window_size is NO_WINDOW and softcap == 0.0:
        return PLAIN[causal]
    left, right = window_ints(window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size sides must be -1 (unbounded) or >= 0, got {(left, right)}")
    # a side past any sequence is unbounded (the kernels' key offsets stay within int32)
    left = -1 if left >= FAR_LEFT else left
    right = -1 if right >= FAR_LEFT else right
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float >= 0 (0: none), got {type_name(softcap)} "
                        f"{softcap!r}")
    if not finite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be a finite float >= 0 (0: none), got {softcap!r}")
    if causal:
        right = 0
    local = left >= 0 or right > 0
    return ScoreFeatures(causal=causal or right >= 0, local=local,
                         window_left=left if left >= 0 else FAR_LEFT,
                         window_right=max(right, 0), softcap=float(softcap))


def check_out(out, q, names=FORWARD_NAMES, layout: str = _LAYOUTS[DENSE], rank: int = 4) -> tuple:
    """(("out", out),) once `out` is a tensor of q's dtype and shape, () for None; its layout
    and device are checked with q's."""
    if out is None:
        return ()
    check_tensor("out", out, layout, rank)
    if out.dtype != q.dtype:
        raise TypeError(f"out must have dtype {q.dtype} like q, got {out.dtype}")
    if out.shape != q.shape:
        raise ValueError(f"out must have the shape of q, {shown(q.shape, names)}, "
                         f"got {shown(out.shape, names)}")
    return (("out", out),)


def _check_query_blocks(name: str, seqlen_q: int) -> None:
    """Causal kernels put the query blocks on the grid's y (longest first across heads), whose
    extent is at most 65535."""
    if seqlen_q > MAX_SEQLEN_Q:
        raise ValueError(f"{name} must be at most {MAX_SEQLEN_Q} (65535 query blocks of 64 "
                         f"rows), got {seqlen_q}")


def _check_cache_tensors(seqused_k, page_table, batch: int) -> None:
    """seqused_k int32 (batch,) and page_table int32 (batch, pages >= 1), each None or a tensor
    with a contiguous last dimension."""
    for name, t, rank, shape in (("seqused_k", seqused_k, 1, "(batch,)"),
                                 ("page_table", page_table, 2, "(batch, max_pages_per_seq)")):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type_name(t)}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be an int32 tensor, got {t.dtype}")
        if t.dim() != rank or t.shape[0] != batch or (rank == 2 and t.shape[1] < 1):
            raise ValueError(f"{name} must have shape {shape} with batch={batch}, "
                             f"got {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension, got strides "
                             f"{t.stride()}")


def _as_splits(num_splits, batch: int) -> int | None:
    if num_splits is None:
        return None
    if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral):
        raise TypeError(f"num_splits must be an int or None, got {type_name(num_splits)} "
                        f"{num_splits!r}")
    num_splits = int(num_splits)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be from 1 to {MAX_SPLITS} or None, got {num_splits}")
    if batch * num_splits > 65535:
        raise ValueError(f"num_splits * batch must be at most 65535 (the grid's z), got "
                         f"{num_splits} * {batch}")
    return num_splits


def check_cu_seqlens(name: str, t, batch: int | None) -> int:
    """An int32 (batch + 1,) contiguous tensor of offsets; returns batch."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type_name(t)}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be an int32 tensor, got {t.dtype}")
    want = "(batch + 1,)" if batch is None else f"(batch + 1,) = ({batch + 1},) like cu_seqlens_q"
    if t.dim() != 1 or t.shape[0] < 2 or (batch is not None and t.shape[0] != batch + 1):
        raise ValueError(f"{name} must have shape {want} with batch >= 1, got {tuple(t.shape)}")
    if t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous, got stride {t.stride()}")
    return t.shape[0] - 1


def check_forward(layout: str, q, k, v, *, out=None, softmax_scale=None, causal=False,
                  return_lse=False, backend="auto", window_size=NO_WINDOW, softcap=0.0,
                  seqused_k=None, page_table=None, num_splits=None, cu_seqlens_q=None,
                  cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                  bottom_right: bool = True, names=FORWARD_NAMES) -> AttentionCall:
    """Every rule of a forward call in `layout` (DENSE: `forward`, `sdpa`; RAGGED:
    `forward_varlen`), a paged K/V cache where page_table is given; the checked call."""
    ragged = layout == RAGGED
    paged = page_table is not None
    rank = 3 if ragged else 4
    kv_layout = _PAGED if paged else ("(total_k, heads_kv, head_dim)" if ragged
                                      else _LAYOUTS[DENSE])
    check_tensor("q", q, _LAYOUTS[layout], rank)
    check_tensor("k", k, kv_layout, 4 if paged else rank)
    check_tensor("v", v, kv_layout, 4 if paged else rank)
    if not (k.dtype == q.dtype and v.dtype == q.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    causal = as_bool(names["causal"], causal)
    return_lse = as_bool("return_lse", return_lse)
    softmax_scale = as_scale(names["softmax_scale"], softmax_scale)
    features = score_features(causal, window_size, softcap)
    check_backend(backend)
    if ragged:
        batch = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, None)
        if cu_seqlens_k is None:
            if not paged:
                raise ValueError("cu_seqlens_k may be None only with a page_table (a paged k/v, "
                                 "whose lengths come from seqused_k)")
        else:
            check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, batch)
        seqlen_q = as_count("max_seqlen_q", max_seqlen_q)
        max_seqlen_k = as_count("max_seqlen_k", max_seqlen_k)
        if seqlen_q > q.shape[0]:
            raise ValueError(f"max_seqlen_q ({seqlen_q}) must be at most the number of query "
                             f"rows, total_q = q.shape[0] = {q.shape[0]}")
        if not paged and max_seqlen_k > k.shape[0]:
            raise ValueError(f"max_seqlen_k ({max_seqlen_k}) must be at most the number of key "
                             f"rows, total_k = k.shape[0] = {k.shape[0]}")
        _check_query_blocks("max_seqlen_q", seqlen_q)
        if batch > 65535:
            raise ValueError(f"cu_seqlens_q holds {batch} sequences; at most 65535 (the grid's z)")
        _, heads_q, head_dim = q.shape
        if heads_q < 1:
            raise ValueError(f"q must have at least one head, got shape {tuple(q.shape)}")
    else:
        batch, seqlen_q, heads_q, head_dim = q.shape
        if batch < 1 or seqlen_q < 1 or heads_q < 1:
            raise ValueError(f"q must have non-empty dimensions, got shape {shown(q.shape, names)}")
        _check_query_blocks(f"seqlen_q (q.shape[{2 if names.get('bhsd') else 1}])", seqlen_q)
    check_head_dim("head_dim (q.shape[-1])", head_dim)
    heads_kv = k.shape[-2]
    if paged:
        if k.shape[0] < 1 or k.shape[3] != head_dim or heads_kv < 1:
            raise ValueError(f"k must be a paged cache of shape (num_pages>=1, page_size, "
                             f"heads_kv>=1, head_dim={head_dim}), got {tuple(k.shape)}")
        if not supported_page_size(k.shape[1]):
            raise ValueError(f"the page size (k.shape[1]) must be a multiple of 16 from 16 to "
                             f"{MAX_PAGE_SIZE}, got {k.shape[1]}")
    elif ragged:
        if k.shape[2] != head_dim or k.shape[1] < 1:
            raise ValueError(f"k must have shape (total_k, heads_kv>=1, head_dim={head_dim}), "
                             f"got {tuple(k.shape)}")
    elif k.shape[0] != batch or k.shape[3] != head_dim or k.shape[1] < 1 or heads_kv < 1:
        middle = "heads_k>=1, seqlen_k>=1" if names.get("bhsd") else "seqlen_k>=1, heads_k>=1"
        raise ValueError(f"k must have shape (batch={batch}, {middle}, head_dim={head_dim}), "
                         f"got {shown(k.shape, names)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k, {shown(k.shape, names)}, "
                         f"got {shown(v.shape, names)}")
    if heads_q % heads_kv:
        raise ValueError(f"the number of query heads ({heads_q}) must be a multiple of the number "
                         f"of key/value heads ({heads_kv})")
    named = (("q", q), ("k", k), ("v", v)) + check_out(out, q, names, _LAYOUTS[layout], rank)
    for name, t in named:
        check_layout(name, t, names)
    _check_cache_tensors(seqused_k, page_table, batch)
    num_splits = _as_splits(num_splits, batch)
    if backend in PREFILL_ONLY and (seqused_k is not None or paged or (num_splits or 1) > 1):
        raise ValueError(f"backend={backend!r} takes no seqused_k, page_table or num_splits > 1 "
                         f"(the cp.async kernel runs decode); use backend='sm80' or 'auto'")
    device_index = q.get_device()
    check_devices(named + (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                           ("seqused_k", seqused_k), ("page_table", page_table)), device_index)
    if indices_checked() and not tracing(q):
        if ragged:
            _check_ragged_values(q, k, cu_seqlens_q, cu_seqlens_k, seqlen_q, max_seqlen_k,
                                 paged, seqused_k, page_table)
        if paged or seqused_k is not None:
            _check_cache_values(k, seqused_k, page_table)
    if paged:
        seqlen_k = page_table.shape[1] * k.shape[1]
    else:
        seqlen_k = max_seqlen_k if ragged else k.shape[1]
    return AttentionCall(
        layout, q.dtype, head_dim, batch, seqlen_q, seqlen_k, heads_q, heads_kv, features,
        softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim),
        k.shape[1] - seqlen_q if bottom_right and not ragged else 0, return_lse, backend,
        device_index, k.shape[1] if paged else 0, seqused_k is not None,
        ragged and cu_seqlens_k is not None, num_splits)


def plain_call(q, k, v, out, softmax_scale, causal, return_lse, backend) -> AttentionCall | None:
    """The checked call of a dense `forward` without windows, softcap or a KV cache, built
    fast where every rule plainly holds; None for anything else, which `check_forward` then
    accepts the same way or refuses by name."""
    T = torch.Tensor
    if type(q) is not T or type(k) is not T or type(v) is not T:
        return None
    if (causal is not True and causal is not False) or \
            (return_lse is not True and return_lse is not False):
        return None
    if softmax_scale is not None and not (type(softmax_scale) is float
                                          and 0.0 < softmax_scale < math.inf):
        return None
    if backend not in BACKENDS:
        return None
    dtype = q.dtype
    if dtype not in DTYPES or k.dtype != dtype or v.dtype != dtype:
        return None
    qs, ks = q.shape, k.shape
    if len(qs) != 4 or len(ks) != 4 or v.shape != ks:
        return None
    batch, seqlen_q, heads_q, head_dim = qs
    if ks[0] != batch or ks[3] != head_dim or min(batch, seqlen_q, heads_q, ks[1], ks[2]) < 1 \
            or seqlen_q > MAX_SEQLEN_Q \
            or head_dim % 8 or not 8 <= head_dim <= 256 or heads_q % ks[2]:
        return None
    tensors = (q, k, v)
    if out is not None:
        if type(out) is not T or out.dtype != dtype or out.shape != qs:
            return None
        tensors = (q, k, v, out)
    device_index = q.get_device()
    for t in tensors:
        s0, s1, s2, s3 = t.stride()
        if s3 != 1 or s0 % 8 or s1 % 8 or s2 % 8 or t.data_ptr() % 16 or not t.is_cuda \
                or t.get_device() != device_index:
            return None
    return AttentionCall(DENSE, dtype, head_dim, batch, seqlen_q, ks[1], heads_q, ks[2],
                         PLAIN[causal], softmax_scale if softmax_scale is not None
                         else 1.0 / math.sqrt(head_dim), ks[1] - seqlen_q, return_lse, backend,
                         device_index)


def _check_cache_values(k, seqused_k, page_table) -> None:
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


def _check_ragged_values(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, paged,
                         seqused_k, page_table) -> None:
    """CUTE_FA_CHECK_INDICES=1: cu_seqlens start at 0, never decrease and end within the
    tensors; max_seqlen_q and max_seqlen_k are at least every query and key length; each
    sequence's keys (seqused_k or cu_seqlens_k's lengths) lie within its own rows of k
    (ragged) or its pages (paged). Syncs with the device."""
    lengths_k = None
    for name, cu, total, longest in (
            ("cu_seqlens_q", cu_seqlens_q, q.shape[0], ("max_seqlen_q", max_seqlen_q)),
            ("cu_seqlens_k", cu_seqlens_k, None if paged else k.shape[0],
             ("max_seqlen_k", max_seqlen_k))):
        if cu is None:
            continue
        lengths = (cu[1:] - cu[:-1]).tolist()
        first, last = int(cu[0]), int(cu[-1])
        if first != 0 or min(lengths) < 0 or (total is not None and last > total):
            raise ValueError(f"{name} must start at 0, never decrease and end at most at "
                             f"{total}, got {cu.tolist()}")
        if max(lengths) > longest[1]:
            raise ValueError(f"{longest[0]} ({longest[1]}) is less than the longest "
                             f"{'query' if name == 'cu_seqlens_q' else 'key'} sequence "
                             f"({max(lengths)})")
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


def _check_grad_shape(name: str, t, like, like_name: str, layout: str) -> None:
    """dout, out (or a given dq/dk/dv): a tensor of `like`'s shape and dtype."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type_name(t)}")
    if t.dtype != like.dtype:
        raise TypeError(f"{name} must have dtype {like.dtype} like {like_name}, got {t.dtype}")
    if t.shape != like.shape:
        raise ValueError(f"{name} must have the shape of {like_name}, {layout} = "
                         f"{tuple(like.shape)}, got {tuple(t.shape)}")


def _check_lse(lse, shape: tuple, layout: str) -> None:
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"lse must be a torch.Tensor, got {type_name(lse)}")
    if lse.dtype != torch.float32:
        raise TypeError(f"lse must be float32 (the forward's return_lse=True), got {lse.dtype}")
    if tuple(lse.shape) != shape:
        raise ValueError(f"lse must have shape {layout} = {shape}, got {tuple(lse.shape)}")
    if lse.stride(-1) != 1:
        raise ValueError(f"lse must have a contiguous last dimension, got strides "
                         f"{lse.stride()}")


def check_backward(layout: str, dout, q, k, v, out, lse, *, causal=False, softmax_scale=None,
                   window_size=NO_WINDOW, softcap=0.0, deterministic=None, dq=None, dk=None,
                   dv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                   max_seqlen_k=None, bottom_right: bool = True,
                   backend: str = "auto") -> BackwardCall:
    """Every rule of a backward call (`backward`, `backward_varlen`, autograd's): the
    forward's rules for q, k, v and the scalars, then dout, out, lse and any given dq, dk,
    dv: every shape and dtype first, then every layout and device. backend: the main
    kernel's, "auto", "sm80" or "sm90" (whether the GPU and head_dim take it is the plan's
    check, before any launch)."""
    check_bwd_backend(backend)
    ragged = layout == RAGGED
    q_layout = _LAYOUTS[layout]
    rank = 3 if ragged else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, q_layout, rank)
    for name, t in (("dout", dout), ("out", out)):
        _check_grad_shape(name, t, q, "q", q_layout)
    if ragged:
        _check_lse(lse, (q.shape[1], q.shape[0]), "(heads_q, total_q)")
        if cu_seqlens_k is None:
            raise ValueError("backward_varlen needs cu_seqlens_k (a paged K/V cache has no "
                             "gradient here)")
    else:
        batch, seqlen_q, heads_q, _ = q.shape
        _check_lse(lse, (batch, heads_q, seqlen_q), "(batch, heads_q, seqlen_q)")
    fwd = check_forward(layout, q, k, v, softmax_scale=softmax_scale, causal=causal,
                        window_size=window_size, softcap=softcap, cu_seqlens_q=cu_seqlens_q,
                        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                        max_seqlen_k=max_seqlen_k, bottom_right=bottom_right)
    grads = [(name, t, like_name, like) for name, t, like_name, like in (
        ("dout", dout, "q", q), ("out", out, "q", q), ("dq", dq, "q", q), ("dk", dk, "k", k),
        ("dv", dv, "v", v)) if t is not None]
    for name, t, like_name, like in grads:
        _check_grad_shape(name, t, like, like_name, q_layout)
    for name, t, _, like in grads:
        check_layout(name, t)
    check_devices([(name, t) for name, t, _, _ in grads] + [("lse", lse)], fwd.device_index)
    return backward_of(fwd, as_deterministic(deterministic))._replace(backend=backend)


def check_merge(o_parts, lse_parts) -> MergeCall:
    """`merge_attention`'s rules."""
    if not isinstance(o_parts, torch.Tensor):
        raise TypeError(f"o_parts must be a torch.Tensor, got {type_name(o_parts)}")
    if not isinstance(lse_parts, torch.Tensor):
        raise TypeError(f"lse_parts must be a torch.Tensor, got {type_name(lse_parts)}")
    if o_parts.dtype not in (torch.float32,) + DTYPES:
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
            misaligned(o_parts):
        raise ValueError(f"o_parts must have a contiguous last dimension, strides that are "
                         f"multiples of 8 and a 16-byte aligned start, got strides "
                         f"{o_parts.stride()}")
    if lse_parts.stride(-1) != 1:
        raise ValueError(f"lse_parts must have a contiguous last dimension, got strides "
                         f"{lse_parts.stride()}")
    device_index = o_parts.get_device()
    check_devices((("o_parts", o_parts), ("lse_parts", lse_parts)), device_index)
    return MergeCall(o_parts.dtype, o_parts.dtype, head_dim, device_index)


def decode_call(call: AttentionCall) -> bool:
    """Whether a checked call has KV-cache arguments (which have no backward)."""
    return bool(call.page_size or call.seqused_k or call.num_splits is not None)

