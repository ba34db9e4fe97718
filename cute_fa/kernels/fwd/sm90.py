"""The Hopper forward kernel (sm90): warp-specialized TMA producer + wgmma consumers.

Roles (`layouts.wgmma.WarpRoles`): warpgroup 0 is the producer, its warp 0 issues every TMA
load (Q once, then K and V of each round into a ring of `kv_stages` stages) and the other
three warps hand their registers to the consumers (setmaxnreg); warpgroups 1 ... are the
consumers, each owning 64 query rows of the tile. The producer and the consumers meet only at
mbarriers (`layouts.ring.PipelineBarriers`): "full" (the bytes have landed) and "empty" (every
consumer warp has read the stage), per stage, for K and for V.

A consumer warpgroup's round j, with the intra-warpgroup overlap (`intra_wg_overlap`):

    wait K[j] full
    S_j = Q K_j^T            SS-wgmma, issued, not waited for
    O  += P_{j-1} V_{j-1}    RS-wgmma (P in registers), issued behind it
    wait for S_j             (wgmma.wait_group 1: the P V group may still run)
    K[j] empty
    softcap, mask, online softmax of S_j        <- overlaps the P V wgmmas
    wait for P V, V[j-1] empty
    rescale O, P_j = S_j in 16 bits

so the tensor cores run P_{j-1} V_{j-1} while the warps compute the exponentials of S_j; the
last round's P V runs after the loop. Without the overlap a round is S, softmax, P V in order.
With `pingpong`, two (or three) consumer warpgroups take turns issuing their wgmmas, handing
the turn over on named barriers: while one warpgroup runs its softmax the other's GEMMs own
the tensor cores. The mask, softcap, softmax, work split and epilogue are the other kernels'
(`base`, `common.mask`, `common.softmax`, `sched`, `common.epilogue`).
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass.cute.nvgpu import cpasync, warpgroup

from ...compile.keys import Sm90Key
from ...layouts import ring, smem, tma, wgmma
from ...layouts._types import cutlass_dtype
from ...layouts.config import SM90_SMEM_BYTES
from ..common import convert, epilogue
from .base import FlashFwdBase, RoundContext
from ..common.softmax import score_scales
from ..common.thread_wgmma import ThreadWgmma, gemm, thread_wgmma
from ..sched.seqlen import SeqlenInfo, packed_lse, tma_entry_rows
from ..sched.tile_scheduler import PersistentTileScheduler

# named barriers (0 is the CTA's __syncthreads): the consumers' epilogue, then one turn
# barrier per consumer warpgroup for the ping-pong
EPILOGUE_BARRIER = 1
TURN_BARRIER = 2


class FlashFwdSm90(FlashFwdBase):
    MASK_BITS = True

    def __init__(self, key: Sm90Key):
        wgmma.check_tile(key.tile)
        if key.kv_stages < 2:
            raise ValueError(f"kv_stages must be at least 2, got {key.kv_stages}")
        super().__init__(key)
        self.kv_stages = key.kv_stages
        self.overlap = key.intra_wg_overlap
        self.roles = wgmma.warp_roles(key.tile)
        self.pingpong = key.pingpong and self.roles.consumers > 1
        # a ragged batch's last tile of an entry would run into the next entry's rows
        self.tma_store = key.tma_store and not key.varlen_q
        self.persistent = key.persistent
        self.dynamic = key.dynamic_tiles
        self.packed_p = key.packed_p
        self.bars = ring.PipelineBarriers(key.kv_stages, q_empty=bool(key.persistent))
        if key.persistent:
            cfg = key.tile
            # sO is Q's size (smem_bytes(0)); then the barriers' 1 KB-aligned block
            need = cfg.smem_bytes(key.kv_stages) + cfg.smem_bytes(0) + 1024
            if need > SM90_SMEM_BYTES:
                raise ValueError(f"persistent stages O in its own tile: {need} bytes of shared "
                                 f"memory at head_dim {cfg.head_dim}, sm90 has "
                                 f"{SM90_SMEM_BYTES}")
            self.tiles = PersistentTileScheduler(cfg.block_m, key.causal, key.lpt,
                                                 key.persistent)

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, softmax_scale: cutlass.Float32, causal_offset: Optional[cutlass.Int32],
                 write_lse: cutlass.Int32, window_left: Optional[cutlass.Int32],
                 window_right: Optional[cutlass.Int32], softcap: Optional[cutlass.Float32],
                 mCuSeqlensQ: Optional[cute.Tensor], mCuSeqlensK: Optional[cute.Tensor],
                 max_seqlen_q: Optional[cutlass.Int32], score_tensors: Optional[tuple],
                 mTileOrder: Optional[cute.Tensor], mTileCounter: Optional[cute.Tensor],
                 stream):
        """The optional arguments are those the key asks for (`compile.registry`), None
        elsewhere."""
        cfg = self.cfg
        tma_atom_Q, tma_Q = tma.tma_load(cfg, "Q", tma.tma_view(mQ, self.group))
        tma_atom_K, tma_K = tma.tma_load(cfg, "K", tma.tma_view(mK))
        tma_atom_V, tma_V = tma.tma_load(cfg, "V", tma.tma_view(mV))
        tma_atom_O, tma_O = None, None
        if cutlass.const_expr(self.tma_store):
            tma_atom_O, tma_O = tma.tma_store(cfg, tma.tma_view(mO, self.group))
        if cutlass.const_expr(self.group > 1):
            mLSE = packed_lse(mLSE, self.group)
        sQ_layout = tma.tma_smem_layout(cfg, "Q")
        sKV_layout = tma.tma_smem_layout(cfg, "K", self.kv_stages)
        Storage = smem.shared_storage(cfg, self.kv_stages, self.bars.count,
                                      separate_o=bool(self.persistent))
        scale_log2, pre_scale = score_scales(self.softcap, softmax_scale, softcap,
                                             self.score_mod)
        if cutlass.const_expr(self.persistent):
            grid = self.tiles.grid(mQ.shape[1], mQ.shape[2], mQ.shape[0])
        else:
            grid = self._grid(mQ, mCuSeqlensQ, max_seqlen_q)
        self._launch(self.kernel(tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V,
                                 tma_atom_O, tma_O, mO, mLSE, scale_log2, causal_offset,
                                 write_lse,
                                 sQ_layout, sKV_layout, Storage, mCuSeqlensQ, mCuSeqlensK,
                                 window_left, window_right,
                                 pre_scale, mTileCounter, score_tensors, mTileOrder),
                     grid, Storage, stream, threads=self.roles.threads)

    @cute.kernel
    def kernel(self, tma_atom_Q: cute.CopyAtom, tma_Q: cute.Tensor, tma_atom_K: cute.CopyAtom,
               tma_K: cute.Tensor, tma_atom_V: cute.CopyAtom, tma_V: cute.Tensor,
               tma_atom_O: Optional[cute.CopyAtom], tma_O: Optional[cute.Tensor],
               mO: cute.Tensor, mLSE: cute.Tensor, scale_log2: cutlass.Float32,
               causal_offset: Optional[cutlass.Int32], write_lse: cutlass.Int32,
               sQ_layout: cute.ComposedLayout, sKV_layout: cute.ComposedLayout,
               Storage: cutlass.Constexpr, mCuSeqlensQ: Optional[cute.Tensor],
               mCuSeqlensK: Optional[cute.Tensor], window_left: Optional[cutlass.Int32],
               window_right: Optional[cutlass.Int32], pre_scale: Optional[cutlass.Float32],
               mTileCounter: Optional[cute.Tensor], score_tensors: Optional[tuple],
               mTileOrder: Optional[cute.Tensor]):
        if cutlass.const_expr(self.persistent):
            self._persistent(tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V,
                             tma_atom_O, tma_O, mLSE, scale_log2, causal_offset, write_lse,
                             sQ_layout, sKV_layout, Storage, window_left, window_right,
                             pre_scale, mTileCounter, score_tensors)
        else:
            self._single(tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_O,
                         tma_O, mO, mLSE, scale_log2, causal_offset, write_lse, sQ_layout,
                         sKV_layout, Storage, mCuSeqlensQ, mCuSeqlensK, window_left,
                         window_right, pre_scale, score_tensors, mTileOrder)

    @cute.jit
    def _single(self, tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_O,
                tma_O, mO, mLSE, scale_log2, causal_offset, write_lse, sQ_layout, sKV_layout,
                Storage, mCuSeqlensQ, mCuSeqlensK, window_left, window_right, pre_scale,
                score_tensors, mTileOrder=None):
        """One CTA, one tile (`SingleTileScheduler`)."""
        cfg = self.cfg
        bars = self.bars
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tile, seqlen, keys = self._tma_work(tma_Q, tma_K, causal_offset, mCuSeqlensQ,
                                            mCuSeqlensK, window_left, window_right,
                                            score_tensors, mTileOrder)
        n_rounds = self._n_rounds(keys.n_block_max, keys.n_block_min)
        storage, mbar = self._shared(Storage, warp)

        if warp < 4:
            cute.arch.setmaxregister_decrease(self.roles.producer_regs)
            if warp == 0:
                self._produce(storage, tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V,
                              tile, seqlen, keys.n_block_max, n_rounds, keys.blocks)
        else:
            cute.arch.setmaxregister_increase(self.roles.consumer_regs)
            # the wgmma operands: the TMA tiles, the swizzle carried by the pointer, which is
            # how the DSL builds wgmma descriptors
            sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sK = storage.sK.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
            sV = storage.sV.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
            ctidx = tidx - wgmma.WARPGROUP_THREADS
            thr = thread_wgmma(cfg, ctidx, sQ, sK, wgmma.transposed(sV), scale_log2)
            ctx = self._context(thr, tile.m_block, seqlen, keys, None,
                                pre_scale=pre_scale, tile=tile, score_tensors=score_tensors)
            # Q has landed before anyone reads it, and before the epilogue reuses its bytes
            # for O (a tile that visits no key block runs no round)
            cute.arch.mbarrier_wait(mbar + bars.q, 0)
            if n_rounds > 0:
                self._mainloop(ctx, thr, mbar, n_rounds, ctidx)
            self.absorb_sinks(ctx, tile)
            if cutlass.const_expr(self.tma_store):
                self._store_tma(thr, storage, sQ, tma_atom_O, tma_O, mLSE, tile, seqlen,
                                ctx.mask_at.query0, write_lse, ctidx)
            else:
                # sO is sQ's bytes, addressed with the store's (element-swizzled) layout
                sO = storage.sQ.get_tensor(smem.smem_layout_q(cfg))
                epilogue.write_outputs(cfg, thr, sO, mO, mLSE, tile.batch, tile.head,
                                       tile.m_block, seqlen, ctx.mask_at.query0, write_lse,
                                       ctidx, sync=self._consumer_sync)

    @cute.jit
    def _shared(self, Storage, warp):
        """The CTA's shared storage and its mbarriers, initialised (count 1 for the "full"
        ones, the producer's expect_tx; one arrival per consumer warp for the "empty" ones)
        before any warp passes the CTA barrier."""
        bars = self.bars
        storage = cutlass.memory.SmemAllocator().allocate(Storage)
        mbar = storage.mbar.data_ptr()
        if warp == 0:
            with cute.arch.elect_one():
                for i in cutlass.range_constexpr(bars.k_empty):  # Q, K and V full
                    cute.arch.mbarrier_init(mbar + i, 1)
                for i in cutlass.range_constexpr(bars.k_empty, bars.count):  # empties
                    cute.arch.mbarrier_init(mbar + i, self.roles.consumer_threads // 32)
                cute.arch.mbarrier_init_fence()
        cute.arch.barrier()
        return storage, mbar

    @cute.jit
    def _persistent(self, tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_O,
                    tma_O, mLSE, scale_log2, causal_offset, write_lse, sQ_layout, sKV_layout,
                    Storage, window_left, window_right, pre_scale, mTileCounter, score_tensors):
        """A persistent CTA (`PersistentTileScheduler`): its first tile is blockIdx.x, each
        next one blockIdx.x + k gridDim.x, or with `dynamic_tiles` the counter's next (the
        producer fetches it). The producer hands each tile's index to the consumers in sTile
        with its Q (they read it once Q's "full" barrier completes, which also tells them
        there is no tile left: an index past the last). The K/V ring's round count runs on
        across tiles, so the producer fills the next tile's stages while the consumers finish
        this one; Q is released once a tile's wgmmas have read it (q_empty) and reloaded under
        its epilogue, which stages O in sO."""
        cfg, bars = self.cfg, self.bars
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        seqlen = SeqlenInfo(tma_Q.shape[0], tma_K.shape[0])
        heads_q, heads_kv = tma_Q.shape[2], tma_K.shape[2]
        total = self.tiles.tiles(seqlen.seqlen_q, heads_q, tma_Q.shape[3])
        storage, mbar = self._shared(Storage, warp)
        sTile = storage.tile.get_tensor(cute.make_layout(1))

        if warp < 4:
            cute.arch.setmaxregister_decrease(self.roles.producer_regs)
            if warp == 0:
                self._produce_tiles(storage, sTile, mTileCounter, tma_atom_Q, tma_Q, tma_atom_K,
                                    tma_K, tma_atom_V, tma_V, seqlen, total, causal_offset,
                                    window_left, window_right)
        else:
            cute.arch.setmaxregister_increase(self.roles.consumer_regs)
            sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sK = storage.sK.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
            sV = storage.sV.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
            sO = storage.sO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            ctidx = tidx - wgmma.WARPGROUP_THREADS
            if cutlass.const_expr(self.pingpong):
                # the first turn is warpgroup 0's, once: each tile's last hand-over (the last
                # warpgroup's, to warpgroup 0) is the next tile's first turn
                if cute.arch.make_warp_uniform(ctidx // wgmma.WARPGROUP_THREADS) == 0:
                    cute.arch.barrier_arrive(barrier_id=TURN_BARRIER,
                                             number_of_threads=2 * wgmma.WARPGROUP_THREADS)
            rounds = cutlass.Int32(0)
            done = cutlass.Int32(0)
            cute.arch.mbarrier_wait(mbar + bars.q, 0)
            t = self._tile_index(sTile)
            while t < total:
                tile = self.tiles.tile(t, seqlen.seqlen_q, heads_q, heads_kv)
                keys = self._key_range(tile, seqlen, causal_offset, window_left, window_right)
                n_rounds = self._n_rounds(keys.n_block_max, keys.n_block_min)
                thr = thread_wgmma(cfg, ctidx, sQ, sK, wgmma.transposed(sV), scale_log2)
                ctx = self._context(thr, tile.m_block, seqlen, keys, None,
                                    pre_scale=pre_scale, tile=tile, score_tensors=score_tensors)
                if n_rounds > 0:
                    self._mainloop(ctx, thr, mbar, n_rounds, ctidx, base=rounds)
                self._release(mbar + bars.q_released)
                self.absorb_sinks(ctx, tile)
                self._store_tma(thr, storage, sO, tma_atom_O, tma_O, mLSE, tile, seqlen,
                                ctx.mask_at.query0, write_lse, ctidx)
                rounds += n_rounds
                done += 1
                cute.arch.mbarrier_wait(mbar + bars.q, done % 2)
                t = self._tile_index(sTile)
            if ctidx < 32:  # the last tile's O store has read sO before the CTA's smem goes
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _tile_index(self, sTile):
        """The index the producer left in sTile, read by each warp's lane 0 and passed to the
        others: lane 0's release of Q (`_release`, after the tile's wgmmas) then orders every
        read of it before the producer overwrites it with the next tile's."""
        t = cutlass.Int32(0)
        if cute.arch.lane_idx() == 0:
            t = sTile[0]
        return cute.arch.shuffle_sync(t, 0)

    @cute.jit
    def _produce_tiles(self, storage, sTile, mTileCounter, tma_atom_Q, tma_Q, tma_atom_K,
                       tma_K, tma_atom_V, tma_V, seqlen: SeqlenInfo, total, causal_offset,
                       window_left, window_right):
        """Warp 0 of a persistent CTA: per tile, once the consumers have released the previous
        tile's Q, its index into sTile and its Q, then its K and V (`_load_kv`, the ring's
        rounds counted on); after the last, an index past it, on Q's barrier alone."""
        cfg, bars = self.cfg, self.bars
        mbar = storage.mbar.data_ptr()
        heads_q, heads_kv = tma_Q.shape[2], tma_K.shape[2]
        step = cute.arch.grid_dim()[0]
        q_bytes = tma.tma_box(cfg, "Q").tile_bytes
        with cute.arch.elect_one():
            cpasync.prefetch_descriptor(tma_atom_Q)
            cpasync.prefetch_descriptor(tma_atom_K)
            cpasync.prefetch_descriptor(tma_atom_V)
        rounds = cutlass.Int32(0)
        done = cutlass.Int32(0)
        t = cute.arch.block_idx()[0]
        while t < total:
            tile = self.tiles.tile(t, seqlen.seqlen_q, heads_q, heads_kv)
            keys = self._key_range(tile, seqlen, causal_offset, window_left, window_right)
            n_rounds = self._n_rounds(keys.n_block_max, keys.n_block_min)
            parts = self._tma_partitions(storage, self.kv_stages, tma_atom_Q, tma_Q, tma_atom_K,
                                         tma_K, tma_atom_V, tma_V, tile, seqlen)
            if done > 0:  # the consumers have read the previous index and are done with sQ
                cute.arch.mbarrier_wait(mbar + bars.q_released, (done - 1) % 2)
            with cute.arch.elect_one():
                sTile[0] = t
                cute.arch.mbarrier_arrive_and_expect_tx(mbar + bars.q, q_bytes)
            cute.copy(tma_atom_Q, parts[1], parts[0], tma_bar_ptr=mbar + bars.q)
            self._load_kv(mbar, tma_atom_K, tma_atom_V, parts[2:], keys.n_block_max, n_rounds,
                          rounds)
            rounds += n_rounds
            done += 1
            t = self._next_tile(t, step, total, mTileCounter)
        if done > 0:
            cute.arch.mbarrier_wait(mbar + bars.q_released, (done - 1) % 2)
        with cute.arch.elect_one():
            sTile[0] = total
            cute.arch.mbarrier_arrive(mbar + bars.q)

    @cute.jit
    def _next_tile(self, t, step, total, mTileCounter):
        """The producer warp's next tile after t: t + gridDim.x, or with `dynamic_tiles` the
        counter's next (lane 0 adds one, the warp reads its answer), gridDim.x on from it (the
        first gridDim.x tiles are the CTAs' first). Every CTA's fetches together number the
        tiles, one failing fetch each included, so the fetch that reads total - 1 is the
        launch's last: it puts the counter back to zero for the next launch on the stream."""
        nxt = t + step
        if cutlass.const_expr(self.dynamic):
            old = cutlass.Int32(0)
            if cute.arch.lane_idx() == 0:
                old = cute.arch.atomic_add(mTileCounter.iterator, cutlass.Int32(1),
                                           sem="relaxed", scope="gpu")
                if old == total - 1:
                    cute.arch.store(mTileCounter.iterator, cutlass.Int32(0), sem="relaxed",
                                    scope="gpu")
            nxt = cute.arch.shuffle_sync(old, 0) + step
        return nxt

    @cute.jit
    def _store_tma(self, thr: ThreadWgmma, storage, sQ, tma_atom_O, tma_O, mLSE, tile,
                   seqlen: SeqlenInfo, query0, write_lse, ctidx):
        """The epilogue of a dense call: normalise O, stmatrix it into sQ's bytes (the TMA
        layout), and one warp stores the tile with one TMA command, which leaves out the rows
        past seqlen_q and the columns past head_dim; then LSE, one lane per row. A persistent
        kernel passes sO as sQ (its own tile) and waits for the previous tile's store to have
        read it instead of for its own."""
        cfg = self.cfg
        lse = epilogue.finalize(thr)
        dtype = cutlass_dtype(cfg.dtype)
        rO = cute.make_fragment_like(thr.acc_O, dtype)
        rO.store(thr.acc_O.load().to(dtype))
        if cutlass.const_expr(self.persistent):
            if ctidx < 32:
                cute.arch.cp_async_bulk_wait_group(0, read=True)
        self._consumer_sync()  # every consumer's wgmmas are done reading Q
        r2s = wgmma.stmatrix_copy_c(cfg, thr.tiled_mma)
        thr_r2s = r2s.get_slice(ctidx)
        cute.copy(r2s, thr_r2s.retile(rO), thr_r2s.partition_D(sQ))
        cute.arch.fence_view_async_shared()  # the generic-proxy writes, visible to TMA
        self._consumer_sync()
        if ctidx < 32:
            buf = storage.sO if cutlass.const_expr(self.persistent) else storage.sQ
            sO_tma = buf.get_tensor(tma.tma_smem_layout(cfg, "Q"))
            gO = cute.local_tile(tma_entry_rows(tma_O, tile.batch, self._q_head(tile), None),
                                 (cfg.block_m, cfg.head_dim_padded), (tile.m_block, 0))
            tOsO, tOgO = cpasync.tma_partition(tma_atom_O, 0, cute.make_layout(1),
                                               cute.group_modes(sO_tma, 0, 2),
                                               cute.group_modes(gO, 0, 2))
            cute.copy(tma_atom_O, tOsO, tOgO)
            cute.arch.cp_async_bulk_commit_group()
            if cutlass.const_expr(not self.persistent):
                cute.arch.cp_async_bulk_wait_group(0, read=True)  # smem stays until read
        lse_rows = seqlen
        if cutlass.const_expr(self.group > 1):  # the tile's rows (`packed_lse`), of a dense Q
            lse_rows = SeqlenInfo(self.rows.count(seqlen.seqlen_q), seqlen.seqlen_k)
        epilogue.store_rows_LSE(thr, lse, mLSE, tile.batch, self._q_head(tile), lse_rows,
                                query0, write_lse, ctidx)

    def _consumer_sync(self):
        cute.arch.barrier(barrier_id=EPILOGUE_BARRIER,
                          number_of_threads=self.roles.consumer_threads)

    @cute.jit
    def _produce(self, storage, tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tile,
                 seqlen: SeqlenInfo, n_block_max, n_rounds, blocks=None):
        """Warp 0: Q, then K and V of every round, each stage refilled once its consumers have
        released it. The copies elect their own lane; the mbarrier set-up sits under
        elect_one. blocks: a block-sparse tile's key block list (`KeyRange.blocks`)."""
        cfg, bars, stages = self.cfg, self.bars, self.kv_stages
        mbar = storage.mbar.data_ptr()
        tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self._tma_partitions(
            storage, stages, tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tile,
            seqlen)
        q_bytes = tma.tma_box(cfg, "Q").tile_bytes
        with cute.arch.elect_one():
            cpasync.prefetch_descriptor(tma_atom_Q)
            cpasync.prefetch_descriptor(tma_atom_K)
            cpasync.prefetch_descriptor(tma_atom_V)
            cute.arch.mbarrier_arrive_and_expect_tx(mbar + bars.q, q_bytes)
        cute.copy(tma_atom_Q, tQgQ, tQsQ, tma_bar_ptr=mbar + bars.q)
        self._load_kv(mbar, tma_atom_K, tma_atom_V, (tKsK, tKgK, tVsV, tVgV), n_block_max,
                      n_rounds, blocks=blocks)

    @cute.jit
    def _load_kv(self, mbar, tma_atom_K, tma_atom_V, kv_parts, n_block_max, n_rounds,
                 base=None, blocks=None):
        """K and V of n_rounds rounds, key blocks n_block_max - 1 down, each stage refilled once
        its consumers have released it; base: the ring's rounds before these (a persistent
        CTA's earlier tiles; None: none); blocks: a block-sparse tile's list (block j is
        blocks[j])."""
        bars, stages = self.bars, self.kv_stages
        kv_bytes = tma.tma_box(self.cfg, "K").tile_bytes
        tKsK, tKgK, tVsV, tVgV = kv_parts
        for i in range(0, n_rounds, 1):
            n_block = self.real_block(blocks, n_block_max - 1 - i)
            r = self._round(i, base)
            stage, phase = ring.ring_slot(r, stages)
            for atom, src, dst, full, empty in (
                    (tma_atom_K, tKgK, tKsK, bars.k_full, bars.k_empty),
                    (tma_atom_V, tVgV, tVsV, bars.v_full, bars.v_empty)):  # unrolled while traced
                if r >= stages:  # the consumers of round r - stages have released the stage
                    cute.arch.mbarrier_wait(mbar + empty + stage, 1 - phase)
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(mbar + full + stage, kv_bytes)
                cute.copy(atom, src[None, n_block], dst[None, stage],
                          tma_bar_ptr=mbar + full + stage)

    def _to_p(self, acc_S, rP):
        """P = S in 16 bits, into the P V operand's registers (`Sm90Key.packed_p`)."""
        if cutlass.const_expr(self.packed_p):
            convert.pack_pairs(acc_S, rP)
        else:
            rP.store(acc_S.load().to(rP.element_type))

    @staticmethod
    def _round(i, base):
        """The ring's round of a tile's round i: base + i (base None: i, the one tile's)."""
        return i if base is None else base + i

    def _slot(self, i, base):
        """(stage, phase) of a tile's round i (`_round`)."""
        return ring.ring_slot(self._round(i, base), self.kv_stages)

    # ---- the consumers ----

    @cute.jit
    def _release(self, bar):
        """One arrival per consumer warp on an "empty" barrier, once its wgmmas have read."""
        if cute.arch.lane_idx() == 0:
            cute.arch.mbarrier_arrive(bar)

    def _turn_wait(self, wg):
        """Ping-pong: wait until it is warpgroup wg's turn to issue its wgmmas."""
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=TURN_BARRIER + wg,
                              number_of_threads=2 * wgmma.WARPGROUP_THREADS)

    def _turn_pass(self, wg):
        """Ping-pong: hand the turn to the next warpgroup."""
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier_arrive(
                barrier_id=TURN_BARRIER + (wg + 1) % self.roles.consumers,
                number_of_threads=2 * wgmma.WARPGROUP_THREADS)

    def _issue_s(self, thr: ThreadWgmma, mbar, slot, wg):
        """S = Q K^T of the round in ring slot (stage, phase), issued once its K has landed and
        it is this warpgroup's turn, not waited for; returns the accumulator."""
        stage, phase = slot
        cute.arch.mbarrier_wait(mbar + self.bars.k_full + stage, phase)
        acc_S = cute.make_rmem_tensor(
            thr.tiled_mma_qk.partition_shape_C((self.cfg.block_m, self.cfg.block_n)),
            cutlass.Float32)
        self._turn_wait(wg)
        gemm(thr.tiled_mma_qk, acc_S, thr.tSrQ, thr.tSrK[None, None, None, stage], True)
        return acc_S

    def _issue_pv(self, thr: ThreadWgmma, mbar, tOrP, slot):
        """O += P V of the round in ring slot (stage, phase), issued once its V has landed, not
        waited for."""
        stage, phase = slot
        cute.arch.mbarrier_wait(mbar + self.bars.v_full + stage, phase)
        gemm(thr.tiled_mma, thr.acc_O, tOrP, thr.tOrVt[None, None, None, stage], False)

    @cute.jit
    def _mainloop(self, ctx: RoundContext, thr: ThreadWgmma, mbar, n_rounds, ctidx, base=None):
        """base: the ring's rounds before this tile's (a persistent CTA's; None: none, and the
        first turn of the ping-pong is given here)."""
        cfg, bars = self.cfg, self.bars
        wg = cute.arch.make_warp_uniform(ctidx // wgmma.WARPGROUP_THREADS)
        dtype = cutlass_dtype(cfg.dtype)
        shape_S = thr.tiled_mma_qk.partition_shape_C((cfg.block_m, cfg.block_n))
        rP = cute.make_rmem_tensor(shape_S, dtype)
        tOrP = cute.make_tensor(rP.iterator, wgmma.acc_to_a_layout(rP.layout))
        if cutlass.const_expr(self.pingpong and base is None):
            if wg == 0:  # the first turn is warpgroup 0's
                cute.arch.barrier_arrive(barrier_id=TURN_BARRIER,
                                         number_of_threads=2 * wgmma.WARPGROUP_THREADS)
        if cutlass.const_expr(self.overlap):
            # round 0: S only; its P V runs in round 1
            slot = self._slot(0, base)
            acc_S = self._issue_s(thr, mbar, slot, wg)
            self._turn_pass(wg)
            warpgroup.wait_group(0)
            self._release(mbar + bars.k_empty + slot[0])
            self._scores(ctx, acc_S, wgmma.acc_rowcol_layout, ctx.n_block_max - 1, True)
            self._to_p(acc_S, rP)
            for i in range(1, n_rounds, 1):
                slot, prev = self._slot(i, base), self._slot(i - 1, base)
                acc_S = self._issue_s(thr, mbar, slot, wg)
                self._issue_pv(thr, mbar, tOrP, prev)
                self._turn_pass(wg)
                warpgroup.wait_group(1)
                self._release(mbar + bars.k_empty + slot[0])
                scale = self._scores(ctx, acc_S, wgmma.acc_rowcol_layout,
                                     ctx.n_block_max - 1 - i, self._masked_round(ctx, i))
                warpgroup.wait_group(0)
                self._release(mbar + bars.v_empty + prev[0])
                thr.softmax.rescale_O(thr.acc_O_mn, scale)
                self._to_p(acc_S, rP)
            last = self._slot(n_rounds - 1, base)
            self._issue_pv(thr, mbar, tOrP, last)
            warpgroup.wait_group(0)
            self._release(mbar + bars.v_empty + last[0])
        else:
            for i in range(0, n_rounds, 1):
                slot = self._slot(i, base)
                acc_S = self._issue_s(thr, mbar, slot, wg)
                self._turn_pass(wg)
                warpgroup.wait_group(0)
                self._release(mbar + bars.k_empty + slot[0])
                scale = self._scores(ctx, acc_S, wgmma.acc_rowcol_layout,
                                     ctx.n_block_max - 1 - i, self._masked_round(ctx, i))
                thr.softmax.rescale_O(thr.acc_O_mn, scale)
                self._to_p(acc_S, rP)
                self._issue_pv(thr, mbar, tOrP, slot)
                warpgroup.wait_group(0)
                self._release(mbar + bars.v_empty + slot[0])
