"""Epilogue shared by the kernels: O through shared memory with 128-bit stores, and LSE."""

import cutlass
import cutlass.cute as cute

from ...layouts import copies, mma as mma_mod, smem
from ...layouts._types import cutlass_dtype
from .softmax import LN2
from ..sched.seqlen import SeqlenInfo, shifted


@cute.jit
def store_O(cfg: cutlass.Constexpr, acc_O: cute.Tensor, tiled_mma: cute.TiledMma, sQ: cute.Tensor,
            gO: cute.Tensor, cO: cute.Tensor, seqlen_q, tidx, row_shift: cutlass.Constexpr = None,
            sync: cutlass.Constexpr = None):
    """Write the normalised O tile: registers -> sO (reusing sQ) -> 16-byte stores to gmem.

    The MMA layout scatters a row over a quad; going through smem lets each thread
    store whole 16-byte runs. Rows past seqlen_q and columns past head_dim are skipped.
    gO/cO are the (block_m, head_dim_padded) tile of O and its identity coordinates.
    row_shift (GQA packing): a function of a row's coordinate giving the element offset from
    its place in gO to its place in O; seqlen_q then counts the packed rows.
    sync: the barrier of the threads that store (default: the whole CTA's); a warp-specialized
    kernel passes its consumers' named barrier, since its producer warps never get here.
    """
    dtype = cutlass_dtype(cfg.dtype)
    rO = cute.make_fragment_like(acc_O, dtype)
    rO.store(acc_O.load().to(dtype))
    sO = cute.make_tensor(sQ.iterator, smem.smem_layout_o(cfg))
    r2s = copies.smem_tiled_copy_o(cfg, tiled_mma)
    thr_r2s = r2s.get_slice(tidx)
    # Every warp is past its last read of sQ, and no Q copy is still landing there
    # (a CTA whose rows see no key at all runs no round, so nothing waited for Q).
    cute.arch.cp_async_wait_group(0)
    barrier = cute.arch.barrier if cutlass.const_expr(sync is None) else sync
    barrier()
    cute.copy(r2s, thr_r2s.retile(rO), thr_r2s.partition_D(sO))
    barrier()
    copy_out_O(cfg, sO, gO, cO, seqlen_q, tidx, row_shift)


@cute.jit
def copy_out_O(cfg: cutlass.Constexpr, sO: cute.Tensor, gO: cute.Tensor, cO: cute.Tensor,
               seqlen_q, tidx, row_shift: cutlass.Constexpr = None):
    """`store_O`'s second half: the O tile in shared memory (`smem.smem_layout_o`, every
    thread's writes behind a barrier) -> 16-byte stores to gO, rows past seqlen_q and columns
    past head_dim skipped."""
    dtype = cutlass_dtype(cfg.dtype)
    s2g = copies.gmem_tiled_copy_o(cfg)
    thr_s2g = s2g.get_slice(tidx)
    tOsO = thr_s2g.partition_S(sO)
    tOgO = thr_s2g.partition_D(gO)
    tOcO = thr_s2g.partition_D(cO)
    tOrO = cute.make_fragment_like(tOsO, dtype)
    cute.copy(s2g, tOsO, tOrO)
    for m in cutlass.range_constexpr(cute.size(tOgO.shape[1])):
        if tOcO[0, m, 0][0] < seqlen_q:
            if cutlass.const_expr(row_shift is None):
                if cutlass.const_expr(cfg.head_dim == cfg.head_dim_padded):
                    cute.copy(s2g, tOrO[None, m, None], tOgO[None, m, None])
                else:
                    for k in cutlass.range_constexpr(cute.size(tOgO.shape[2])):
                        if tOcO[0, m, k][1] < cfg.head_dim:
                            cute.copy(s2g, tOrO[None, m, k], tOgO[None, m, k])
            else:
                tOgO_m = shifted(tOgO[None, m, None], row_shift(tOcO[0, m, 0][0]))
                for k in cutlass.range_constexpr(cute.size(tOgO.shape[2])):
                    if cutlass.const_expr(cfg.head_dim == cfg.head_dim_padded):
                        cute.copy(s2g, tOrO[None, m, k], tOgO_m[None, k])
                    elif tOcO[0, m, k][1] < cfg.head_dim:
                        cute.copy(s2g, tOrO[None, m, k], tOgO_m[None, k])


@cute.jit
def store_LSE(lse: cute.Tensor, query0, row_offsets: cutlass.Constexpr, gLSE: cute.Tensor,
              seqlen_q, tidx, quad_bits: cutlass.Constexpr):
    """One lane per quad writes the LSE of each of its rows (all lanes of a quad agree).

    The thread's rows are query0 + row_offsets[r]; quad_bits is the OR of the
    row-reduction XOR offsets (lane bits inside a quad).
    """
    if tidx & quad_bits == 0:
        for r in cutlass.range_constexpr(len(row_offsets)):
            row = query0 + row_offsets[r]
            if row < seqlen_q:
                gLSE[row] = lse[r]


