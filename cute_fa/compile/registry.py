"""Every kernel cute_fa can compile, one record each: adding a kernel is adding its module under
cute_fa/kernels/ and one `Backend` here.

A backend names its kernel class, the key type that says everything one compiled kernel of it
depends on (`compile.keys`), the archs it runs on and its arguments, in order. An argument is
either always taken, or switched on by fields of the key (`Argument.when`): a kernel whose key
does not ask for it is compiled with None there (`compile.fake`) and launched with None there
(`runtime.launch`), so no compiled kernel takes an argument it ignores. Importing this module
needs neither torch nor the DSL.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

from ..arch import Arch
from .keys import (BwdKey, BwdKvPostKey, BwdPostKey, BwdPrepKey, BwdSm90Key, KernelKey, MergeKey,
                   Sm80Key, Sm90Key, TmaKey)


@dataclass(frozen=True)
class Argument:
    """One argument of a kernel family: its name, its kind (what `compile.fake` builds for it)
    and the key fields that switch it on (any of them truthy; () for always)."""

    name: str
    kind: str
    when: tuple = ()

    def used_by(self, key) -> bool:
        return not self.when or any(getattr(key, field) for field in self.when)


def _args(*specs) -> tuple:
    return tuple(Argument(*spec) for spec in specs)


# Kinds: "qkvo": a (batch, seqlen, heads, head_dim) tensor with dynamic extents, 16-byte aligned
# strides and a unit last stride (a paged K/V cache: (pages, page_size, heads, head_dim); a
# ragged batch: (1, total, heads, head_dim)); "out": the same in the input dtype, or float32 for
# split-KV partials; "lse": float32 (batch, heads, seqlen), ragged (1, heads, total); then
# scalars. The window's sides come with a sliding window (`local`), the softcap with a softcap,
# the ragged batch's cu_seqlens int32 (batch + 1,) and longest query with a ragged batch, the
# tensors a key's scores read ("score_tensors": a tuple of its mods' captured tensors, any
# strides, then the float32 sink logits (heads_q,), then a block mask's int32 counts (batch,
# heads, query blocks) and indices (..., key blocks), `KernelKey.has_score_tensors`), a ragged
# Q's tile order int32 (entries x query blocks,) with varlen_order (`runtime.ragged_order`),
# and the cp.async kernel's decode arguments (seqused_k int32 (batch,), page_table int32
# (batch, pages per sequence), the split count; with fused_merge the call's own O and LSE,
# whether to write that LSE, and int32 counters, one per query block) with their key fields.
# The launch adds the stream.
_FORWARD = (("q", "qkvo"), ("k", "qkvo"), ("v", "qkvo"), ("out", "out"), ("lse", "lse"),
            ("softmax_scale", "float32"), ("causal_offset", "int32", ("causal", "local")),
            ("write_lse", "int32"),
            ("window_left", "int32", ("local",)), ("window_right", "int32", ("local",)),
            ("softcap", "float32", ("softcap",)),
            ("cu_seqlens_q", "int32_vector", ("varlen_q",)),
            ("cu_seqlens_k", "int32_vector", ("varlen_k",)),
            ("max_seqlen_q", "int32", ("varlen_q",)),
            ("score_tensors", "score_tensors", ("has_score_tensors",)),
            ("tile_order", "int32_vector", ("varlen_order",)))
FORWARD_ARGUMENTS = _args(*_FORWARD)
# the wgmma kernel's, then a persistent grid's shared tile counter (int32 (1,)) where its
# CTAs take tiles as they finish (`Sm90Key.dynamic_tiles`)
SM90_ARGUMENTS = _args(*_FORWARD, ("tile_counter", "int32_vector", ("dynamic_tiles",)))
DECODE_ARGUMENTS = _args(*_FORWARD, ("seqused_k", "int32_vector", ("seqused_k",)),
                         ("page_table", "int32_matrix", ("page_size",)),
                         ("num_splits", "int32", ("split_kv",)),
                         ("merged_out", "qkvo", ("fused_merge",)),
                         ("merged_lse", "lse", ("fused_merge",)),
                         ("write_merged_lse", "int32", ("fused_merge",)),
                         ("split_counters", "int32_vector", ("fused_merge",)))

# the merge: O parts (parts, batch, seqlen, heads, head_dim), LSE parts float32 (parts, batch,
# heads, seqlen), the merged O (batch, seqlen, heads, head_dim) and LSE, write_lse
MERGE_ARGUMENTS = _args(("o_parts", "o_parts"), ("lse_parts", "lse_parts"), ("out", "out"),
                        ("lse", "lse"), ("write_lse", "int32"))

# the backward's kernels: q, k, v, dout and dk, dv as "qkvo"; the forward's lse in log2 units
# and D = rowsum(dout * out) float32 (batch, heads, seqlen) ("lse"); dq_accum float32 (batch,
# heads, blocks * block_m * head_dim_padded) ("accum3", `layouts.bwd.dq_accum_chunk`); the
# forward's scalars; cu_seqlens and the longest key sequence of a ragged batch; the
# deterministic mode's counters int32 (batch, heads, query blocks); the mods' captured tensors
BWD_ARGUMENTS = _args(
    ("q", "qkvo"), ("k", "qkvo"), ("v", "qkvo"), ("dout", "qkvo"), ("lse_log2", "lse"),
    ("dpsum", "lse"), ("dq_accum", "accum3"), ("dk", "qkvo"), ("dv", "qkvo"),
    ("softmax_scale", "float32"), ("causal_offset", "int32", ("causal", "local")),
    ("window_left", "int32", ("local",)), ("window_right", "int32", ("local",)),
    ("softcap", "float32", ("softcap",)), ("cu_seqlens_q", "int32_vector", ("varlen_q",)),
    ("cu_seqlens_k", "int32_vector", ("varlen_k",)), ("max_seqlen_k", "int32", ("varlen_k",)),
    ("semaphore", "int32_tensor3", ("deterministic",)),
    ("score_tensors", "score_tensors", ("has_score_tensors",)))
# the wgmma backward's, then dK's and dV's float32 sums (batch, heads_kv, blocks * block_n *
# head_dim_padded) and the CTAs a K/V group's query heads are split over, under kv_accum, and
# deterministic's counters of those sums int32 (batch, heads_kv, key blocks)
BWD_SM90_ARGUMENTS = BWD_ARGUMENTS + _args(
    ("dk_accum", "accum3", ("kv_accum",)), ("dv_accum", "accum3", ("kv_accum",)),
    ("head_splits", "int32", ("kv_accum",)),
    ("kv_semaphore", "int32_tensor3", ("ordered_kv_sums",)))
BWD_PREP_ARGUMENTS = _args(("out", "qkvo"), ("dout", "qkvo"), ("lse", "lse"),
                           ("lse_log2", "lse"), ("dpsum", "lse"))
BWD_POST_ARGUMENTS = _args(("dq_accum", "accum3"), ("dq", "qkvo"), ("softmax_scale", "float32"),
                           ("cu_seqlens_q", "int32_vector", ("varlen",)),
                           ("max_seqlen_q", "int32", ("varlen",)))
BWD_POST_KV_ARGUMENTS = _args(("dk_accum", "accum3"), ("dv_accum", "accum3"), ("dk", "qkvo"),
                              ("dv", "qkvo"), ("cu_seqlens_k", "int32_vector", ("varlen",)),
                              ("max_seqlen_k", "int32", ("varlen",)))


@dataclass(frozen=True)
class Backend:
    name: str
    summary: str
    module: str  # under cute_fa.kernels, dotted ("fwd.sm80")
    class_name: str
    key_type: type
    min_major: int  # the oldest GPU generation it runs on
    arguments: tuple  # its `Argument`s, in order
    max_major: int = 99  # the newest (wgmma exists on sm90 only)

    def supports(self, arch: str | Arch) -> bool:
        arch = arch if isinstance(arch, Arch) else Arch.of_name(arch)
        return self.min_major <= arch.major <= self.max_major

    def kernel_class(self):
        return getattr(importlib.import_module(f"{__package__.rsplit('.', 1)[0]}.kernels."
                                               f"{self.module}"), self.class_name)

    def build(self, key: KernelKey):
        """The kernel object `cute.compile` traces for `key`."""
        if type(key) is not self.key_type:
            raise TypeError(f"backend {self.name!r} takes a {self.key_type.__name__}, "
                            f"got {type(key).__name__}")
        return self.kernel_class()(key)


# the forward backends a caller may name (backend=...)
REGISTRY = {b.name: b for b in (
    Backend("sm80", "cp.async + ldmatrix + mma.sync, any GPU from sm80 on", "fwd.sm80",
            "FlashFwdSm80", Sm80Key, 8, DECODE_ARGUMENTS),
    Backend("tma", "TMA + mbarrier K/V ring + ldmatrix + mma.sync, sm90 and newer", "fwd.tma",
            "FlashFwdTma", TmaKey, 9, FORWARD_ARGUMENTS),
    Backend("sm90", "warp-specialized TMA producer + wgmma consumers, Hopper (sm90) only",
            "fwd.sm90", "FlashFwdSm90", Sm90Key, 9, SM90_ARGUMENTS, max_major=9),
)}

# every kernel cute_fa compiles: the forward backends, the merge and the backward's three
KERNELS = dict(
    REGISTRY,
    merge=Backend("merge", "merge of split-KV partials", "fwd.merge", "MergeAttention",
                  MergeKey, 8, MERGE_ARGUMENTS),
    bwd_sm80=Backend("bwd_sm80", "backward: cp.async + ldmatrix + mma.sync, any GPU from sm80 "
                     "on", "bwd.sm80", "FlashBwdSm80", BwdKey, 8, BWD_ARGUMENTS),
    bwd_sm90=Backend("bwd_sm90", "backward: TMA producer + wgmma consumers, Hopper (sm90) only",
                     "bwd.sm90", "FlashBwdSm90", BwdSm90Key, 9, BWD_SM90_ARGUMENTS,
                     max_major=9),
    bwd_pre=Backend("bwd_pre", "backward preprocess: D = rowsum(dO * O)", "bwd.preprocess",
                    "BwdPreprocess", BwdPrepKey, 8, BWD_PREP_ARGUMENTS),
    bwd_post=Backend("bwd_post", "backward postprocess: dQ from float32", "bwd.postprocess",
                     "BwdPostprocess", BwdPostKey, 8, BWD_POST_ARGUMENTS),
    bwd_post_kv=Backend("bwd_post_kv", "backward postprocess: dK and dV from float32",
                        "bwd.postprocess", "BwdKvPostprocess", BwdKvPostKey, 9,
                        BWD_POST_KV_ARGUMENTS, max_major=9))


def backend_of(key) -> Backend:
    return KERNELS[key.backend]


@functools.lru_cache(maxsize=None)
def used_arguments(key) -> tuple:
    """Per argument of `key`'s backend, whether the kernel compiled for `key` takes it."""
    return tuple(a.used_by(key) for a in backend_of(key).arguments)
