"""Running a plan: the outputs and scratch buffers a call's kernels need, and their launches.
The tensors arrive checked (`cute_fa.api`); nothing here raises on a caller's input."""

from __future__ import annotations

import math

import torch

from ..layouts.config import dq_accum_blocks
from .call import RAGGED, AttentionCall, BackwardCall
from .device import launch, no_lse, split_counters, tile_counter
from .launch import (BwdArgs, BwdKvPostArgs, BwdPostArgs, BwdPrepArgs, ForwardArgs, MergeArgs,
                     Sm90Args, for_kernel)
from .plan import BackwardPlan, ForwardPlan, MergePlan, unsplit_grid


def kernel_ready(t: torch.Tensor) -> torch.Tensor:
    """`t` (3-D or 4-D) itself where its strides suit the kernels (last stride 1, the others
    multiples of 8 elements, 16-byte aligned), else a dense copy: what HF transformers' views
    and autograd's expanded gradients need. The kernels check the strides of size-1
    dimensions too, which `.contiguous()` leaves as they are, hence the clone."""
    s0, s1, s2, s3 = t.stride() if t.dim() == 4 else (0,) + t.stride()
    if s3 == 1 and not (s0 % 8 or s1 % 8 or s2 % 8 or t.data_ptr() % 16):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _plain(t):
    """`t` as DLPack takes it: a tensor that requires grad is refused, its detached view is not."""
    return t.detach() if t.requires_grad else t


def score_tensors(captures: tuple, sinks=None) -> tuple | None:
    """The tensors a call's scores read, as its kernel takes them (`compile.fake`'s
    "score_tensors"): its mods' captured tensors, each detached, a 0-d one as one element, a
    bool one as its bytes; then the sink logits (checked), as float32; None where there are
    none."""
    tensors = tuple(_plain(t).reshape(1) if t.dim() == 0 else _plain(t) for t in captures)
    tensors = tuple(t.view(torch.uint8) if t.dtype == torch.bool else t for t in tensors)
    if sinks is not None:
        tensors += (_plain(sinks).to(torch.float32).contiguous(),)
    return tensors or None


