"""One thread's share of the MMAs, built the same way by every kernel variant.

`thread_mma` builds, from `cute_fa.layouts`, the TiledMMA slice of thread `tidx`, its
register fragments (Q, K, V^T, the O accumulator and its row view), the ldmatrix copies
and their smem/register views, the constant row/column offsets of its S accumulator
(what the mask and the LSE store use) and the online softmax over its rows. Plain
Python, called while a kernel is traced.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from ...layouts import TileConfig, _read, copies, mma as mma_mod
from .softmax import OnlineSoftmax


@dataclass(frozen=True)
class ThreadRows:
    """What the mask, the softmax and the epilogue read of a thread, whichever MMA made it:
    the TiledMMA whose C layout O has, the O accumulator (and its row view), where its S
    accumulator sits in the tile (row0/col0 and constant row/column offsets), the row
    all-reduce offsets, and the online softmax over its rows."""

    tiled_mma: object
    acc_O: object
    acc_O_mn: object
    row0: object
    col0: object
    row_offsets: tuple
    col_offsets: tuple
    reduce_offsets: tuple
    softmax: OnlineSoftmax


@dataclass(frozen=True)
class ThreadMma(ThreadRows):
    """One mma.sync thread: its slice, the register fragments, the ldmatrix copies and their
    smem/register views (ldsm)."""

    thr_mma: object
    tSrQ: object
    tSrK: object
    tOrVt: object
    s2r_q: object
    s2r_k: object
    s2r_v: object
    ldsm: dict


def tile_place(tScS_mn) -> dict:
    """row0, col0 (the first (query, key) of a thread's S accumulator in the tile, dynamic) and
    the constant offsets of its rows and columns from them, read from the static layout of its
    (row, col) view of a partitioned identity tensor."""
    row0, col0 = tScS_mn[0, 0]
    rc_offsets = _read.offsets(tScS_mn.layout, 2)
    n_rows = cute.size(tScS_mn.shape[0])
    return dict(row0=row0, col0=col0,
                row_offsets=tuple(int(x) for x in rc_offsets[:n_rows, 0]),
                col_offsets=tuple(int(x) for x in rc_offsets[::n_rows, 1]))


def thread_mma(cfg: TileConfig, tidx, sQ, sK, sVt, sK_one, sVt_one, scale_log2,
               lazy_threshold=None) -> ThreadMma:
    """sK/sVt may carry a stage mode (the TMA ring); sK_one/sVt_one are one stage of them."""
    bm, bn, dp = cfg.block_m, cfg.block_n, cfg.head_dim_padded
    tiled_mma = mma_mod.tiled_mma(cfg)
    thr_mma = tiled_mma.get_slice(tidx)
    tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
    tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK_one))
    tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt_one))
    acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((bm, dp)), cutlass.Float32)
    acc_O.fill(0.0)

    s2r_q = copies.smem_tiled_copy_q(cfg, tiled_mma)
    s2r_k = copies.smem_tiled_copy_k(cfg, tiled_mma)
    s2r_v = copies.smem_tiled_copy_v(cfg, tiled_mma)
    thr_s2r_q = s2r_q.get_slice(tidx)
    thr_s2r_k = s2r_k.get_slice(tidx)
    thr_s2r_v = s2r_v.get_slice(tidx)
    ldsm = dict(
        tSsQ=thr_s2r_q.partition_S(sQ), tSrQ_view=thr_s2r_q.retile(tSrQ),
        tSsK=thr_s2r_k.partition_S(sK), tSrK_view=thr_s2r_k.retile(tSrK),
        tOsVt=thr_s2r_v.partition_S(sVt), tOrVt_view=thr_s2r_v.retile(tOrVt),
    )

    tScS = thr_mma.partition_C(cute.make_identity_tensor((bm, bn)))
    place = tile_place(cute.make_tensor(tScS.iterator, mma_mod.acc_rowcol_layout(tScS.layout)))
    offsets = mma_mod.row_reduce_offsets(tiled_mma)
    return ThreadMma(
        tiled_mma=tiled_mma, thr_mma=thr_mma, tSrQ=tSrQ, tSrK=tSrK, tOrVt=tOrVt, acc_O=acc_O,
        acc_O_mn=cute.make_tensor(acc_O.iterator, mma_mod.acc_rowcol_layout(acc_O.layout)),
        s2r_q=s2r_q, s2r_k=s2r_k, s2r_v=s2r_v, ldsm=ldsm, reduce_offsets=offsets,
        softmax=OnlineSoftmax(len(place["row_offsets"]), scale_log2, offsets, lazy_threshold),
        **place)
