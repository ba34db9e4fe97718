"""`plan(call, device)`: the one place that decides which kernels a call runs.

For a forward call: the kernel key (prefill or decode, `tuning`'s tables), the split-KV count and
the merge; for a backward call: its three kernels; for a merge: the merge kernel. Everything a
call's route depends on is in its `runtime.call` record and the device's facts, so plans are
cached by those and a warm call costs dict lookups. `forward`, `backward`, decode, `precompile`
and the benchmarks' A/B variants all plan through here; `tiles_of` and `overriding` are the two
ways to ask for another plan than the tables' (another arch's tables; other key fields).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import NamedTuple

import torch

from ..arch import Arch
from ..compile.cache import get_kernel
from ..compile.keys import KernelKey, MergeKey
from ..compile.registry import used_arguments
from ..tuning import (DECODE_MAX_SEQLEN_Q, PREFILL_ONLY, decode_ctas_per_sm, decode_fused_merge,
                      decode_key, decode_rows_class, is_small_grid, kernel_key,
                      mods_tile, num_splits_heuristic, sm90_long, sm90_pack_gqa,
                      sm90_persistent)
from .. import tuning_bwd
from ..tuning_bwd import bwd_head_splits, bwd_keys
from .call import RAGGED, AttentionCall, BackwardCall, MergeCall, ScoreFeatures
from .device import Device

DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


class ForwardPlan(NamedTuple):
    """key: the kernel that runs (with splits: the split kernel, writing float32 partials);
    kernel: its compiled function (None when planned with compile=False); used: which of its
    backend's arguments it takes (`compile.registry.used_arguments`); num_splits: 1 for an
    unsplit call, else the merge's key and compiled function (None where the split kernel
    merges its partials itself, `Sm80Key.fused_merge`)."""

    key: KernelKey
    kernel: object
    used: tuple
    num_splits: int = 1
    merge_key: MergeKey | None = None
    merge: object = None

    def kernel_keys(self) -> tuple:
        return (self.key,) if self.merge_key is None else (self.key, self.merge_key)


class BackwardPlan(NamedTuple):
    """The preprocess, main and postprocess kernels (keys, compiled functions, arguments
    taken; with head_splits > 1 the dK/dV postprocess fourth) and the main kernel's tile,
    which sizes the float32 sums."""

    keys: tuple
    kernels: tuple
    used: tuple
    tile: object
    head_splits: int = 1

    def kernel_keys(self) -> tuple:
        return self.keys


class MergePlan(NamedTuple):
    key: MergeKey
    kernel: object

    def kernel_keys(self) -> tuple:
        return (self.key,)


class Overrides(NamedTuple):
    """tile_arch: the arch whose tables choose tiles, stages and backends (None: the
    device's); changes: key fields replaced in every forward kernel key planned;
    backward_changes: in every backward main kernel key planned; head_splits: the rule that
    splits the wgmma backward's K/V groups (`splitting_heads`; None: `bwd_head_splits`)."""

    tile_arch: str | None = None
    changes: tuple = ()
    backward_changes: tuple = ()
    head_splits: object = None


_OVERRIDES = [Overrides()]


@contextlib.contextmanager
def _overridden(**fields):
    """Within the block, `_OVERRIDES` has these fields replaced; it yields the new overrides."""
    previous = _OVERRIDES[0]
    _OVERRIDES[0] = previous._replace(**fields)
    try:
        yield _OVERRIDES[0]
    finally:
        _OVERRIDES[0] = previous


@contextlib.contextmanager
def tiles_of(arch: str | None):
    """Within the block, calls choose tiles, stages and backends from `arch`'s tables (e.g.
    'sm_120a', 'sm_86') instead of the GPU's own: the way to run, on the GPU at hand, what a GPU
    of that arch runs (compiled for the GPU at hand). None: the GPU's own tables."""
    with _overridden(tile_arch=None if arch is None else Arch.parse(arch).name) as over:
        yield over.tile_arch


@contextlib.contextmanager
def overriding(**changes):
    """Within the block, every forward kernel key planned has these fields replaced (e.g.
    `tile=TileConfig(...)`, `lpt=False`, `lazy_rescale=False`): the benchmarks' A/B variants,
    run through the public API. A field the planned key does not have raises a TypeError at the
    call."""
    with _overridden(changes=tuple(sorted(changes.items()))):
        yield


@contextlib.contextmanager
def overriding_backward(**changes):
    """As `overriding`, for the backward: every backward main kernel key planned within the
    block has these fields replaced (e.g. `persistent=132`); its postprocess keys follow the
    main key's tile."""
    with _overridden(backward_changes=tuple(sorted(changes.items()))):
        yield


@contextlib.contextmanager
def splitting_heads(rule):
    """As `overriding_backward`, for the count of CTAs the wgmma backward splits each K/V
    group's query heads over: within the block it is rule(key_blocks, heads_kv, group, batch,
    num_sms, causal), `tuning_bwd.bwd_head_splits`' arguments, where the call leaves it to
    the plan (the benchmarks' A/Bs of that rule)."""
    with _overridden(head_splits=rule):
        yield


def tile_arch() -> str | None:
    """The arch `tiles_of` forces now, or None."""
    return _OVERRIDES[0].tile_arch


# one cache per kind of plan, each by the call's route
_FORWARD: dict = {}  # prefill -> ForwardPlan
_DECODE: dict = {}  # decode -> (base key, CTAs per SM, {(num_splits, one launch): ForwardPlan})
_BACKWARD_MAIN: dict = {}  # -> the unsplit main kernel's key (which decides the split)
_BACKWARD: dict = {}  # route + (head splits,) -> BackwardPlan
_MERGE: dict = {}  # -> MergePlan


def clear_plans() -> None:
    """Forget every plan made (the next calls plan again; compiled kernels stay cached)."""
    for cache in (_FORWARD, _DECODE, _BACKWARD_MAIN, _BACKWARD, _MERGE):
        cache.clear()


def plan(call, device: Device, *, compile: bool = True):
    """The kernels `call` (an `AttentionCall`, `BackwardCall` or `MergeCall`) runs on
    `device`. compile=False plans without compiling (the plan's kernels are then None), for
    listing what a call would run."""
    kind = type(call)
    if kind is AttentionCall:
        return _forward(call, device, compile)
    if kind is BackwardCall:
        return _backward(call, device, compile)
    if kind is MergeCall:
        return _merge(call, device, compile)
    raise TypeError(f"plan takes an AttentionCall, BackwardCall or MergeCall, "
                    f"got {kind.__name__}")


def is_decode(call: AttentionCall) -> bool:
    """Whether a forward call runs on the cp.async kernel's decode path: a KV cache, split-KV,
    or (dense, on a backend that has decode) at most DECODE_MAX_SEQLEN_Q queries."""
    return bool(call.page_size or call.seqused_k or (call.num_splits or 1) > 1
                or (call.layout != RAGGED and call.seqlen_q <= DECODE_MAX_SEQLEN_Q
                    and call.backend not in PREFILL_ONLY and not call.features.block_sparse))


def _compiled(key, compile: bool):
    return get_kernel(key) if compile else None


def _changed(key, changes: tuple):
    if not changes:
        return key
    fields = {f.name for f in dataclasses.fields(key)}
    unknown = [name for name, _ in changes if name not in fields]
    if unknown:
        raise TypeError(f"overriding({', '.join(unknown)}=...): a {type(key).__name__} has no "
                        f"such field")
    return dataclasses.replace(key, **dict(changes))


def _with_mods(key, f: ScoreFeatures):
    """`key` running the call's traced mods and sinks: sinks alone on the tile planned for the
    call without them, mods and block masks on `tuning.mods_tile`'s (a GQA packing the new
    tile's rows cannot hold dropped)."""
    if f.score_mod is None and f.mask_mod is None and not f.sinks and not f.block_sparse:
        return key
    changes = dict(score_mod=f.score_mod, mask_mod=f.mask_mod, sinks=f.sinks,
                   block_sparse=bool(f.block_sparse))
    if f.score_mod is not None or f.mask_mod is not None or f.block_sparse:
        changes["tile"] = mods_tile(key, f.block_sparse)
        if changes["tile"].block_m % getattr(key, "pack_gqa", 1):
            changes["pack_gqa"] = 1
    if f.block_sparse and hasattr(key, "page_prefetch"):
        # a decode key: the pages of listed blocks looked up as each is loaded; a GQA group's
        # heads packed into one tile only where they share the mask's lists (one head)
        changes.update(page_prefetch=False)
        if f.block_sparse[2] != 1:
            changes.update(pack_gqa=1)
    return dataclasses.replace(key, **changes)


def _forward(call: AttentionCall, device: Device, compile: bool) -> ForwardPlan:
    if is_decode(call):
        return _decode(call, device, compile)
    over = _OVERRIDES[0]
    f = call.features
    # what the route depends on besides the call's class: whether a causal grid fills the SMs
    # once, whether the wgmma kernel takes its long calls' tile (tuning.sm90_long)
    small = f.causal and call.layout != RAGGED and is_small_grid(
        call.seqlen_q, call.heads_q, call.batch, device.num_sms)
    long = sm90_long(call.head_dim, f.causal, call.seqlen_q)
    # whether a wgmma kernel of this call runs persistent, on one CTA per SM
    persist = call.layout != RAGGED and sm90_persistent(call.head_dim, f.causal, call.seqlen_q,
                                                        call.heads_q, call.batch, device.num_sms)
    # how many query heads of a K/V group a (not persistent) dense wgmma tile packs
    pack = 1 if persist or call.layout == RAGGED else sm90_pack_gqa(
        call.head_dim, f.causal, call.seqlen_q, call.heads_q, call.heads_kv)
    backend = call.backend
    if f.block_sparse:  # one CTA per tile, one query head per tile: its own block lists
        small, persist, pack = False, False, 1
        if backend == "auto":
            backend = "sm90" if Arch.of_name(device.arch).major == 9 else "sm80"
    route = (device.index, device.arch, call.dtype, call.head_dim, f.causal, f.local,
             f.softcap > 0, f.score_mod, f.mask_mod, f.sinks, f.block_sparse, call.layout,
             backend, small, long, persist, pack, over, compile)
    found = _FORWARD.get(route)
    if found is None:
        key = kernel_key(device.arch, DTYPE_NAMES[call.dtype], call.head_dim, f.causal,
                         backend, tile_arch=over.tile_arch, local=f.local,
                         softcap=f.softcap > 0, varlen=call.layout == RAGGED, small_grid=small,
                         seqlen_q=call.seqlen_q, persistent_sms=device.num_sms if persist else 0,
                         pack_gqa=pack)
        key = _changed(_with_mods(key, f), over.changes)
        found = _FORWARD[route] = ForwardPlan(key, _compiled(key, compile), used_arguments(key))
    pack = getattr(found.key, "pack_gqa", 1)
    if pack > 1 and pack * call.heads_kv != call.heads_q:
        raise ValueError(f"pack_gqa={pack} packs a whole GQA group: it must be heads_q / "
                         f"heads_kv = {call.heads_q // call.heads_kv} for this call")
    return found


def _decode(call: AttentionCall, device: Device, compile: bool) -> ForwardPlan:
    over = _OVERRIDES[0]
    f = call.features
    group = call.heads_q // call.heads_kv
    ragged_q = call.layout == RAGGED
    # what decode_key reads of seqlen_q: whether the call is short, and which decode tile its
    # packed rows take
    route = (device.index, device.arch, call.dtype, call.head_dim, f.causal, f.local,
             f.softcap > 0, f.score_mod, f.mask_mod, f.sinks, f.block_sparse, ragged_q,
             call.ragged_k, call.seqlen_q <= DECODE_MAX_SEQLEN_Q,
             decode_rows_class(call.head_dim, call.seqlen_q * group), group, call.page_size,
             call.seqused_k, over, compile)
    held = _DECODE.get(route)
    if held is None:
        key = decode_key(device.arch, DTYPE_NAMES[call.dtype], call.head_dim, f.causal,
                         seqlen_q=call.seqlen_q, group=group, page_size=call.page_size,
                         seqused_k=call.seqused_k, split_kv=False, tile_arch=over.tile_arch,
                         local=f.local, softcap=f.softcap > 0, varlen_q=ragged_q,
                         varlen_k=call.ragged_k)
        key = _changed(_with_mods(key, f), over.changes)
        held = _DECODE[route] = (key, decode_ctas_per_sm(key, over.tile_arch or device.arch), {})
    base, ctas_per_sm, plans = held
    tiles, key_blocks = unsplit_grid(call, base)
    num_splits = call.num_splits
    if num_splits is None:
        # a block mask's lists are walked whole by one CTA (`api.mods` refuses num_splits > 1)
        num_splits = 1 if call.seqlen_q > DECODE_MAX_SEQLEN_Q or ragged_q \
            or f.block_sparse else \
            num_splits_heuristic(tiles, key_blocks, device.num_sms, ctas_per_sm)
    fused = num_splits > 1 and not ragged_q and decode_fused_merge(
        base, min(call.seqlen_q * base.pack_gqa, base.tile.block_m), tiles, device.num_sms)
    found = plans.get((num_splits, fused))
    if found is None:
        if num_splits == 1:
            found = ForwardPlan(base, _compiled(base, compile), used_arguments(base))
        else:
            key = dataclasses.replace(base, split_kv=True, lpt=False, fused_merge=fused)
            merge = None if fused else MergeKey(device.arch, call.head_dim, "float32",
                                                DTYPE_NAMES[call.dtype])
            found = ForwardPlan(key, _compiled(key, compile), used_arguments(key), num_splits,
                                merge, None if fused else _compiled(merge, compile))
        plans[(num_splits, fused)] = found
    return found


def unsplit_grid(call: AttentionCall, key) -> tuple:
    """(CTAs of the decode call on `key`'s tile unsplit: its query blocks, one counter each in
    a one-launch split, key blocks its queries see: a window's keys, where it has one), what
    `tuning.num_splits_heuristic` and `tuning.decode_fused_merge` weigh."""
    cfg = key.tile
    m_blocks = -(-call.seqlen_q * key.pack_gqa // cfg.block_m)
    heads = call.heads_kv if key.pack_gqa > 1 else call.heads_q
    keys = call.seqlen_k
    if call.features.local:
        f = call.features
        keys = min(keys, f.window_left + call.seqlen_q + f.window_right)
    return m_blocks * heads * call.batch, -(-keys // cfg.block_n)


def _backward(call: BackwardCall, device: Device, compile: bool) -> BackwardPlan:
    """The plan of the call's features and head_splits: 1, or where the main kernel is the
    wgmma one and a K/V group has several query heads, the call's or `tuning_bwd.bwd_head_splits`'
    for its grid. The unsplit main key decides that, and is made without compiling: a call
    that splits never compiles the unsplit kernel."""
    over = _OVERRIDES[0]
    f = call.features
    route = (device.index, device.arch, call.dtype, call.head_dim, f.causal, f.local,
             f.softcap > 0, f.score_mod, f.mask_mod, f.block_sparse, call.layout,
             call.deterministic, call.backend, call.capture_grads, over, compile,
             tuning_bwd.SM90_MODS)
    main = _BACKWARD_MAIN.get(route)
    if main is None:
        main = _BACKWARD_MAIN[route] = _backward_keys(call, device, 1)[1]
    splits = 1
    if call.heads_q != call.heads_kv and main.backend == "bwd_sm90":
        splits = call.head_splits or (over.head_splits or bwd_head_splits)(
            -(-call.seqlen_k // main.tile.block_n), call.heads_kv,
            call.heads_q // call.heads_kv, call.batch, device.num_sms, f.causal)
    split_route = route + (splits,)
    found = _BACKWARD.get(split_route)
    if found is None:
        found = _BACKWARD[split_route] = _backward_plan(call, device, compile, splits)
    return found


def _backward_keys(call: BackwardCall, device: Device, head_splits: int) -> tuple:
    """The backward's keys; with mods the main kernel runs them: where the call leaves the
    choice to the plan, the mma.sync one unless `tuning_bwd.SM90_MODS` lets `bwd_backend`
    choose."""
    f = call.features
    over = _OVERRIDES[0]
    mods = f.score_mod is not None or f.mask_mod is not None
    backend = "sm80" if mods and call.backend == "auto" and not tuning_bwd.SM90_MODS \
        else call.backend
    keys = bwd_keys(device.arch, DTYPE_NAMES[call.dtype], call.head_dim, f.causal,
                    local=f.local, softcap=f.softcap > 0, varlen=call.layout == RAGGED,
                    deterministic=call.deterministic, tile_arch=over.tile_arch,
                    backend=backend, head_splits=head_splits,
                    capture_grads=bool(call.capture_grads))
    if mods:
        extra = {"capture_grads": call.capture_grads} if call.capture_grads else {}
        if f.block_sparse:  # a block mask's query tile lists (`BlockMask.query_tiles`)
            extra["block_sparse"] = True
        keys = (keys[0], dataclasses.replace(keys[1], score_mod=f.score_mod, mask_mod=f.mask_mod,
                                             **extra)) + keys[2:]
    if not over.backward_changes:
        return keys
    main = _changed(keys[1], over.backward_changes)
    return (keys[0], main) + tuple(dataclasses.replace(k, tile=main.tile) for k in keys[2:])


def _backward_plan(call: BackwardCall, device: Device, compile: bool,
                   head_splits: int) -> BackwardPlan:
    keys = _backward_keys(call, device, head_splits)
    return BackwardPlan(keys, tuple(_compiled(k, compile) for k in keys),
                        tuple(used_arguments(k) for k in keys), keys[1].tile, head_splits)


def _merge(call: MergeCall, device: Device, compile: bool) -> MergePlan:
    route = (device.index, device.arch, call.in_dtype, call.out_dtype, call.head_dim, compile)
    found = _MERGE.get(route)
    if found is None:
        key = MergeKey(device.arch, call.head_dim, DTYPE_NAMES[call.in_dtype],
                       DTYPE_NAMES[call.out_dtype])
        found = _MERGE[route] = MergePlan(key, _compiled(key, compile))
    return found
