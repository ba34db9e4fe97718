"""The forward kernels cute_fa can compile, one record each: adding a kernel is adding its
module under cute_fa/kernels/ and one `Backend` here.

A backend names its kernel class, the key type that says everything one compiled kernel of
it depends on, and the archs it runs on. Every kernel takes the arguments `ARGUMENTS`
describes, in that order: `compiler.fake_arguments` builds fake tensors from it for
`cute.compile`, and `interface` launches with the same order.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import ClassVar

from .arch import Arch
from .layouts import TileConfig
from .layouts.config import BwdTileConfig, RowTile


@dataclass(frozen=True)
class KernelKey:
    """What one compiled forward kernel depends on. ctas_per_sm > 0 caps the registers so
    that this many CTAs fit one SM's register file (ptxas's .minnctapersm); 0 leaves the
    count to ptxas. causal: the keys have an upper edge (causal_offset, plus window_right
    where local); local: a sliding window's lower edge (window_left); softcap: scores pass
    through softcap * tanh(. / softcap); varlen_q / varlen_k: Q (and O, LSE) / K and V are
    ragged batches packed end to end, entry b's rows starting at cu_seqlens[b]; lpt: causal
    query blocks start longest first across heads (`kernels.work.SingleTileScheduler`)."""

    arch: str
    causal: bool
    tile: TileConfig
    ctas_per_sm: int = 0
    lpt: bool = False
    local: bool = False
    softcap: bool = False
    varlen_q: bool = False
    varlen_k: bool = False
    backend: ClassVar[str] = ""


@dataclass(frozen=True)
class Sm80Key(KernelKey):
    """The cp.async kernel (`kernels/fwd_sm80.py`) and its decode features: pack_gqa query heads
    per K/V head share a tile (1: no packing); split_kv writes float32 partial O and LSE per
    key split, for `merge_attention`; page_size > 0 reads K/V from a paged cache through a page
    table; seqused_k takes each batch entry's key count from a tensor. kv_stages 0: one K
    and one V buffer; >= 2: a ring of that many K/V stages loading whole rounds ahead."""

    kv_stages: int = 0
    pack_gqa: int = 1
    split_kv: bool = False
    page_size: int = 0
    seqused_k: bool = False
    backend: ClassVar[str] = "sm80"

    def __post_init__(self):
        if self.kv_stages == 1 or self.kv_stages < 0:
            raise ValueError(f"kv_stages must be 0 or at least 2, got {self.kv_stages}")
        if self.pack_gqa < 1:
            raise ValueError(f"pack_gqa must be at least 1, got {self.pack_gqa}")
        if self.lpt and (self.pack_gqa > 1 or self.split_kv):
            raise ValueError("lpt orders unpacked, unsplit query blocks only")
        if self.page_size < 0 or self.page_size % 16:
            raise ValueError(f"page_size must be 0 or a positive multiple of 16, "
                             f"got {self.page_size}")


@dataclass(frozen=True)
class TmaKey(KernelKey):
    """The TMA kernel (`kernels/fwd_tma.py`): a ring of kv_stages K/V buffers; lazy_rescale
    skips O's rescale while the row max has grown little; s_gemm_fine loads K's fragments one
    k-step ahead (else a whole tile's at once) and s_gemm_python_unrolled traces the
    S = Q K^T k-loop step by step (else the compiler unrolls it): `tuning` picks whichever
    ptxas compiles without spills."""

    kv_stages: int = 2
    lazy_rescale: bool = True
    s_gemm_fine: bool = True
    s_gemm_python_unrolled: bool = False
    backend: ClassVar[str] = "tma"


@dataclass(frozen=True)
class Sm90Key(KernelKey):
    """The warp-specialized Hopper kernel (`kernels/fwd_sm90.py`): a TMA producer warp filling
    a ring of kv_stages K/V stages, consumer warpgroups running wgmma (the tile's num_threads
    counts them; `layouts.wgmma`). intra_wg_overlap: a warpgroup issues S of round j and P V of
    round j - 1 together and runs the softmax of j under the P V; pingpong: the consumer
    warpgroups take turns issuing their wgmmas (named barriers), so one's softmax runs under
    another's GEMMs. tma_store: O leaves through shared memory by one TMA store (ragged
    batches, whose tiles may run into the next entry's rows, store row by row instead)."""

    kv_stages: int = 2
    intra_wg_overlap: bool = True
    pingpong: bool = True
    tma_store: bool = True
    backend: ClassVar[str] = "sm90"


@dataclass(frozen=True)
class Backend:
    name: str
    summary: str
    module: str  # under cute_fa.kernels
    class_name: str
    key_type: type
    min_major: int  # the oldest GPU generation it runs on
    arguments: tuple  # (name, kind) of its arguments, in order (ARGUMENTS below)
    max_major: int = 99  # the newest (wgmma exists on sm90 only)

    def supports(self, arch: str | Arch) -> bool:
        arch = arch if isinstance(arch, Arch) else Arch.of_name(arch)
        return self.min_major <= arch.major <= self.max_major

    def kernel_class(self):
        return getattr(importlib.import_module(f"{__package__}.kernels.{self.module}"),
                       self.class_name)

    def build(self, key: KernelKey):
        """The kernel object `cute.compile` traces for `key`."""
        if type(key) is not self.key_type:
            raise TypeError(f"backend {self.name!r} takes a {self.key_type.__name__}, "
                            f"got {type(key).__name__}")
        return self.kernel_class()(key)


# (name, kind) of every forward kernel's arguments, in order. "qkvo": a (batch, seqlen, heads,
# head_dim) tensor with dynamic extents, 16-byte aligned strides and a unit last stride (a
# paged K/V cache: (pages, page_size, heads, head_dim); a ragged batch: (1, total, heads,
# head_dim)); "out": the same in the input dtype, or float32 for split-KV partials; "lse":
# float32 (batch, heads, seqlen), ragged (1, heads, total); then scalars: the window's sides,
# the softcap; the ragged batch's cu_seqlens int32 (batch + 1,) and longest query; the
# cp.async kernel's decode arguments: seqused_k int32 (batch,), page_table int32 (batch,
# pages per sequence) and the split count. An argument the key does not ask for gets a
# placeholder and never reaches the device. The launch adds the stream.
ARGUMENTS = (("q", "qkvo"), ("k", "qkvo"), ("v", "qkvo"), ("out", "out"), ("lse", "lse"),
             ("softmax_scale", "float32"), ("causal_offset", "int32"), ("write_lse", "int32"),
             ("window_left", "int32"), ("window_right", "int32"), ("softcap", "float32"),
             ("cu_seqlens_q", "int32_vector"), ("cu_seqlens_k", "int32_vector"),
             ("max_seqlen_q", "int32"), ("seqused_k", "int32_vector"),
             ("page_table", "int32_matrix"), ("num_splits", "int32"))

REGISTRY = {b.name: b for b in (
    Backend("sm80", "cp.async + ldmatrix + mma.sync, any GPU from sm80 on", "fwd_sm80",
            "FlashFwdSm80", Sm80Key, 8, ARGUMENTS),
    Backend("tma", "TMA + mbarrier K/V ring + ldmatrix + mma.sync, sm90 and newer", "fwd_tma",
            "FlashFwdTma", TmaKey, 9, ARGUMENTS),
    Backend("sm90", "warp-specialized TMA producer + wgmma consumers, Hopper (sm90) only",
            "fwd_sm90", "FlashFwdSm90", Sm90Key, 9, ARGUMENTS, max_major=9),
)}


@dataclass(frozen=True)
class MergeKey:
    """The kernel that merges attention over disjoint key sets (`kernels/merge.py`): split-KV's
    second step and `cute_fa.merge_attention`."""

    arch: str
    head_dim: int
    in_dtype: str  # of the parts' O: float32 (split-KV's partials), float16 or bfloat16
    out_dtype: str
    backend: ClassVar[str] = "merge"


# its arguments: O parts (parts, batch, seqlen, heads, head_dim), LSE parts float32 (parts,
# batch, heads, seqlen), the merged O (batch, seqlen, heads, head_dim) and LSE, write_lse
MERGE_ARGUMENTS = (("o_parts", "o_parts"), ("lse_parts", "lse_parts"), ("out", "out"),
                   ("lse", "lse"), ("write_lse", "int32"))

# every kernel cute_fa compiles: the forward backends, the merge and (below) the backward's
KERNELS = dict(REGISTRY, merge=Backend("merge", "merge of split-KV partials", "merge",
                                       "MergeAttention", MergeKey, 8, MERGE_ARGUMENTS))


@dataclass(frozen=True)
class BwdKey(KernelKey):
    """What one compiled backward kernel (`kernels/bwd_sm80.py`) depends on: the forward's score
    features (causal, local, softcap, ragged Q/K; `KernelKey`), its tile (`BwdTileConfig`),
    and deterministic (dQ's float32 sums formed in key-block order, on a counter per query
    block). lpt has no meaning here: the backward's CTAs own key blocks."""

    tile: BwdTileConfig = None
    deterministic: bool = False
    backend: ClassVar[str] = "bwd_sm80"

    def __post_init__(self):
        if not isinstance(self.tile, BwdTileConfig):
            raise TypeError(f"tile must be a BwdTileConfig, got {type(self.tile).__name__}")
        if self.lpt:
            raise ValueError("lpt orders query blocks; the backward's CTAs own key blocks")


@dataclass(frozen=True)
class BwdPrepKey:
    """The backward's preprocess (`kernels/bwd_preprocess.py`): D = rowsum(dO * O), LSE in log2
    units."""

    arch: str
    tile: RowTile
    backend: ClassVar[str] = "bwd_pre"


@dataclass(frozen=True)
class BwdPostKey:
    """The backward's postprocess (`kernels/bwd_postprocess.py`): dQ from its float32 sums, laid
    out by the main kernel's tile."""

    arch: str
    tile: BwdTileConfig
    varlen: bool = False
    backend: ClassVar[str] = "bwd_post"


# the backward's kernels' arguments: q, k, v, dout and dk, dv as "qkvo"; the forward's lse in
# log2 units and D = rowsum(dout * out) float32 (batch, heads, seqlen) ("lse"); dq_accum
# float32 (batch, heads, blocks * block_m * head_dim_padded) ("accum3",
# `layouts.bwd.dq_accum_chunk`); the forward's scalars; cu_seqlens and the longest key
# sequence of a ragged batch; the deterministic mode's counters int32 (batch, heads, query
# blocks)
BWD_ARGUMENTS = (("q", "qkvo"), ("k", "qkvo"), ("v", "qkvo"), ("dout", "qkvo"),
                 ("lse_log2", "lse"), ("dpsum", "lse"), ("dq_accum", "accum3"), ("dk", "qkvo"),
                 ("dv", "qkvo"), ("softmax_scale", "float32"), ("causal_offset", "int32"),
                 ("window_left", "int32"), ("window_right", "int32"), ("softcap", "float32"),
                 ("cu_seqlens_q", "int32_vector"), ("cu_seqlens_k", "int32_vector"),
                 ("max_seqlen_k", "int32"), ("semaphore", "int32_tensor3"))
BWD_PREP_ARGUMENTS = (("out", "qkvo"), ("dout", "qkvo"), ("lse", "lse"), ("lse_log2", "lse"),
                      ("dpsum", "lse"))
BWD_POST_ARGUMENTS = (("dq_accum", "accum3"), ("dq", "qkvo"), ("softmax_scale", "float32"),
                      ("cu_seqlens_q", "int32_vector"), ("max_seqlen_q", "int32"))

KERNELS.update(
    bwd_sm80=Backend("bwd_sm80", "backward: cp.async + ldmatrix + mma.sync, any GPU from sm80 on",
                     "bwd_sm80", "FlashBwdSm80", BwdKey, 8, BWD_ARGUMENTS),
    bwd_pre=Backend("bwd_pre", "backward preprocess: D = rowsum(dO * O)", "bwd_preprocess",
                    "BwdPreprocess", BwdPrepKey, 8, BWD_PREP_ARGUMENTS),
    bwd_post=Backend("bwd_post", "backward postprocess: dQ from float32", "bwd_postprocess",
                     "BwdPostprocess", BwdPostKey, 8, BWD_POST_ARGUMENTS))


def backend_of(key) -> Backend:
    return KERNELS[key.backend]


