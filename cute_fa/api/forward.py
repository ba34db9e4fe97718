"""The forward entry points: `forward` (flash-attn's layout), `sdpa` (torch SDPA's),
`forward_varlen` (a ragged batch packed end to end) and `merge_attention`.

Each checks its whole call first (`api.checks`, the same rules with or without grad), then
takes one of three routes to the same implementation (`runtime.run`): straight to the kernels
(an eager call without grad, which never meets the dispatcher), through a plain
`torch.autograd.Function` (an eager call that autograd must record, `api.autograd`), or
through the custom ops that torch.compile traces (`api.ops`).
"""

from __future__ import annotations

from typing import Callable, Literal, overload

import torch

from ..runtime.call import DENSE, NO_WINDOW, RAGGED, AttentionCall
from ..runtime.device import device
from ..runtime.plan import plan
from ..runtime.run import run_forward, run_merge, score_tensors
from . import autograd, ops
from .mods import (NONE, TracedMods, block_backward, exact_blocks, needs_grad,
                   refuse_under_compile, refuse_without_backward, trace_mods, with_mods)
from .checks import (SDPA_NAMES, as_bool, as_deterministic, check_forward, check_merge,
                     check_tensor, decode_call, plain_call, tracing, window_ints)

Backend = Literal["auto", "sm80", "tma", "sm90"]


def requires_grad(q, k, v) -> bool:
    """Autograd must record the call: grad mode is on and an input requires grad."""
    return torch.is_grad_enabled() and (
        getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
        or getattr(v, "requires_grad", False))


def _refuse_without_backward(call: AttentionCall, out) -> None:
    """What autograd cannot honour raises (nothing is silently detached). A ragged call without
    cu_seqlens_k is a paged one (`check_forward`), so a KV-cache call."""
    if decode_call(call):
        raise ValueError("seqused_k, page_table and num_splits (a KV cache) have no backward: "
                         "call it under torch.no_grad() or without inputs that require grad")
    if out is not None:
        raise ValueError("out= has no backward: leave it None when q, k, v (or sinks) require "
                         "grad")


def _mods_under_compile(score_mod, mask_mod, sinks, block_mask) -> bool:
    """Whether a call with mods, sinks or a block mask is being traced by torch.compile: it
    then goes into the graph as `graph_mods`' op where it can (mods and sinks of a call
    without a block mask or a KV cache, the functions made outside the compiled region, their
    tensors within reach), else runs eagerly, behind a graph break (`_eager`)."""
    return (score_mod is not None or mask_mod is not None or sinks is not None
            or block_mask is not None) and torch.compiler.is_compiling()


def _graph_mods():
    """`api.graph_mods`, imported only while a graph is traced: it loads torch._dynamo (its
    decorator's module), which at import would add about 2 s to every process's first call,
    and which a traced call has loaded already."""
    from . import graph_mods

    return graph_mods


def _eager(fn):
    """fn, called outside the graph torch.compile traces (a graph break, then fn eagerly on
    the real tensors, autograd recording it as an eager call)."""
    return torch.compiler.disable(fn, recursive=True)


def _attend(call: AttentionCall, q, k, v, out, deterministic, original: tuple, *,
            cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, page_table=None,
            mods: TracedMods = NONE):
    """The call, checked, down its route. original: (causal, window_size, softcap,
    bottom_right) as the caller gave them, which the custom ops take (their eager body checks
    them again). mods: the call's traced mods, already in call.features (eager, no grad)."""
    if tracing(q):
        refuse_under_compile(mods)
        o, lse = _through_op(call, q, k, v, out, deterministic, original, cu_seqlens_q,
                             cu_seqlens_k, seqused_k, page_table)
    elif requires_grad(q, k, v) or needs_grad(mods):
        refuse_without_backward(mods)
        _refuse_without_backward(call, out)
        blocks = None
        if mods.block_mask is not None:
            blocks = block_backward(call, mods, as_deterministic(deterministic))
            read = len(mods.captures)
            call, mods, _ = exact_blocks(call, mods, plan(call, device(call.device_index)),
                                         lambda c: plan(c, device(c.device_index)))
            if len(mods.captures) > read:  # the forward reads the kinds already
                blocks = blocks._replace(extra=())
        o, lse = autograd.attention(call, as_deterministic(deterministic), q, k, v,
                                    cu_seqlens_q, cu_seqlens_k, sinks=mods.sinks,
                                    captures=mods.captures, blocks=blocks)
    else:
        planned = plan(call, device(call.device_index))
        if mods.block_mask is not None:
            call, mods, planned = exact_blocks(call, mods, planned,
                                               lambda c: plan(c, device(c.device_index)))
        o, lse = run_forward(call, planned, q, k, v, out,
                             cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                             seqused_k=seqused_k, page_table=page_table,
                             score_tensors=score_tensors(mods.captures, mods.sinks),
                             block_mask=mods.block_mask)
    return (o, lse) if call.return_lse else o


