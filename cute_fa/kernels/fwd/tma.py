"""The TMA forward kernel (sm90, sm120): TMA + mbarrier loads feeding ldmatrix + mma.sync m16n8k16.

The same FlashAttention-2 split-Q schedule, MMA, softmax, mask and epilogue as
`sm80`; what changes is how tiles reach shared memory. One lane issues a
whole tile per command (cp.async.bulk.tensor through a tensor map), the copy
engine signals an mbarrier when the bytes have landed, and no thread spends
registers or instructions on addresses or predicates: tails and head_dim
padding come back as zeros from TMA's out-of-bounds fill.

K and V stream through a ring of `kv_stages` buffers, each with its own
mbarriers for K and for V (landed) and an "empty" one (read by every thread; see
`cute_fa.layouts.ring.ring_slot`). Per round i, on key block n (walked from the
last one down):

    wait K[stage] ............... V of this round is still landing
    S = Q @ K^T, mask, online softmax (lazy rescale optional)
    wait V[stage]
    O += P @ V
    arrive empty[stage]; warp 0 waits for it and refills the stage with the K
    and V of round i + kv_stages

so a tile has kv_stages - 1 whole rounds to land, V's wait comes after the
softmax (V keeps landing while Q @ K^T and the softmax run), and no round ends in a
CTA-wide barrier (the round itself is `base.FlashFwdBase`'s; the waits, the GEMMs' stage
views and the refill are this file's hooks):
only warp 0 waits for the slowest warp, the others run ahead into the next
stage.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass.cute.nvgpu import cpasync

from dataclasses import dataclass
from typing import Optional

from ...compile.keys import TmaKey
from ...layouts import ring, smem, tma
from ..sched.seqlen import SeqlenInfo
from ..sched.tile_scheduler import PersistentTileScheduler
from .base import FlashFwdBase, RoundContext, RoundSlot
from ..common.gemm import gemm_ldmatrix
from ..common.softmax import score_scales
from ..common.thread_mma import thread_mma

# log2 units: O is rescaled once the pending factor would drop below 2^-8 (softmax.py says why
# that is safe)
LAZY_RESCALE_THRESHOLD = 8.0


@dataclass(frozen=True)
class TmaLoads:
    """The TMA side of a round: the K and V copy atoms and partitions (gmem source, smem ring
    destination), the ring's mbarriers (K landed, V landed, stage empty) and a tile's bytes."""

    tma_atom_K: object
    tKgK: object
    tKsK: object
    bar_K: object
    tma_atom_V: object
    tVgV: object
    tVsV: object
    bar_V: object
    bar_E: object
    tile_bytes: int
    base: object = None
    next_tile: object = None  # a persistent CTA's: a function giving its NextTileLoads


@dataclass(frozen=True)
class NextTileLoads:
    """A persistent CTA's next tile as its ring's refills see it: K's and V's TMA partitions of
    its batch entry and K/V head, the key block its rounds start below, and its round count
    (0 where there is no next tile)."""

    tKgK: object
    tVgV: object
    n_block_max: object
    n_rounds: object


class FlashFwdTma(FlashFwdBase):
    def __init__(self, key: TmaKey):
        if key.kv_stages < 1:
            raise ValueError(f"kv_stages must be at least 1, got {key.kv_stages}")
        super().__init__(key)
        self.kv_stages = key.kv_stages
        self.s_gemm_fine = key.s_gemm_fine
        self.s_gemm_python_unrolled = key.s_gemm_python_unrolled
        self.lazy_threshold = LAZY_RESCALE_THRESHOLD if key.lazy_rescale else None
        self.persistent = key.persistent
        if key.persistent:
            self.tiles = PersistentTileScheduler(key.tile.block_m, key.causal, key.lpt,
                                                 key.persistent)

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, softmax_scale: cutlass.Float32, causal_offset: Optional[cutlass.Int32],
                 write_lse: cutlass.Int32, window_left: Optional[cutlass.Int32],
                 window_right: Optional[cutlass.Int32], softcap: Optional[cutlass.Float32],
                 mCuSeqlensQ: Optional[cute.Tensor], mCuSeqlensK: Optional[cute.Tensor],
                 max_seqlen_q: Optional[cutlass.Int32], score_tensors: Optional[tuple],
                 mTileOrder: Optional[cute.Tensor], stream):
        """The optional arguments are those the key asks for (`compile.registry`), None
        elsewhere."""
        cfg = self.cfg
        tma_atom_Q, tma_Q = tma.tma_load(cfg, "Q", tma.tma_view(mQ))
        tma_atom_K, tma_K = tma.tma_load(cfg, "K", tma.tma_view(mK))
        tma_atom_V, tma_V = tma.tma_load(cfg, "V", tma.tma_view(mV))
        sQ_layout = smem.smem_layout_q(cfg)
        sKV_layout = smem.smem_layout_kv(cfg, self.kv_stages)
        Storage = smem.shared_storage(cfg, self.kv_stages)
        scale_log2, pre_scale = score_scales(self.softcap, softmax_scale, softcap,
                                             self.score_mod)
        if cutlass.const_expr(self.persistent):
            grid = self.tiles.grid(mQ.shape[1], mQ.shape[2], mQ.shape[0])
        else:
            grid = self._grid(mQ, mCuSeqlensQ, max_seqlen_q)
        self._launch(self.kernel(tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, mO,
                                 mLSE, scale_log2, causal_offset, write_lse,
                                 sQ_layout, sKV_layout, Storage, mCuSeqlensQ, mCuSeqlensK,
                                 window_left, window_right,
                                 pre_scale, score_tensors, mTileOrder),
                     grid, Storage, stream)

    @cute.kernel
    def kernel(self, tma_atom_Q: cute.CopyAtom, tma_Q: cute.Tensor, tma_atom_K: cute.CopyAtom,
               tma_K: cute.Tensor, tma_atom_V: cute.CopyAtom, tma_V: cute.Tensor,
               mO: cute.Tensor, mLSE: cute.Tensor, scale_log2: cutlass.Float32,
               causal_offset: Optional[cutlass.Int32], write_lse: cutlass.Int32,
               sQ_layout: cute.ComposedLayout, sKV_layout: cute.ComposedLayout,
               Storage: cutlass.Constexpr, mCuSeqlensQ: Optional[cute.Tensor],
               mCuSeqlensK: Optional[cute.Tensor], window_left: Optional[cutlass.Int32],
               window_right: Optional[cutlass.Int32], pre_scale: Optional[cutlass.Float32],
               score_tensors: Optional[tuple], mTileOrder: Optional[cute.Tensor]):
        if cutlass.const_expr(self.persistent):
            self._persistent(tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, mO, mLSE,
                             scale_log2, causal_offset, write_lse, sQ_layout, sKV_layout,
                             Storage, window_left, window_right, pre_scale, score_tensors)
        else:
            self._single(tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, mO, mLSE,
                         scale_log2, causal_offset, write_lse, sQ_layout, sKV_layout, Storage,
                         mCuSeqlensQ, mCuSeqlensK, window_left, window_right, pre_scale,
                         score_tensors, mTileOrder)

    @cute.jit
    def _single(self, tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, mO, mLSE,
                scale_log2, causal_offset, write_lse, sQ_layout, sKV_layout, Storage,
                mCuSeqlensQ, mCuSeqlensK, window_left, window_right, pre_scale, score_tensors,
                mTileOrder=None):
        """One CTA, one tile (`SingleTileScheduler`)."""
        cfg = self.cfg
        stages = self.kv_stages
        tidx, _, _ = cute.arch.thread_idx()
        tile, seqlen, keys = self._tma_work(tma_Q, tma_K, causal_offset, mCuSeqlensQ,
                                            mCuSeqlensK, window_left, window_right,
                                            score_tensors, mTileOrder)
        n_block_max = keys.n_block_max
        n_rounds = self._n_rounds(n_block_max, keys.n_block_min)

        storage = cutlass.memory.SmemAllocator().allocate(Storage)
        sQ, sK, _, sVt = smem.qkv_tensors(storage, sQ_layout, sKV_layout, cfg, stages)
        bars = ring.RingBarriers(stages)
        bar_Q, bar_K, bar_V, bar_E = bars.addresses(storage.mbar.data_ptr())

        tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self._tma_partitions(
            storage, stages, tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tile,
            seqlen)
        box_Q, box_KV = tma.tma_box(cfg, "Q"), tma.tma_box(cfg, "K")
        loads = TmaLoads(tma_atom_K, tKgK, tKsK, bar_K, tma_atom_V, tVgV, tVsV, bar_V, bar_E,
                         box_KV.tile_bytes)

        # warp 0 issues every TMA command: a warp-uniform branch, which keeps ptxas from
        # spilling around it (a plain tidx == 0 branch in the main loop cost kilobytes of
        # spills). The TMA copy elects its own lane (elect.sync needs the whole warp), so
        # only the mbarrier set-up sits under elect_one.
        warp0 = cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 0
        if warp0:
            with cute.arch.elect_one():
                self._init_ring(bars, bar_Q, bar_E)
        cute.arch.barrier()

        if warp0:
            with cute.arch.elect_one():
                cpasync.prefetch_descriptor(tma_atom_Q)
                cpasync.prefetch_descriptor(tma_atom_K)
                cpasync.prefetch_descriptor(tma_atom_V)
                cute.arch.mbarrier_arrive_and_expect_tx(bar_Q, box_Q.tile_bytes)
            cute.copy(tma_atom_Q, tQgQ, tQsQ, tma_bar_ptr=bar_Q)
            for i in cutlass.range_constexpr(stages):
                if i < n_rounds:
                    self._load_kv(loads, i, self.real_block(keys.blocks, n_block_max - 1 - i))

        thr = thread_mma(cfg, tidx, sQ, sK, sVt, sK[None, None, 0], sVt[None, None, 0],
                         scale_log2, self.lazy_threshold)

        # Q has landed before anyone reads it; also before the epilogue reuses its
        # buffer for O, so that no TMA write can land on top of O
        cute.arch.mbarrier_wait(bar_Q, 0)

        ctx = self._context(thr, tile.m_block, seqlen, keys, loads, pre_scale=pre_scale,
                            tile=tile, score_tensors=score_tensors)
        self.run_rounds(ctx)
        self.write_epilogue(ctx, sQ, mO, mLSE, tile, write_lse, tidx)

    @cute.jit
    def _persistent(self, tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, mO, mLSE,
                    scale_log2, causal_offset, write_lse, sQ_layout, sKV_layout, Storage,
                    window_left, window_right, pre_scale, score_tensors):
        """A persistent CTA (`PersistentTileScheduler`): tiles blockIdx.x, blockIdx.x +
        gridDim.x, ... The ring's round count runs on across tiles, and a tile's refills past
        its own last round load the next tile's first key blocks into the stages it frees,
        so that they land under this tile's last rounds and epilogue. Q's buffer holds O in
        the epilogue, so the next Q is loaded behind it (one CTA barrier per tile); the
        other CTAs on the SM run meanwhile."""
        cfg = self.cfg
        stages = self.kv_stages
        tidx, _, _ = cute.arch.thread_idx()
        seqlen = SeqlenInfo(self._tma_seqlen_q(tma_Q), tma_K.shape[0])
        heads_q, heads_kv = tma_Q.shape[2], tma_K.shape[2]
        total = self.tiles.tiles(seqlen.seqlen_q, heads_q, tma_Q.shape[3])
        step = cute.arch.grid_dim()[0]

        storage = cutlass.memory.SmemAllocator().allocate(Storage)
        sQ, sK, _, sVt = smem.qkv_tensors(storage, sQ_layout, sKV_layout, cfg, stages)
        bars = ring.RingBarriers(stages)
        bar_Q, bar_K, bar_V, bar_E = bars.addresses(storage.mbar.data_ptr())
        box_Q, box_KV = tma.tma_box(cfg, "Q"), tma.tma_box(cfg, "K")

        warp0 = cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 0
        if warp0:
            with cute.arch.elect_one():
                self._init_ring(bars, bar_Q, bar_E)
                cpasync.prefetch_descriptor(tma_atom_Q)
                cpasync.prefetch_descriptor(tma_atom_K)
                cpasync.prefetch_descriptor(tma_atom_V)
        cute.arch.barrier()

        rounds = cutlass.Int32(0)  # the ring's rounds before this tile's
        done = cutlass.Int32(0)  # tiles before this one (Q's barrier phase)
        n_prev = cutlass.Int32(0)  # the previous tile's rounds
        t = cute.arch.block_idx()[0]
        while t < total:
            tile = self.tiles.tile(t, seqlen.seqlen_q, heads_q, heads_kv)
            keys = self._key_range(tile, seqlen, causal_offset, window_left, window_right)
            n_rounds = self._n_rounds(keys.n_block_max, keys.n_block_min)
            tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self._tma_partitions(
                storage, stages, tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tile,
                seqlen)

            def next_tile(t_next=t + step):
                # traced where a refill runs past the tile (warp 0, the last rounds): nothing
                # of the next tile stays live in registers through the others
                following = self.tiles.tile(t_next, seqlen.seqlen_q, heads_q, heads_kv)
                following_keys = self._key_range(following, seqlen, causal_offset,
                                                  window_left, window_right)
                parts = self._tma_partitions(storage, stages, tma_atom_Q, tma_Q, tma_atom_K,
                                             tma_K, tma_atom_V, tma_V, following, seqlen)
                n_rounds_next = cutlass.select_(
                    t_next < total, self._n_rounds(following_keys.n_block_max,
                                                   following_keys.n_block_min), 0)
                return NextTileLoads(parts[3], parts[5], following_keys.n_block_max,
                                     n_rounds_next)

            loads = TmaLoads(tma_atom_K, tKgK, tKsK, bar_K, tma_atom_V, tVgV, tVsV, bar_V, bar_E,
                             box_KV.tile_bytes, rounds, next_tile)
            if warp0:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(bar_Q, box_Q.tile_bytes)
                cute.copy(tma_atom_Q, tQgQ, tQsQ, tma_bar_ptr=bar_Q)
                # the previous tile's last rounds loaded this one's rounds from
                # stages - n_prev on
                for i in cutlass.range_constexpr(stages):
                    if (i < n_rounds) & (i < stages - n_prev):
                        self._load_kv(loads, i, keys.n_block_max - 1 - i)

            thr = thread_mma(cfg, tidx, sQ, sK, sVt, sK[None, None, 0], sVt[None, None, 0],
                             scale_log2, self.lazy_threshold)
            cute.arch.mbarrier_wait(bar_Q, done % 2)
            ctx = self._context(thr, tile.m_block, seqlen, keys, loads,
                                pre_scale=pre_scale, tile=tile, score_tensors=score_tensors)
            self.run_rounds(ctx)
            self.write_epilogue(ctx, sQ, mO, mLSE, tile, write_lse, tidx)
            # every thread's reads and writes of sQ (O, generic proxy) come before the next
            # Q's TMA writes there (async proxy)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier()
            rounds += n_rounds
            done += 1
            n_prev = n_rounds
            t += step

    @cute.jit
    def _init_ring(self, bars: cutlass.Constexpr, bar_Q, bar_E):
        """The mbarriers' counts, by one elected thread, then the fence that makes them
        visible: Q, K and V full: one arrival each (the expect_tx); a stage's empty: every
        thread."""
        for i in cutlass.range_constexpr(bars.empty):
            cute.arch.mbarrier_init(bar_Q + i, 1)
        for i in cutlass.range_constexpr(self.kv_stages):
            cute.arch.mbarrier_init(bar_E + i, self.cfg.num_threads)
        cute.arch.mbarrier_init_fence()

    @cute.jit
    def _load_kv(self, ld: TmaLoads, round_index, n_block, tKgK=None, tVgV=None):
        """Warp 0: start the K and V tiles of key block n_block into the stage of the tile's
        round round_index (the ring's round ld.base + round_index where a persistent CTA
        counts on); tKgK/tVgV: another tile's partitions (the next one's), else ld's."""
        round_index = ring.ring_round(round_index, ld.base)
        if cutlass.const_expr(tKgK is None):
            tKgK, tVgV = ld.tKgK, ld.tVgV
        stage, _ = ring.ring_slot(round_index, self.kv_stages)
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(ld.bar_K + stage, ld.tile_bytes)
            cute.arch.mbarrier_arrive_and_expect_tx(ld.bar_V + stage, ld.tile_bytes)
        cute.copy(ld.tma_atom_K, tKgK[None, n_block], ld.tKsK[None, stage],
                  tma_bar_ptr=ld.bar_K + stage)
        cute.copy(ld.tma_atom_V, tVgV[None, n_block], ld.tVsV[None, stage],
                  tma_bar_ptr=ld.bar_V + stage)

    # ---- the round's hooks (base.FlashFwdBase.run_round) ----

    def round_slot(self, ctx: RoundContext, i) -> RoundSlot:
        n_block = ctx.n_block_max - 1 - i
        stage, phase = ring.ring_slot(ring.ring_round(i, ctx.loads.base), self.kv_stages)
        return RoundSlot(i, n_block, stage, phase)

    def before_s(self, ctx: RoundContext, slot: RoundSlot, masked):
        cute.arch.mbarrier_wait(ctx.loads.bar_K + slot.stage, slot.phase)

    def gemm_s(self, ctx: RoundContext, slot: RoundSlot, acc_S):
        thr = ctx.thr
        # how the k-loop loads and unrolls is the key's (tuning picks the spill-free choice)
        gemm_ldmatrix(thr.tiled_mma, acc_S, thr.tSrQ, thr.tSrK, thr.s2r_k,
                      thr.ldsm["tSsK"][None, None, None, slot.stage], thr.ldsm["tSrK_view"],
                      thr.s2r_q, thr.ldsm["tSsQ"], thr.ldsm["tSrQ_view"],
                      fine=self.s_gemm_fine, python_unrolled=self.s_gemm_python_unrolled)

    def before_pv(self, ctx: RoundContext, slot: RoundSlot):
        cute.arch.mbarrier_wait(ctx.loads.bar_V + slot.stage, slot.phase)

    def gemm_o(self, ctx: RoundContext, slot: RoundSlot, tOrP):
        thr = ctx.thr
        gemm_ldmatrix(thr.tiled_mma, thr.acc_O, tOrP, thr.tOrVt, thr.s2r_v,
                      thr.ldsm["tOsVt"][None, None, None, slot.stage], thr.ldsm["tOrVt_view"])

    @cute.jit
    def after_round(self, ctx: RoundContext, slot: RoundSlot):
        """This thread is done with the stage; once every thread is, warp 0 refills it."""
        cute.arch.mbarrier_arrive(ctx.loads.bar_E + slot.stage)
        if cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 0:
            if slot.i + self.kv_stages < self._n_rounds(ctx.n_block_max, ctx.n_block_min):
                cute.arch.mbarrier_wait(ctx.loads.bar_E + slot.stage, slot.phase)
                self._load_kv(ctx.loads, slot.i + self.kv_stages,
                              self.real_block(ctx.blocks, slot.n_block - self.kv_stages))
            if cutlass.const_expr(ctx.loads.next_tile is not None):
                # past this tile's rounds: the next tile's round j, into the same stage
                j = slot.i + self.kv_stages - self._n_rounds(ctx.n_block_max, ctx.n_block_min)
                if j >= 0:
                    nxt = ctx.loads.next_tile()
                    if j < nxt.n_rounds:
                        cute.arch.mbarrier_wait(ctx.loads.bar_E + slot.stage, slot.phase)
                        self._load_kv(ctx.loads, slot.i + self.kv_stages,
                                      nxt.n_block_max - 1 - j, nxt.tKgK, nxt.tVgV)