def run_forward(call: AttentionCall, plan: ForwardPlan, q, k, v, out=None, *, cu_seqlens_q=None,
                cu_seqlens_k=None, seqused_k=None, page_table=None,
                return_lse: bool | None = None, score_tensors: tuple | None = None,
                block_mask=None) -> tuple:
    """(out, lse): lse None unless call.return_lse (or return_lse, where given: autograd keeps
    it for the backward). Dense: q, out (batch, seqlen_q, heads_q, head_dim); ragged:
    (total_q, heads_q, head_dim), lse (heads_q, total_q); k and v a paged cache (pages,
    page_size, heads_kv, head_dim) where a page_table is given. score_tensors: the tensors
    the call's scores read (`score_tensors`); block_mask: a block-sparse call's
    (`cute_fa.mods.block_mask.BlockMask`), whose lists at the planned kernel's tile join
    them."""
    if out is None:
        out = torch.empty_like(q)  # q's memory order where q is dense, else contiguous
    if return_lse is None:
        return_lse = call.return_lse
    ragged = call.layout == RAGGED
    lse = None
    if return_lse:
        shape = (call.heads_q, q.shape[0]) if ragged else (call.batch, call.heads_q, call.seqlen_q)
        lse = torch.empty(shape, device=q.device, dtype=torch.float32)
    if ragged:
        if not (q.shape[0] and call.seqlen_q):  # no query rows: nothing to launch
            if lse is not None:
                lse.fill_(-math.inf)
            return out, lse
        q, out4 = q[None], out[None]
        if not call.page_size:
            k, v = k[None], v[None]
        lse4 = lse[None] if lse is not None else no_lse(call.device_index)
    else:
        out4, lse4 = out, (lse if lse is not None else no_lse(call.device_index))
    q, k, v = _plain(q), _plain(k), _plain(v)
    f = call.features
    if f.block_sparse:
        tile = plan.key.tile
        # a tile packing a GQA group's heads holds block_m / group queries of each
        queries = tile.block_m // getattr(plan.key, "pack_gqa", 1)
        counts, indices = block_mask.kernel_blocks(queries, tile.block_n, call.batch,
                                                   call.heads_q)
        if ragged or call.seqused_k or call.page_size:
            # each entry's query tiles visit its own keys (the mask may be made longer)
            from ..mods.block_mask import per_sequence, sequence_tiles

            counts = per_sequence(counts, indices, sequence_tiles(cu_seqlens_q, queries),
                                  sequence_tiles(cu_seqlens_k, tile.block_n, seqused_k,
                                                 call.seqlen_k))
        score_tensors = (score_tensors or ()) + (counts, indices)
    order = None
    if plan.key.varlen_order:  # the ragged batch's tiles, most work first
        from .ragged_order import ragged_order

        tile = plan.key.tile
        order = ragged_order(cu_seqlens_q, cu_seqlens_k, seqused_k, call.seqlen_k,
                             call.seqlen_q, tile.block_m, tile.block_n, f.causal)
    if plan.num_splits == 1:
        args = ForwardArgs(q, k, v, out4, lse4, call.softmax_scale, call.causal_offset,
                           int(return_lse), f.window_left, f.window_right, f.softcap,
                           cu_seqlens_q, cu_seqlens_k, call.seqlen_q, score_tensors, order,
                           seqused_k=seqused_k, page_table=page_table)
        if plan.key.backend == "sm90":
            args = Sm90Args(*args[:16], tile_counter=tile_counter(call.device_index)
                            if plan.key.dynamic_tiles else None)
        launch(call.device_index, plan.kernel, for_kernel(args, plan.used))
        return out, lse
    # split-KV: float32 partials per split, then the merge writes out (and lse); one allocation
    # for both (a decode step is host-bound: each allocation is µs)
    splits, batch, seqlen_q, heads, head_dim = plan.num_splits, *q.shape
    rows = splits * batch * seqlen_q * heads
    parts = torch.empty(rows * (head_dim + 1), device=q.device, dtype=torch.float32)
    o_parts = parts[:rows * head_dim].view(splits, batch, seqlen_q, heads, head_dim)
    lse_parts = parts[rows * head_dim:].view(splits, batch, heads, seqlen_q)
    args = ForwardArgs(q, k, v, o_parts.view(splits * batch, seqlen_q, heads, head_dim),
                       lse_parts.view(splits * batch, heads, seqlen_q), call.softmax_scale,
                       call.causal_offset, 1, f.window_left, f.window_right, f.softcap,
                       cu_seqlens_q, cu_seqlens_k, call.seqlen_q, score_tensors,
                       seqused_k=seqused_k, page_table=page_table, num_splits=splits)
    if plan.key.fused_merge:  # one launch: each query block's last CTA merges (a counter each)
        blocks = unsplit_grid(call, plan.key)[0]
        args = args._replace(merged_out=out4, merged_lse=lse4, write_merged_lse=int(return_lse),
                             split_counters=split_counters(call.device_index, blocks))
        launch(call.device_index, plan.kernel, for_kernel(args, plan.used))
        return out, lse
    launch(call.device_index, plan.kernel, for_kernel(args, plan.used))
    launch(call.device_index, plan.merge,
           MergeArgs(o_parts, lse_parts, out4, lse4, int(return_lse)))
    return out, lse


def run_merge(plan: MergePlan, device_index: int, o_parts, lse_parts) -> tuple:
    """(o, lse) of `merge_attention`."""
    parts, batch, seqlen, heads, head_dim = o_parts.shape
    out = torch.empty((batch, seqlen, heads, head_dim), device=o_parts.device,
                      dtype=o_parts.dtype)
    lse = torch.empty((batch, heads, seqlen), device=o_parts.device, dtype=torch.float32)
    launch(device_index, plan.kernel, MergeArgs(_plain(o_parts), _plain(lse_parts), out, lse, 1))
    return out, lse