def _through_op(call, q, k, v, out, deterministic, original, cu_seqlens_q, cu_seqlens_k,
                seqused_k, page_table) -> tuple:
    """While a graph is traced: the custom op `cute_fa::fwd` / `fwd_varlen`, whose output
    is copied into `out` where one is given (checked above by the eager rules). A KV-cache call
    runs outside the graph: its plan reads the cache's arguments on the host."""
    if decode_call(call):
        if requires_grad(q, k, v):
            _refuse_without_backward(call, out)
        return torch.compiler.disable(run_forward)(
            call, plan(call, device(call.device_index)), q, k, v, out,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
            page_table=page_table)
    if out is not None and requires_grad(q, k, v):
        _refuse_without_backward(call, out)
    causal, window_size, softcap, bottom_right = original
    left, right = window_ints(window_size)
    scale, det = float(call.softmax_scale), as_deterministic(deterministic)
    if call.layout == RAGGED:
        o, lse = ops.fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, call.seqlen_q,
                                call.seqlen_k, bool(causal), scale, left, right,
                                float(softcap), call.backend, det)
    else:
        o, lse = ops.fwd(q, k, v, bool(causal), scale, left, right, float(softcap),
                         bottom_right, call.backend, det)
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse


@overload
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = ...,
            softmax_scale: float | None = ..., return_lse: Literal[False] = ...,
            out: torch.Tensor | None = ..., backend: Backend = ..., *,
            window_size: tuple[int, int] = ..., softcap: float = ...,
            seqused_k: torch.Tensor | None = ..., page_table: torch.Tensor | None = ...,
            num_splits: int | None = ..., deterministic: bool | None = ...,
            score_mod: Callable | None = ..., mask_mod: Callable | None = ...,
            sinks: torch.Tensor | None = ..., block_mask: object = ...) -> torch.Tensor: ...