def finalize(f) -> cute.Tensor:
    """Normalise the thread's O (f: `thread_mma.ThreadRows`) by its full row sums; returns its
    rows' natural-log LSE, in registers."""
    lse = cute.make_rmem_tensor(cute.size(f.softmax.row_max), cutlass.Float32)
    f.softmax.finalize(f.acc_O_mn, lse)
    return lse


@cute.jit
def store_rows_LSE(f, lse: cute.Tensor, mLSE: cute.Tensor, batch, head, seqlen: SeqlenInfo,
                   query0, write_lse, tidx):
    """`store_LSE` of the thread's rows (f: `thread_mma.ThreadRows`), into entry `batch`'s
    `head`, if asked: else mLSE is a placeholder, the caller did not ask for LSE."""
    if write_lse != 0:
        quad_bits = sum(f.reduce_offsets)  # distinct powers of two
        store_LSE(lse, query0, f.row_offsets, seqlen.lse_row(mLSE, batch, head),
                  seqlen.seqlen_q, tidx, quad_bits)


@cute.jit
def write_outputs(cfg: cutlass.Constexpr, f, sQ: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                  batch, head, m_block, seqlen: SeqlenInfo, query0, write_lse, tidx,
                  sync: cutlass.Constexpr = None):
    """The end of every forward kernel: normalise O, store it and, if asked, LSE.

    f is the thread's `thread_mma.ThreadMma` (or `thread_wgmma.ThreadWgmma`); query0 the global
    row of its first S row; sync: `store_O`'s.
    """
    bm, dp = cfg.block_m, cfg.head_dim_padded
    seqlen_q = seqlen.seqlen_q
    lse = finalize(f)
    cO = cute.local_tile(cute.make_identity_tensor((seqlen_q, cfg.head_dim)), (bm, dp),
                         (m_block, 0))
    gO = cute.local_tile(seqlen.q_rows(mO, batch, head), (bm, dp), (m_block, 0))
    store_O(cfg, f.acc_O, f.tiled_mma, sQ, gO, cO, seqlen_q, tidx, sync=sync)
    store_rows_LSE(f, lse, mLSE, batch, head, seqlen, query0, write_lse, tidx)


@cute.jit
def write_outputs_rows(cfg: cutlass.Constexpr, f, sQ: cute.Tensor, mO: cute.Tensor,
                       mLSE: cute.Tensor, tile, rows: cutlass.Constexpr, seqlen_q, write_lse,
                       tidx):
    """`write_outputs` for tiles whose rows are GQA-packed (`work.QueryRows`) or whose
    outputs are a split's float32 partials (mO float32, indexed by tile.out_batch).

    A 16-bit O goes through smem like `write_outputs`, each row shifted to its (query, head);
    a float32 partial O is stored straight from the accumulator (decode's partials are small,
    and an fp32 tile would not fit in sQ's bytes)."""
    bm, dp = cfg.block_m, cfg.head_dim_padded
    lse = finalize(f)
    n_rows = rows.count(seqlen_q)
    out_batch = tile.batch if cutlass.const_expr(tile.out_batch is None) else tile.out_batch
    row_base = tile.m_block * bm
    if cutlass.const_expr(mO.element_type == cutlass.Float32):
        cO = cute.make_identity_tensor((bm, dp))
        tOcO = f.thr_mma.partition_C(cO)
        tOcO_mn = cute.make_tensor(tOcO.iterator, mma_mod.acc_rowcol_layout(tOcO.layout))
        for r in cutlass.range_constexpr(cute.size(tOcO_mn.shape[0])):
            o_row = row_base + tOcO_mn[r, 0][0]
            if o_row < n_rows:
                gO_row = mO[out_batch, rows.query(o_row), rows.head(tile.head, o_row), None]
                for c in cutlass.range_constexpr(cute.size(tOcO_mn.shape[1])):
                    col = tOcO_mn[r, c][1]
                    if cutlass.const_expr(cfg.head_dim == cfg.head_dim_padded):
                        gO_row[col] = f.acc_O_mn[r, c]
                    elif col < cfg.head_dim:
                        gO_row[col] = f.acc_O_mn[r, c]
    else:
        cO = cute.local_tile(cute.make_identity_tensor((n_rows, cfg.head_dim)), (bm, dp),
                             (tile.m_block, 0))
        # the tile of query rows 0..bm-1 of the group's first head: each row is shifted from
        # its place there to its (query, head)
        gO = cute.local_tile(mO[out_batch, None, tile.head, None], (bm, dp), (0, 0))
        stride_q, stride_h = mO.stride[1], mO.stride[2]

        def row_shift(row):
            return rows.offset(row, row - row_base, stride_q, stride_h)

        store_O(cfg, f.acc_O, f.tiled_mma, sQ, gO, cO, n_rows, tidx, row_shift)
    if write_lse != 0:
        quad_bits = sum(f.reduce_offsets)
        if tidx & quad_bits == 0:
            for r in cutlass.range_constexpr(len(f.row_offsets)):
                lse_row = row_base + f.row0 + f.row_offsets[r]
                if lse_row < n_rows:
                    mLSE[out_batch, rows.head(tile.head, lse_row), rows.query(lse_row)] = lse[r]


