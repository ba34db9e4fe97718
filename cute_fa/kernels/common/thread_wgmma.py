"""One consumer thread's share of the wgmma kernel's MMAs, built from `cute_fa.layouts.wgmma`.

The counterpart of `thread_mma` for warpgroup MMAs: the two TiledMMAs (S = Q K^T from shared
memory, O += P V with P from registers), the shared-memory descriptors' fragments of Q, K
and V^T (per warpgroup: a wgmma reads its operands for all 128 threads at once), the O
accumulator and its row view, where this thread's S values sit in the tile (the mask's and
the LSE's constant offsets) and the online softmax over its two rows. What the mask, the
softmax and the epilogue read is `thread_mma.ThreadRows`, shared with the mma.sync kernels.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from ...layouts import TileConfig, wgmma
from .softmax import OnlineSoftmax
from .thread_mma import ThreadRows, tile_place


@dataclass(frozen=True)
class ThreadWgmma(ThreadRows):
    """tiled_mma is P V's (the epilogue stores O through its C layout); tiled_mma_qk S's, whose
    descriptors' fragments of Q and K are tSrQ and tSrK; tOrVt V^T's."""

    tiled_mma_qk: object
    thr_mma_qk: object
    tSrQ: object
    tSrK: object
    tOrVt: object


def thread_wgmma(cfg: TileConfig, tidx, sQ, sK, sVt, scale_log2, lazy_threshold=None):
    """tidx counts the consumer threads (0 ... num_threads - 1); sK and sVt carry the ring's
    stage mode."""
    bm, bn, dp = cfg.block_m, cfg.block_n, cfg.head_dim_padded
    mma_qk = wgmma.tiled_mma_qk(cfg)
    mma_pv = wgmma.tiled_mma_pv(cfg)
    # the descriptors are the warpgroup's: partition the operands by its first thread
    wg_first = (tidx // wgmma.WARPGROUP_THREADS) * wgmma.WARPGROUP_THREADS
    wg_qk = mma_qk.get_slice(wg_first)
    wg_pv = mma_pv.get_slice(wg_first)
    tSrQ = wg_qk.make_fragment_A(wg_qk.partition_A(sQ))
    tSrK = wg_qk.make_fragment_B(wg_qk.partition_B(sK))
    tOrVt = wg_pv.make_fragment_B(wg_pv.partition_B(sVt))
    thr_qk = mma_qk.get_slice(tidx)
    acc_O = cute.make_rmem_tensor(mma_pv.get_slice(tidx).partition_shape_C((bm, dp)),
                                  cutlass.Float32)
    acc_O.fill(0.0)

    tScS = thr_qk.partition_C(cute.make_identity_tensor((bm, bn)))
    place = tile_place(cute.make_tensor(tScS.iterator, wgmma.acc_rowcol_layout(tScS.layout)))
    offsets = wgmma.row_reduce_offsets(mma_qk)
    return ThreadWgmma(
        tiled_mma_qk=mma_qk, tiled_mma=mma_pv, thr_mma_qk=thr_qk, tSrQ=tSrQ, tSrK=tSrK,
        tOrVt=tOrVt, acc_O=acc_O,
        acc_O_mn=cute.make_tensor(acc_O.iterator, wgmma.acc_rowcol_layout(acc_O.layout)),
        reduce_offsets=offsets,
        softmax=OnlineSoftmax(len(place["row_offsets"]), scale_log2, offsets, lazy_threshold),
        **place)


def gemm(tiled_mma, acc, tCrA, tCrB, zero_init: bool):
    """Issue one tile's wgmmas (k-steps of 16) and commit them as one group; the caller waits
    (`warpgroup.wait_group`) where it needs the result. The fence orders this thread's earlier
    register writes (P, a rescaled O) before the wgmmas read them."""
    from cutlass.cute.nvgpu import warpgroup

    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for k in range(cute.size(tCrA.shape[2])):  # a static count: unrolled while traced
        cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