@overload
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = ...,
            softmax_scale: float | None = ..., *, return_lse: Literal[True],
            out: torch.Tensor | None = ..., backend: Backend = ...,
            window_size: tuple[int, int] = ..., softcap: float = ...,
            seqused_k: torch.Tensor | None = ..., page_table: torch.Tensor | None = ...,
            num_splits: int | None = ..., deterministic: bool | None = ...,
            score_mod: Callable | None = ..., mask_mod: Callable | None = ...,
            sinks: torch.Tensor | None = ..., block_mask: object = ...
            ) -> tuple[torch.Tensor, torch.Tensor]: ...


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
            softmax_scale: float | None = None, return_lse: bool = False,
            out: torch.Tensor | None = None, backend: Backend = "auto", *,
            window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0,
            seqused_k: torch.Tensor | None = None, page_table: torch.Tensor | None = None,
            num_splits: int | None = None, deterministic: bool | None = None,
            score_mod: Callable | None = None, mask_mod: Callable | None = None,
            sinks: torch.Tensor | None = None, block_mask: object = None,
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
    num_splits: how many CTAs share one query block's keys (split-KV, merged by the last of
    them where `tuning.decode_fused_merge` says so, else by `merge_attention`'s kernel); None
    picks it (tuning.num_splits_heuristic), 1 never splits.
    Calls with at most 16 queries per sequence pack the query heads of a GQA group into one
    tile, so K and V are read once per group.

    score_mod(score, b, h, q_idx, kv_idx) -> score and mask_mod(b, h, q_idx, kv_idx) -> bool:
    FlexAttention's mods, compiled into the kernel. score is q.k * softmax_scale (float32), b
    the batch entry, h the query head, q_idx and kv_idx the query's and key's positions in
    their sequences; a key whose mask_mod is False weighs nothing (with causal, a window or
    the sequence's end, on top of them). The vocabulary: arithmetic, comparisons,
    torch.where, abs, exp, tanh, sigmoid, torch.minimum/maximum/clamp, integer // and %, & |
    ~, and tensors indexed by the indices (on q's device: a bias table, per-head slopes,
    document ids); anything else raises a TypeError naming it. Each call traces the
    functions (microseconds); a new function compiles its kernel once, new values in its
    tensors never recompile. Differentiable in q, k, v (the mma.sync backward runs the mods
    and score_mod's derivative, `cute_fa.mods.grad`) and in the float tensors the score_mod
    captures (a bias table, slopes: their gradients are summed by the backward kernel; a
    tensor the mask_mod captures gets none, a mask being piecewise constant). Not with
    softcap (write it into the score_mod). Under torch.compile a call with mods or sinks is
    the custom op `cute_fa::fwd_mods` (`cute_fa.api.graph_mods`), no graph break, where the
    functions were made outside the compiled region and each tensor they read is a global,
    in their closure or a default, or an attribute of one; otherwise, with a block mask or a
    KV cache, it runs eagerly behind a graph break (fullgraph=True refuses that).
    sinks: float (heads_q,), one logit per query head (gpt-oss's attention sinks, HF's
    s_aux): each row's softmax has one more term, exp(sinks[h]), of a key with value 0, so
    the weights of the real keys sum to less than one; lse includes it. Differentiable: where
    sinks require grad, autograd records the call and gives them their gradient.
    block_mask: a block-sparse mask (`cute_fa.mods.block_mask.create_block_mask`'s, or torch's
    `create_block_mask`'s or `BlockMask.from_kv_blocks`'): what FlexAttention's kernels keep,
    every score of a full block, a partial block's where its mask_mod keeps them (every one
    without a mask_mod), none of an unlisted block. Each query tile visits only the key
    tiles that meet listed blocks, on a tile that fits inside the mask's blocks where the
    kernel has one (`tuning.mods_tile`), else reading the blocks' kinds per score. Calls
    without causal or a window (the mask says them), num_splits 1; the sm80 and sm90
    kernels. With a KV cache it is made for the cache's capacity and each entry visits the
    listed blocks below its seqused_k (a GQA group's heads packed into one tile where the mask
    has one head), once `cute_fa.mods.block_mask.SEQUENCE_BLOCK_MASKS` is on (it awaits a GPU
    check; off, a ValueError says so). Differentiable: each key tile
    of the backward visits the query tiles that meet listed blocks (those it keeps whole
    unmasked, `block_mask.SPARSE_BACKWARD`), all of them where deterministic.

    Gradients: where q, k or v require grad, the output's grad_fn runs cute_fa's backward
    kernels (`cute_fa.backward`); lse is returned as a non-differentiable output. deterministic:
    True makes dq bitwise repeatable (its float32 sums formed in a fixed order, slower), None
    follows `torch.use_deterministic_algorithms`. The KV-cache arguments and out= have no
    backward: with inputs that require grad they raise. Under torch.compile the call is the
    custom op `cute_fa::fwd` (`cute_fa.api.ops`), traced without a graph break.
    """
    if deterministic is not None:  # without grad there is nothing to make deterministic
        as_bool("deterministic", deterministic)
    call = None
    if seqused_k is None and page_table is None and num_splits is None and softcap == 0.0 \
            and type(window_size) is tuple and window_size == NO_WINDOW \
            and score_mod is None and mask_mod is None and sinks is None \
            and block_mask is None \
            and not torch.compiler.is_compiling():  # (it reads addresses, which traces lack)
        call = plain_call(q, k, v, out, softmax_scale, causal, return_lse, backend)
    mods = NONE
    if call is None:
        if _mods_under_compile(score_mod, mask_mod, sinks, block_mask):
            if block_mask is None and out is None and seqused_k is None \
                    and page_table is None and num_splits is None:
                check_forward(DENSE, q, k, v, softmax_scale=softmax_scale, causal=causal,
                              backend=backend, window_size=window_size, softcap=softcap)
                got = _graph_mods().attend(q, k, v, score_mod, mask_mod, sinks, causal,
                                           softmax_scale, window_size, softcap, True, backend,
                                           deterministic)
                if got is not None:
                    return got if return_lse else got[0]
            return _eager(forward)(q, k, v, causal, softmax_scale, return_lse, out, backend,
                                   window_size=window_size, softcap=softcap,
                                   seqused_k=seqused_k, page_table=page_table,
                                   num_splits=num_splits, deterministic=deterministic,
                                   score_mod=score_mod, mask_mod=mask_mod, sinks=sinks,
                                   block_mask=block_mask)
        call = check_forward(DENSE, q, k, v, out=out, softmax_scale=softmax_scale,
                             causal=causal, return_lse=return_lse, backend=backend,
                             window_size=window_size, softcap=softcap, seqused_k=seqused_k,
                             page_table=page_table, num_splits=num_splits)
        mods = trace_mods(score_mod, mask_mod, q, softcap, sinks, call.heads_q, block_mask,
                          call)
        call = with_mods(call, mods)
    return _attend(call, q, k, v, out, deterministic, (causal, window_size, softcap, True),
                   seqused_k=seqused_k, page_table=page_table, mods=mods)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
         scale: float | None = None, backend: Backend = "auto", *,
         deterministic: bool | None = None, score_mod: Callable | None = None,
         mask_mod: Callable | None = None, sinks: torch.Tensor | None = None,
         block_mask: object = None) -> torch.Tensor:
    """Like torch.nn.functional.scaled_dot_product_attention on (batch, heads, seqlen, head_dim).

    Top-left causal, as torch does; same kernel as `forward`, reached through strides, and
    differentiable as `forward` is. score_mod, mask_mod, sinks, block_mask: `forward`'s.
    """
    if _mods_under_compile(score_mod, mask_mod, sinks, block_mask):
        if block_mask is None:
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            check_forward(DENSE, qt, kt, vt, softmax_scale=scale, causal=is_causal,
                          backend=backend, bottom_right=False, names=SDPA_NAMES)
            got = _graph_mods().attend(qt, kt, vt, score_mod, mask_mod, sinks, is_causal, scale,
                                       NO_WINDOW, 0.0, False, backend, deterministic)
            if got is not None:
                return got[0].transpose(1, 2)
        return _eager(sdpa)(q, k, v, is_causal, scale, backend, deterministic=deterministic,
                            score_mod=score_mod, mask_mod=mask_mod, sinks=sinks,
                            block_mask=block_mask)
    if deterministic is not None:
        as_bool("deterministic", deterministic)
    for name, t in (("q", q), ("k", k), ("v", v)):  # before the transposes below
        check_tensor(name, t, "(batch, heads, seqlen, head_dim)")
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    call = check_forward(DENSE, qt, kt, vt, softmax_scale=scale, causal=is_causal,
                         backend=backend, bottom_right=False, names=SDPA_NAMES)
    mods = trace_mods(score_mod, mask_mod, q, sinks=sinks, heads_q=call.heads_q,
                      block_mask=block_mask, call=call)
    call = with_mods(call, mods)
    out = None
    if not tracing(q) and not requires_grad(q, k, v) and not needs_grad(mods):
        out = torch.empty_like(q).transpose(1, 2)  # o in q's own (batch, heads, ...) order
    return _attend(call, qt, kt, vt, out, deterministic, (is_causal, NO_WINDOW, 0.0, False),
                   mods=mods).transpose(1, 2)


@overload
def forward_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor | None,
                   max_seqlen_q: int, max_seqlen_k: int, causal: bool = ...,
                   softmax_scale: float | None = ..., window_size: tuple[int, int] = ...,
                   softcap: float = ..., return_lse: Literal[False] = ...,
                   out: torch.Tensor | None = ..., backend: Backend = ..., *,
                   seqused_k: torch.Tensor | None = ...,
                   page_table: torch.Tensor | None = ...,
                   deterministic: bool | None = ..., score_mod: Callable | None = ...,
                   mask_mod: Callable | None = ..., sinks: torch.Tensor | None = ...,
                   block_mask: object = ...) -> torch.Tensor: ...


@overload
def forward_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor | None,
                   max_seqlen_q: int, max_seqlen_k: int, causal: bool = ...,
                   softmax_scale: float | None = ..., window_size: tuple[int, int] = ...,
                   softcap: float = ..., *, return_lse: Literal[True],
                   out: torch.Tensor | None = ..., backend: Backend = ...,
                   seqused_k: torch.Tensor | None = ...,
                   page_table: torch.Tensor | None = ...,
                   deterministic: bool | None = ..., score_mod: Callable | None = ...,
                   mask_mod: Callable | None = ..., sinks: torch.Tensor | None = ...,
                   block_mask: object = ...) -> tuple[torch.Tensor, torch.Tensor]:
    ...


def forward_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor | None,
                   max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                   softmax_scale: float | None = None, window_size: tuple[int, int] = NO_WINDOW,
                   softcap: float = 0.0, return_lse: bool = False,
                   out: torch.Tensor | None = None, backend: Backend = "auto", *,
                   seqused_k: torch.Tensor | None = None,
                   page_table: torch.Tensor | None = None, deterministic: bool | None = None,
                   score_mod: Callable | None = None, mask_mod: Callable | None = None,
                   sinks: torch.Tensor | None = None, block_mask: object = None,
                   ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention forward over a ragged batch packed end to end (flash-attn's
    `flash_attn_varlen_func`), in one launch, with no host sync and no copy; differentiable
    as `forward` is.

    q: (total_q, heads_q, head_dim); k, v: (total_k, heads_kv, head_dim); sequence b's
    queries are rows cu_seqlens_q[b] ... cu_seqlens_q[b + 1] - 1 of q, its keys rows
    cu_seqlens_k[b] ... of k and v. cu_seqlens_q/k: int32 (batch + 1,), starting at 0.
    Sequences may be empty; rows of q past cu_seqlens_q[-1] belong to no sequence, and their
    rows of o are not written. causal is bottom-right per sequence (its last query sees its
    last key); window_size, softcap, softmax_scale and backend are `forward`'s. Returns o
    (total_q, heads_q, head_dim), or (o, lse) with lse float32 (heads_q, total_q).

    max_seqlen_q and max_seqlen_k must be at least the longest query and key sequence: they
    size the grids (max_seqlen_q the forward's, max_seqlen_k the backward's). Checked for free:
    each is at most its tensor's rows. Checked under CUTE_FA_CHECK_INDICES=1 (a device sync)
    against cu_seqlens. Otherwise trusted, and a value too small leaves work undone without
    an error: query rows past max_seqlen_q in a longer sequence are not written, and keys past
    max_seqlen_k get no gradient (dk, dv stay 0).

    seqused_k: int32 (batch,), the keys of each sequence actually used (from its first).
    page_table: int32 (batch, max_pages_per_seq): k and v are then a paged cache (num_pages,
    page_size, heads_kv, head_dim) as in `forward`; cu_seqlens_k may then be None (each
    sequence has seqused_k[b] keys, or the page table's capacity).
    cu_seqlens, seqused_k and page_table values are trusted as well (CUTE_FA_CHECK_INDICES=1
    checks them). The TMA kernel reads a sequence's last K/V tile whole, into the next
    sequence's rows (or past cu_seqlens_k[-1]): those keys weigh exactly zero, but rows of k and
    v below total_k must hold finite values (0 x NaN is NaN).
    score_mod, mask_mod: `forward`'s, b being the sequence and q_idx, kv_idx positions in it;
    sinks: `forward`'s. block_mask: `forward`'s, made for (batch = the sequences or 1,
    seqlen_q, seqlen_k) at least (max_seqlen_q, max_seqlen_k) (a paged cache's: its
    capacity), sequence b's positions its first ones; each query tile visits the listed key
    blocks inside its sequence. Off until checked on a GPU
    (`cute_fa.mods.block_mask.SEQUENCE_BLOCK_MASKS`): a ValueError says so.
    """
    if _mods_under_compile(score_mod, mask_mod, sinks, block_mask):
        if block_mask is None and out is None and seqused_k is None and page_table is None:
            check_forward(RAGGED, q, k, v, softmax_scale=softmax_scale, causal=causal,
                          backend=backend, window_size=window_size, softcap=softcap,
                          cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                          max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
            got = _graph_mods().attend(q, k, v, score_mod, mask_mod, sinks, causal,
                                       softmax_scale, window_size, softcap, True, backend,
                                       deterministic, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                       max_seqlen_k)
            if got is not None:
                return got if return_lse else got[0]
        return _eager(forward_varlen)(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
            softmax_scale, window_size, softcap, return_lse, out, backend, seqused_k=seqused_k,
            page_table=page_table, deterministic=deterministic, score_mod=score_mod,
            mask_mod=mask_mod, sinks=sinks, block_mask=block_mask)
    if deterministic is not None:
        as_bool("deterministic", deterministic)
    call = check_forward(RAGGED, q, k, v, out=out, softmax_scale=softmax_scale, causal=causal,
                         return_lse=return_lse, backend=backend, window_size=window_size,
                         softcap=softcap, seqused_k=seqused_k, page_table=page_table,
                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    mods = trace_mods(score_mod, mask_mod, q, softcap, sinks, call.heads_q, block_mask, call)
    call = with_mods(call, mods)
    return _attend(call, q, k, v, out, deterministic, (causal, window_size, softcap, True),
                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
                   page_table=page_table, mods=mods)


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
    call = check_merge(o_parts, lse_parts)
    return run_merge(plan(call, device(call.device_index)), call.device_index, o_parts,
                     lse_parts)