def warp_combine_bytes(cfg) -> int:
    """Shared memory `write_outputs_warp_split` uses: per key group and tile row, the float32 O
    of the warp holding it (rows padded by 8 floats, so that the quads' 8-byte stores hit 32
    distinct banks) and its row max and sum."""
    return 4 * cfg.key_groups * cfg.block_m * (cfg.head_dim_padded + 8 + 2)


@cute.jit
def write_outputs_warp_split(cfg: cutlass.Constexpr, f, scratch: cute.Tensor, mO: cute.Tensor,
                             mLSE: cute.Tensor, tile, rows: cutlass.Constexpr, seqlen_q,
                             write_lse, tidx, warp):
    """The epilogue of a tile whose warps split the keys (`TileConfig.warps_split_keys`): the
    key_groups warps of a 16-row slab hold the online softmax of the same rows, each over its
    own keys. Each warp puts its unnormalised O, row max (scaled to log2 units) and row sum into
    `scratch` (float32 smem, `warp_combine_bytes`), then the CTA's threads combine them 8
    columns at a time, rescaling each warp's share by exp2(max_w - max), and store O (16-bit, or
    a split's float32 partial) and LSE of each packed row at its (query, head)."""
    groups, bm, dp = cfg.key_groups, cfg.block_m, cfg.head_dim_padded
    pad = dp + 8
    sO = cute.make_tensor(scratch.iterator,
                          cute.make_layout((groups, bm, pad), stride=(bm * pad, pad, 1)))
    sMax = cute.make_tensor(scratch.iterator + groups * bm * pad,
                            cute.make_layout((groups, bm), stride=(bm, 1)))
    sSum = cute.make_tensor(scratch.iterator + groups * bm * (pad + 1),
                            cute.make_layout((groups, bm), stride=(bm, 1)))
    slab, group = cfg.warp_place(warp)
    quad_bits = sum(f.reduce_offsets)
    # every warp is past its last read of the K/V tiles that scratch overlays
    cute.arch.cp_async_wait_group(0)
    cute.arch.barrier()
    tOcO = f.thr_mma.partition_C(cute.make_identity_tensor((16, dp)))  # the warp's slab
    tOcO_mn = cute.make_tensor(tOcO.iterator, mma_mod.acc_rowcol_layout(tOcO.layout))
    for r in cutlass.range_constexpr(cute.size(tOcO_mn.shape[0])):
        row = slab * 16 + tOcO_mn[r, 0][0]
        total = f.softmax.quad_total(r)
        if tidx & quad_bits == 0:
            sMax[group, row] = f.softmax.row_max[r] * f.softmax.scale_log2
            sSum[group, row] = total
        for c in cutlass.range_constexpr(cute.size(tOcO_mn.shape[1])):
            sO[group, row, tOcO_mn[r, c][1]] = f.acc_O_mn[r, c]
    cute.arch.barrier()

    vec = 8
    chunks_per_row = dp // vec
    n_rows = rows.count(seqlen_q)
    out_batch = tile.batch if cutlass.const_expr(tile.out_batch is None) else tile.out_batch
    for p in cutlass.range_constexpr(-(-bm * chunks_per_row // cfg.num_threads)):
        chunk = tidx + p * cfg.num_threads
        row = chunk // chunks_per_row
        col = (chunk % chunks_per_row) * vec
        o_row = tile.m_block * bm + row
        if chunk < bm * chunks_per_row and o_row < n_rows:
            row_max = sMax[0, row]
            for w in cutlass.range_constexpr(1, groups):
                row_max = cute.arch.fmax(row_max, sMax[w, row])
            base = 0.0 if row_max == -cutlass.Float32.inf else row_max
            total = cutlass.Float32(0.0)
            acc = cute.make_rmem_tensor(vec, cutlass.Float32)
            acc.fill(0.0)
            for w in cutlass.range_constexpr(groups):
                weight = cute.math.exp2(sMax[w, row] - base, fastmath=True)
                total = total + weight * sSum[w, row]
                acc.store(acc.load() + cute.local_tile(sO[w, row, None], (vec,),
                                                       (col // vec,)).load() * weight)
            inv = 0.0 if total == 0.0 else cute.arch.rcp_approx(total)
            query, head = rows.query(o_row), rows.head(tile.head, o_row)
            if col < cfg.head_dim:
                rO = cute.make_rmem_tensor(vec, mO.element_type)
                rO.store((acc.load() * inv).to(mO.element_type))
                cute.autovec_copy(rO, cute.local_tile(mO[out_batch, query, head, None], (vec,),
                                                      (col // vec,)))
            if write_lse != 0 and col == 0:
                mLSE[out_batch, head, query] = (
                    -cutlass.Float32.inf if total == 0.0
                    else (base + cute.math.log2(total, fastmath=True)) * LN2)