def run_backward(call: BackwardCall, plan: BackwardPlan, dout, q, k, v, out, lse, dq=None,
                 dk=None, dv=None, *, cu_seqlens_q=None, cu_seqlens_k=None,
                 score_tensors: tuple | None = None) -> tuple:
    """(dq, dk, dv). Dense: (batch, seqlen, heads, head_dim) tensors, lse (batch, heads_q,
    seqlen_q); ragged: (total, heads, head_dim), lse (heads_q, total_q), and rows outside
    every sequence get zero gradients (the kernels never write them). score_tensors: the
    mods' captured tensors (`score_tensors`) where the call has mods."""
    ragged = call.layout == RAGGED
    if ragged:
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        if not (q.shape[0] and call.max_seqlen_q and call.max_seqlen_k):
            return dq, dk, dv
        views = [t[None] for t in (dout, q, k, v, out, lse, dq, dk, dv)]
    else:
        dq = torch.empty_like(q) if dq is None else dq
        dk = torch.empty_like(k) if dk is None else dk
        dv = torch.empty_like(v) if dv is None else dv
        views = [dout, q, k, v, out, lse, dq, dk, dv]
    dout4, q4, k4, v4, out4, lse3, dq4, dk4, dv4 = (_plain(t) for t in views)
    tile = plan.tile
    batch, seqlen_q, heads_q, _ = q4.shape
    device = q4.device
    entries = cu_seqlens_q.shape[0] - 1 if ragged else 0
    rows = torch.empty((2, batch, heads_q, seqlen_q), device=device, dtype=torch.float32)
    lse_log2, dpsum = rows[0], rows[1]
    blocks = dq_accum_blocks(seqlen_q, tile.block_m, seqlen_q if entries else 0, entries)
    dq_accum = torch.zeros((batch, heads_q, blocks * tile.block_m * tile.head_dim_padded),
                           device=device, dtype=torch.float32)
    semaphore = None
    if call.deterministic:
        semaphore = torch.zeros((entries or batch, heads_q, dq_accum_blocks(
            call.max_seqlen_q if entries else seqlen_q, tile.block_m)), device=device,
            dtype=torch.int32)
    kv_accum, kv_semaphore = (None, None), None
    if plan.head_splits > 1:  # several CTAs per key block: dK and dV summed in float32
        _, seqlen_k, heads_kv, _ = k4.shape
        kv_blocks = dq_accum_blocks(seqlen_k, tile.block_n, seqlen_k if entries else 0, entries)
        kv_accum = torch.zeros((2, batch, heads_kv, kv_blocks * tile.block_n
                                * tile.head_dim_padded), device=device, dtype=torch.float32)
        if call.deterministic:  # the order of those sums: a counter per key block
            kv_semaphore = torch.zeros((entries or batch, heads_kv, dq_accum_blocks(
                call.max_seqlen_k if entries else seqlen_k, tile.block_n)), device=device,
                dtype=torch.int32)
    f = call.features
    pre, main, post = plan.kernels[:3]
    used_main, used_post = plan.used[1:3]
    launch(call.device_index, pre, BwdPrepArgs(out4, dout4, lse3, lse_log2, dpsum))
    launch(call.device_index, main, for_kernel(BwdArgs(
        q4, k4, v4, dout4, lse_log2, dpsum, dq_accum, dk4, dv4, call.softmax_scale,
        call.causal_offset, f.window_left, f.window_right, f.softcap, cu_seqlens_q,
        cu_seqlens_k, call.max_seqlen_k, semaphore, score_tensors, kv_accum[0], kv_accum[1],
        plan.head_splits, kv_semaphore), used_main))
    launch(call.device_index, post, for_kernel(BwdPostArgs(
        dq_accum, dq4, call.softmax_scale, cu_seqlens_q, call.max_seqlen_q), used_post))
    if plan.head_splits > 1:
        launch(call.device_index, plan.kernels[3], for_kernel(BwdKvPostArgs(
            kv_accum[0], kv_accum[1], dk4, dv4, cu_seqlens_k, call.max_seqlen_k),
            plan.used[3]))
    return dq, dk, dv
