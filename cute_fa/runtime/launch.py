"""Typed launch arguments, one record per kernel family, its fields the family's arguments in
`compile.registry`'s order (a test holds the two to each other). A call fills in what it has;
`for_kernel` hands a compiled kernel exactly the arguments its key takes, None for the others,
as the kernel was compiled (`compile.fake`)."""

from __future__ import annotations

from collections import namedtuple
from typing import NamedTuple


class ForwardArgs(NamedTuple):
    """The forward kernels' (sm80's; the TMA kernel takes the first 16, the wgmma kernel
    `Sm90Args`)."""

    q: object
    k: object
    v: object
    out: object
    lse: object
    softmax_scale: float
    causal_offset: int
    write_lse: int
    window_left: int | None = None
    window_right: int | None = None
    softcap: float | None = None
    cu_seqlens_q: object = None
    cu_seqlens_k: object = None
    max_seqlen_q: int | None = None
    score_tensors: tuple | None = None
    tile_order: object = None
    seqused_k: object = None
    page_table: object = None
    num_splits: int | None = None
    merged_out: object = None
    merged_lse: object = None
    write_merged_lse: int | None = None
    split_counters: object = None


# the wgmma kernel's: the first 16 of ForwardArgs (no decode arguments), then a persistent
# grid's tile counter
Sm90Args = namedtuple("Sm90Args", ForwardArgs._fields[:16] + ("tile_counter",),
                      defaults=(None,) * 9)


class MergeArgs(NamedTuple):
    o_parts: object
    lse_parts: object
    out: object
    lse: object
    write_lse: int


class BwdPrepArgs(NamedTuple):
    out: object
    dout: object
    lse: object
    lse_log2: object
    dpsum: object


class BwdArgs(NamedTuple):
    q: object
    k: object
    v: object
    dout: object
    lse_log2: object
    dpsum: object
    dq_accum: object
    dk: object
    dv: object
    softmax_scale: float
    causal_offset: int
    window_left: int | None = None
    window_right: int | None = None
    softcap: float | None = None
    cu_seqlens_q: object = None
    cu_seqlens_k: object = None
    max_seqlen_k: int | None = None
    semaphore: object = None
    score_tensors: tuple | None = None
    dk_accum: object = None
    dv_accum: object = None
    head_splits: int | None = None
    kv_semaphore: object = None


class BwdPostArgs(NamedTuple):
    dq_accum: object
    dq: object
    softmax_scale: float
    cu_seqlens_q: object = None
    max_seqlen_q: int | None = None


class BwdKvPostArgs(NamedTuple):
    dk_accum: object
    dv_accum: object
    dk: object
    dv: object
    cu_seqlens_k: object = None
    max_seqlen_k: int | None = None


RECORDS = {"sm80": ForwardArgs, "tma": ForwardArgs, "sm90": Sm90Args, "merge": MergeArgs,
           "bwd_pre": BwdPrepArgs, "bwd_sm80": BwdArgs, "bwd_sm90": BwdArgs,
           "bwd_post": BwdPostArgs, "bwd_post_kv": BwdKvPostArgs}


def for_kernel(args: tuple, used: tuple) -> tuple:
    """`args` as a kernel whose key takes the arguments flagged in `used` is called: each used
    one as given, None for the others (and nothing past the kernel's last argument)."""
    return tuple([a if u else None for a, u in zip(args, used)])
