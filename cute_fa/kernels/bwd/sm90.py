"""The Hopper backward kernel (sm90): a TMA producer, a row loader and wgmma consumers.

One CTA owns block_n keys of one K/V head of one batch entry, 64 per consumer warpgroup; dK
and dV accumulate in registers over every query block of every query head of the K/V head's
group (GQA/MQA: summed here, no repeated K/V). The products and where their operands live are
`layouts.bwd_wgmma`'s: the scores are computed transposed (S^T = K Q^T, keys on wgmma's M), so
P^T and dS^T are already the register A operands of dV and dK.

Roles: warpgroup 0 is the producer. Its warp 0 loads K and V once and Q and dO of each query
block into a ring of q_stages stages (TMA); its warp 1 loads the block's LSE (log2 units) and
D = rowsum(dO * O) rows into shared memory, +inf and 0 past the entry's queries, so those
rows weigh nothing (a ragged batch's tile runs into the next entry's rows: its Q and dO are
read, and the +inf LSE zeroes them). Under dq_writer (`WgmmaBwdTileConfig.dq_writer`) warp 2
adds each query block's dQ, which the consumers leave in shared memory, into dQaccum (one bulk
reduction); the other warps only hand their registers to the consumers (setmaxnreg). The roles
meet at mbarriers (`layouts.bwd_wgmma.QBarriers`).

A consumer warpgroup's query block, in issue order:

    wait Q;  S^T  = K Q^T            SS-wgmma, issued
    wait dO; dP^T = V dO^T           SS-wgmma, issued behind it
    wait S^T: softcap, mask, P^T = exp2(S^T * scale_log2 - LSE)
    dV += P^T dO                     RS-wgmma, issued (runs under dS's arithmetic)
    wait dP^T: dS^T = P^T (dP^T - D) (times 1 - tanh^2 under a softcap)
    dS^T -> shared memory (stmatrix); under dv_after_ds dV is issued only here
    dK += dS^T Q                     RS-wgmma, issued
    consumers' barrier (all of dS written); dQ = dS K   SS-wgmma, issued
    wait all; release the stage; dQ -> float32 reductions into dQaccum (under dq_writer:
    dQ -> shared memory, for the writer warp)

dq_before_dk (`WgmmaBwdTileConfig.dq_before_dk`) issues dK after dQ instead (the barrier
first), hands dQ over while dK runs and releases the stage once dK is done.
dv_after_ds (`WgmmaBwdTileConfig.dv_after_ds`) holds dV back until dS is stored: fewer wgmma
operands in flight while dS is formed, which keeps ptxas from serializing the tiles of 128 or
80 queries. Where block_m is not a multiple of 64 (80: `WgmmaBwdTileConfig.dq_transposed`) dQ's
queries cannot sit on wgmma's M; the consumers then compute dQ^T = K^T dS^T, d on M, and add
its sums in that product's register order (the postprocess reads them back by it).

Under split_d (head_dim past 128, `WgmmaBwdTileConfig.split_d`) each warpgroup computes S^T
and dP^T for its half of the queries and dV, dK, dQ for its half of d: P^T goes to shared
memory (stmatrix) and the consumers meet before dV, as before dQ, since dV's and dK's sums
over the queries read both halves (SS-wgmma from sP and sdS).

deterministic: as the sm80 kernel (`base.FlashBwdBase._turn`), one CTA at a time per query
block's dQ sums, in key-block order, passing the turn on a counter: the consumers wait for it,
or under dq_writer the writer warp does, while the consumers run on (one block ahead).

persistent (`BwdSm90Key.persistent`, `persistent.py`): fewer CTAs, each walking key-block
tiles at a fixed stride, the next tile's Q and dO loads under this one's last query blocks.

kv_accum (a K/V group's query heads split over head_splits CTAs, so that a small batch of few
K/V heads still fills the GPU and a causal grid's long key blocks are cut down): each CTA
visits its share of the group and adds its dK and dV into float32 sums, as dQ's, which the
second postprocess converts. deterministic too: the shares of a key block add in turn, on a
counter per key block.
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass.cute.nvgpu import cpasync, warpgroup

from ...layouts import bwd as bwd_layouts, bwd_wgmma, ring, smem, tma, wgmma
from ...layouts._types import cutlass_dtype
from ..common import bulk, epilogue, mask, mods
from ..common.launch import occupancy_options
from ..common.softmax import score_scales
from ..common.thread_mma import tile_place
from ..common.thread_wgmma import gemm
from ..sched.block_info import list_entry
from ..sched.seqlen import SeqlenInfo, tma_entry_rows
from .base import FlashBwdBase, Grads, QueryBlocks
from .persistent import PersistentTiles

CONSUMER_BARRIER = 1  # named barrier of the consumer warpgroups (0 is the CTA's)


class FlashBwdSm90(PersistentTiles, FlashBwdBase):
    """Built from a `compile.keys.BwdSm90Key`."""

    def __init__(self, key):
        super().__init__(key)
        self.persistent = key.persistent
        self.bars = bwd_wgmma.QBarriers(self.cfg.q_stages, self.cfg.dq_writer,
                                        bool(key.persistent))
        self.roles = wgmma.WarpRoles(self.cfg.consumers, self.cfg.ctas_per_sm)
        # the tile's CTAs per SM (the key carries none) for ptxas (.minnctapersm): where it is
        # two, and for the split-d tile of 64-byte atoms (head_dim 192), where ptxas cannot
        # tell the register count at entry without it (C7508: setmaxnreg ignored, 580 bytes
        # spilled); the other tiles leave it to ptxas, as measured
        told = self.cfg.ctas_per_sm > 1 or self.cfg.atom_cols == 32
        self.ctas_per_sm = self.cfg.ctas_per_sm if told else 0
        self.kv_accum = key.kv_accum

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mD: cute.Tensor, mdQaccum: cute.Tensor, mdK: cute.Tensor,
                 mdV: cute.Tensor, softmax_scale: cutlass.Float32,
                 causal_offset: Optional[cutlass.Int32], window_left: Optional[cutlass.Int32],
                 window_right: Optional[cutlass.Int32], softcap: Optional[cutlass.Float32],
                 mCuSeqlensQ: Optional[cute.Tensor], mCuSeqlensK: Optional[cute.Tensor],
                 max_seqlen_k: Optional[cutlass.Int32], mSemaphore: Optional[cute.Tensor],
                 score_tensors: Optional[tuple], mdKaccum: Optional[cute.Tensor],
                 mdVaccum: Optional[cute.Tensor], head_splits: Optional[cutlass.Int32],
                 mKvSemaphore: Optional[cute.Tensor], stream):
        """The optional arguments are those the key asks for (`compile.registry`), None
        elsewhere (score_tensors: the mods' captured tensors, a block mask's query tile lists
        (`QueryBlocks.lists`), the captured tensors' gradients (`_capture_grads`))."""
        cfg = self.cfg
        q_tile = (cfg.block_m, cfg.head_dim_padded)
        kv_tile = (cfg.block_n, cfg.head_dim_padded)
        load = cpasync.CopyBulkTensorTileG2SOp()
        layout_q = tma.tma_smem_layout(cfg, "Q")
        layout_kv = tma.tma_smem_layout(cfg, "K")
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(load, tma.tma_view(mQ), layout_q, q_tile)
        tma_atom_dO, tma_dO = cpasync.make_tiled_tma_atom(load, tma.tma_view(mdO), layout_q,
                                                          q_tile)
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(load, tma.tma_view(mK), layout_kv,
                                                        kv_tile)
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(load, tma.tma_view(mV), layout_kv,
                                                        kv_tile)
        Storage = bwd_wgmma.shared_storage(cfg, self.bars.count)
        scale_log2, softcap_scale = score_scales(self.softcap, softmax_scale, softcap,
                                                 self.score_mod)
        keys = max_seqlen_k if cutlass.const_expr(self.varlen_k) else mK.shape[1]
        heads = mK.shape[2] * head_splits if cutlass.const_expr(self.kv_accum) else mK.shape[2]
        if cutlass.const_expr(self.persistent):
            tiles = cute.ceil_div(keys, cfg.block_n) * heads * mQ.shape[0]
            grid = (cutlass.max(cutlass.min(tiles, self.persistent), 1), 1, 1)
        else:
            grid = (cute.ceil_div(keys, cfg.block_n), cute.size(heads),
                    cute.size(mCuSeqlensQ.shape[0] - 1 if cutlass.const_expr(self.varlen_q)
                              else mQ.shape[0]))
        self.kernel(tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K, tma_atom_V,
                    tma_V, mLSE, mD, mdQaccum, mdK, mdV, scale_log2, softmax_scale,
                    causal_offset, Storage, mCuSeqlensQ, mCuSeqlensK, window_left,
                    window_right, softcap_scale, mSemaphore, mdKaccum, mdVaccum,
                    head_splits, mKvSemaphore, score_tensors).launch(
            grid=grid, block=(self.roles.threads, 1, 1),
            smem=Storage.size_in_bytes(), stream=stream, **occupancy_options(self.ctas_per_sm))

    @cute.kernel
    def kernel(self, tma_atom_Q: cute.CopyAtom, tma_Q: cute.Tensor, tma_atom_dO: cute.CopyAtom,
               tma_dO: cute.Tensor, tma_atom_K: cute.CopyAtom, tma_K: cute.Tensor,
               tma_atom_V: cute.CopyAtom, tma_V: cute.Tensor, mLSE: cute.Tensor,
               mD: cute.Tensor, mdQaccum: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
               scale_log2: cutlass.Float32, softmax_scale: cutlass.Float32,
               causal_offset: Optional[cutlass.Int32], Storage: cutlass.Constexpr,
               mCuSeqlensQ: Optional[cute.Tensor], mCuSeqlensK: Optional[cute.Tensor],
               window_left: Optional[cutlass.Int32], window_right: Optional[cutlass.Int32],
               softcap_scale: Optional[cutlass.Float32], mSemaphore: Optional[cute.Tensor],
               mdKaccum: Optional[cute.Tensor], mdVaccum: Optional[cute.Tensor],
               head_splits: Optional[cutlass.Int32], mKvSemaphore: Optional[cute.Tensor],
               score_tensors: Optional[tuple]):
        if cutlass.const_expr(self.persistent):
            self._persistent(tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K,
                             tma_atom_V, tma_V, mLSE, mD, mdQaccum, mdK, mdV, scale_log2,
                             softmax_scale, causal_offset, Storage, window_left, window_right,
                             softcap_scale, score_tensors)
        else:
            self._single(tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K, tma_atom_V,
                         tma_V, mLSE, mD, mdQaccum, mdK, mdV, scale_log2, softmax_scale,
                         causal_offset, Storage, mCuSeqlensQ, mCuSeqlensK, window_left,
                         window_right, softcap_scale, mSemaphore, mdKaccum, mdVaccum,
                         head_splits, mKvSemaphore, score_tensors)

    @cute.jit
    def _init_barriers(self, mbar, warp):
        """Warp 0 initializes every mbarrier (`layouts.bwd_wgmma.QBarriers`)."""
        cfg, bars = self.cfg, self.bars
        if warp == 0:
            with cute.arch.elect_one():
                for i in cutlass.range_constexpr(bars.rows_full):  # K/V, Q and dO full
                    cute.arch.mbarrier_init(mbar + i, 1)
                for i in cutlass.range_constexpr(bars.rows_full, bars.empty):
                    cute.arch.mbarrier_init(mbar + i, 32)  # the row loader's lanes
                for i in cutlass.range_constexpr(bars.empty, bars.empty + cfg.q_stages):
                    cute.arch.mbarrier_init(mbar + i, self._empty_arrivals())
                if cutlass.const_expr(cfg.dq_writer):
                    cute.arch.mbarrier_init(mbar + bars.dq_full, cfg.num_threads)
                    cute.arch.mbarrier_init(mbar + bars.dq_empty, 1)
                if cutlass.const_expr(self.persistent):
                    cute.arch.mbarrier_init(mbar + bars.kv_empty, cfg.num_threads)
                cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

    @cute.jit
    def _single(self, tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K, tma_atom_V,
                tma_V, mLSE, mD, mdQaccum, mdK, mdV, scale_log2, softmax_scale, causal_offset,
                Storage, mCuSeqlensQ, mCuSeqlensK, window_left, window_right, softcap_scale,
                mSemaphore, mdKaccum, mdVaccum, head_splits, mKvSemaphore, score_tensors):
        """One CTA, one key block (the grid's x), K/V head (y; under kv_accum with its share)
        and batch entry (z)."""
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        work = self._work(tma_Q, tma_K, 0, 2, causal_offset, mCuSeqlensQ, mCuSeqlensK,
                          head_splits)
        n_block, head_kv, batch, seqlen = work.n_block, work.head_kv, work.batch, work.seqlen
        head0 = work.head0

        storage = cutlass.memory.SmemAllocator().allocate(Storage)
        self._init_barriers(storage.mbar.data_ptr(), warp)

        # a ragged batch's short entries have fewer key blocks than the grid
        if n_block * cfg.block_n < seqlen.seqlen_k:
            blocks, per_head, steps = self._visits(work, window_left, window_right,
                                                   score_tensors)
            if warp < 4:
                cute.arch.setmaxregister_decrease(self.roles.producer_regs)
                if warp == 0:
                    self._produce(storage, tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K,
                                  tma_K, tma_atom_V, tma_V, seqlen, blocks, batch, head_kv,
                                  head0, n_block, per_head, steps)
                if warp == 1:
                    self._load_rows(storage, mLSE, mD, seqlen, blocks, batch, head0,
                                    per_head, steps)
                if cutlass.const_expr(cfg.dq_writer):
                    if warp == 2:
                        self._write_dq(storage, mdQaccum, mSemaphore, seqlen, blocks, batch,
                                       head0, n_block, per_head, steps, mCuSeqlensQ)
            else:
                cute.arch.setmaxregister_increase(self.roles.consumer_regs)
                grads = Grads(mdQaccum, mdK, mdV, mdKaccum, mdVaccum, mSemaphore, mKvSemaphore)
                self._consume(storage, grads, scale_log2, softmax_scale, softcap_scale, seqlen,
                              blocks, batch, head_kv, head0, n_block, per_head, steps,
                              mCuSeqlensQ, mCuSeqlensK, tidx - wgmma.WARPGROUP_THREADS,
                              work.share, score_tensors=score_tensors)

    # ---- the producer warpgroup ----

    @cute.jit
    def _step_place(self, i, blocks: QueryBlocks, head0, per_head):
        """(query head, query block, whether its mask must run) of step i: the CTA's heads
        from head0 in turn, each over its query blocks (block_sparse: those its lists give,
        `QueryBlocks.lists`, where a block kept whole skips the mask, `list_entry`; the head
        is found by subtracting the counts of the heads before it, a few cached loads)."""
        if cutlass.const_expr(self.block_sparse):
            counts, listed, group = blocks.lists
            head = head0
            j = i
            for _ in cutlass.range(group - 1, unroll=1):
                count = counts[head]
                if j >= count:
                    j = j - count
                    head = head + 1
            m_block, needs_mask = list_entry(listed[head, j])
            return head, m_block, needs_mask
        g = i // per_head
        return head0 + g, blocks.m_lo + i - g * per_head, True

    @cute.jit
    def _wait_empty(self, mbar, i):
        """Before refilling stage i % q_stages: the consumers of step i - q_stages are done."""
        stage, phase = ring.ring_slot(i, self.cfg.q_stages)
        if i >= self.cfg.q_stages:
            cute.arch.mbarrier_wait(mbar + self.bars.empty + stage, 1 - phase)
        return stage

    @cute.jit
    def _produce(self, storage, tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K,
                 tma_atom_V, tma_V, seqlen: SeqlenInfo, blocks: QueryBlocks, batch, head_kv,
                 head0, n_block, per_head, steps):
        """Warp 0: K and V once, then Q and dO of every step, each stage refilled once its
        consumers have released it. The copies elect their own lane."""
        if steps > 0:
            self._load_kv(storage, tma_atom_K, tma_K, tma_atom_V, tma_V, seqlen, batch,
                          head_kv, n_block, (tma_atom_Q, tma_atom_dO, tma_atom_K, tma_atom_V))
            for i in cutlass.range(steps, unroll=1):
                self._load_step(storage, tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, seqlen, blocks,
                                batch, head0, per_head, i, i)

    @cute.jit
    def _load_kv(self, storage, tma_atom_K, tma_K, tma_atom_V, tma_V, seqlen: SeqlenInfo,
                 batch, head_kv, n_block, prefetch=()):
        """K and V of key block n_block onto the K/V barrier, after prefetching the
        descriptors of the atoms in `prefetch`."""
        cfg, bars = self.cfg, self.bars
        bn, dp = cfg.block_n, cfg.head_dim_padded
        mbar = storage.mbar.data_ptr()
        sK = storage.sK.get_tensor(tma.tma_smem_layout(cfg, "K"))
        sV = storage.sV.get_tensor(tma.tma_smem_layout(cfg, "K"))
        kv_bytes = bn * dp * cfg.elem_bytes
        with cute.arch.elect_one():
            for atom in prefetch:
                cpasync.prefetch_descriptor(atom)
            cute.arch.mbarrier_arrive_and_expect_tx(mbar + bars.kv, 2 * kv_bytes)
        for atom, src, dst in ((tma_atom_K, tma_K, sK), (tma_atom_V, tma_V, sV)):
            gKV = cute.local_tile(tma_entry_rows(src, batch, head_kv, seqlen.offset_k),
                                  (bn, dp), (n_block, 0))
            tKVsKV, tKVgKV = cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                                   cute.group_modes(dst, 0, 2),
                                                   cute.group_modes(gKV, 0, 2))
            cute.copy(atom, tKVgKV, tKVsKV, tma_bar_ptr=mbar + bars.kv)

    @cute.jit
    def _load_step(self, storage, tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, seqlen: SeqlenInfo,
                   blocks: QueryBlocks, batch, head0, per_head, i, ring_index):
        """Q and dO of step i into the stage of ring round ring_index (i for a one-tile CTA;
        a persistent CTA's rounds run on across its tiles), once that stage is released."""
        cfg, bars = self.cfg, self.bars
        bm, dp = cfg.block_m, cfg.head_dim_padded
        mbar = storage.mbar.data_ptr()
        sQ = storage.sQ.get_tensor(tma.tma_smem_layout(cfg, "Q", cfg.q_stages))
        sdO = storage.sdO.get_tensor(tma.tma_smem_layout(cfg, "Q", cfg.q_stages))
        q_bytes = bm * dp * cfg.elem_bytes
        head, m_block, _ = self._step_place(i, blocks, head0, per_head)
        stage = self._wait_empty(mbar, ring_index)
        for atom, src, dst, full in ((tma_atom_Q, tma_Q, sQ, bars.q_full),
                                     (tma_atom_dO, tma_dO, sdO, bars.do_full)):
            gX = cute.local_tile(tma_entry_rows(src, batch, head, seqlen.offset_q),
                                 (bm, dp), (None, 0))
            tXsX, tXgX = cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                               cute.group_modes(dst, 0, 2),
                                               cute.group_modes(gX, 0, 2))
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(mbar + full + stage, q_bytes)
            cute.copy(atom, tXgX[None, m_block], tXsX[None, stage],
                      tma_bar_ptr=mbar + full + stage)

    @cute.jit
    def _load_rows(self, storage, mLSE, mD, seqlen: SeqlenInfo, blocks: QueryBlocks, batch,
                   head0, per_head, steps, base=None):
        """Warp 1: each step's LSE and D rows into their stage, lane by lane; rows past the
        entry's queries get LSE = +inf (weights 0) and D = 0. Each lane arrives on the stage's
        barrier once its own stores are done. base: a persistent CTA's ring rounds before
        this tile (`layouts.ring.ring_round`)."""
        cfg, bars = self.cfg, self.bars
        bm = cfg.block_m
        mbar = storage.mbar.data_ptr()
        sLSE = storage.sLSE.get_tensor(cute.make_layout(bm * cfg.q_stages))
        sD = storage.sD.get_tensor(cute.make_layout(bm * cfg.q_stages))
        lane = cute.arch.lane_idx()
        for i in cutlass.range(steps, unroll=1):
            head, m_block, _ = self._step_place(i, blocks, head0, per_head)
            stage = self._wait_empty(mbar, ring.ring_round(i, base))
            lse = seqlen.lse_row(mLSE, batch, head)
            d = seqlen.lse_row(mD, batch, head)
            for r in cutlass.range_constexpr(-(-bm // 32)):
                row = m_block * bm + r * 32 + lane
                value_lse = cutlass.Float32.inf
                value_d = cutlass.Float32(0.0)
                if row < seqlen.seqlen_q:
                    value_lse = lse[row]
                    value_d = d[row]
                if cutlass.const_expr(r < bm // 32):
                    sLSE[stage * bm + r * 32 + lane] = value_lse
                    sD[stage * bm + r * 32 + lane] = value_d
                else:
                    if r * 32 + lane < bm:  # the last, partial pass of a block_m like 80
                        sLSE[stage * bm + r * 32 + lane] = value_lse
                        sD[stage * bm + r * 32 + lane] = value_d
            cute.arch.mbarrier_arrive(mbar + bars.rows_full + stage)

    @cute.jit
    def _write_dq(self, storage, mdQaccum, mSemaphore, seqlen: SeqlenInfo, blocks: QueryBlocks,
                  batch, head0, n_block, per_head, steps, mCuSeqlensQ, base=None):
        """Warp 2 under dq_writer: each step's dQ block, once every consumer thread has stored
        its share (`_stage_dq`), added into dQaccum by one bulk reduction from lane 0, which
        frees the block for the next step as soon as the reduction has read it.
        deterministic: lane 0 waits for the key block's turn first (`_turn`) and passes it on
        once the sums are written, while the consumers go on with the next query block. base:
        as `_load_rows`'."""
        cfg, bars = self.cfg, self.bars
        mbar = storage.mbar.data_ptr()
        sdQ = storage.sdQ.get_tensor(cute.make_layout(cfg.block_m * cfg.head_dim_padded))
        nbytes = cfg.block_m * cfg.head_dim_padded * 4
        if cute.arch.lane_idx() == 0:
            for i in cutlass.range(steps, unroll=1):
                head, m_block, _ = self._step_place(i, blocks, head0, per_head)
                chunk = self._dq_chunk(mdQaccum, batch, head, m_block, mCuSeqlensQ)
                cute.arch.mbarrier_wait(mbar + bars.dq_full, ring.ring_round(i, base) % 2)
                if cutlass.const_expr(self.deterministic):
                    lock = self._dq_lock(mSemaphore, batch, head, m_block)
                    self._wait_turn(lock, self._turn(m_block, n_block, blocks, seqlen), 0)
                    # the reductions (async proxy) after the acquire (generic proxy)
                    cute.arch.fence_proxy("async.global")
                bulk.reduce_add_f32(chunk.iterator, sdQ.iterator, nbytes)
                cute.arch.cp_async_bulk_commit_group()
                cute.arch.cp_async_bulk_wait_group(0, read=True)
                cute.arch.mbarrier_arrive(mbar + bars.dq_empty)
                if cutlass.const_expr(self.deterministic):
                    cute.arch.cp_async_bulk_wait_group(0)  # the sums written ...
                    cute.arch.fence_proxy("async.global")  # ... and ordered before the release
                    self._pass_turn(lock, 0)
            cute.arch.cp_async_bulk_wait_group(0)

    # ---- the consumers ----

    def _empty_arrivals(self) -> int:
        """Arrivals that free a stage: every consumer thread's (`_release`)."""
        return self.cfg.num_threads

    @cute.jit
    def _release(self, mbar, stage):
        """This thread is done with the stage (its warpgroup's wgmmas have read Q and dO, it
        has read its LSE and D rows). Each thread arrives, so that the arrive's release covers
        its own reads before the row loader rewrites those rows (one arrival per warp after
        sync_warp ran as fast, and compute-sanitizer's racecheck reports it as a race)."""
        cute.arch.mbarrier_arrive(mbar + self.bars.empty + stage)

    def _consumer_sync(self):
        cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=self.cfg.num_threads)

    def _dq_sync(self):
        """The barrier of the threads that add dQ: the consumers'."""
        self._consumer_sync()

    @cute.jit
    def _stage_dq(self, acc_dQ, sdQ_chunk, mbar, i, tid):
        """dq_writer: this thread's dQ of step i into the shared block, in dQaccum's order of
        the sums (`layouts.bwd.accum_chunk_layout`: a warp's 16-byte stores are 512
        consecutive bytes), once the writer's reduction of step i - 1 has read the block;
        then the thread's arrival on dQ full, after the fence that shows its stores to the
        bulk copy (async proxy)."""
        if i > 0:
            cute.arch.mbarrier_wait(mbar + self.bars.dq_empty, (i - 1) % 2)
        mine = cute.flatten(sdQ_chunk[None, tid])  # (vec, runs): this thread's runs of floats
        cute.autovec_copy(cute.make_tensor(acc_dQ.iterator, cute.make_layout(mine.shape)), mine)
        cute.arch.fence_view_async_shared()
        cute.arch.mbarrier_arrive(mbar + self.bars.dq_full)

    @cute.jit
    def _hand_over_dq(self, acc_dQ, grads: "Grads", sdQ_chunk, mbar, i, head, m_block, n_block,
                      blocks: QueryBlocks, seqlen: SeqlenInfo, batch, mCuSeqlensQ, ctidx):
        """Step i's dQ: into shared memory for the writer warp (dq_writer), else added into
        dQaccum from registers."""
        if cutlass.const_expr(self.cfg.dq_writer):
            self._stage_dq(acc_dQ, sdQ_chunk, mbar, i, ctidx)
        else:
            self._add_dq(acc_dQ, grads.dq_accum, head, m_block, n_block, blocks, seqlen,
                         batch, mCuSeqlensQ, grads.semaphore, None, None, ctidx)

    @cute.jit
    def _issue_dv(self, mma_dkv, acc_dV, rP, tdVrdOt, stage, r2s, thr_r2s, tPsP, tdVrPt):
        """dV += P^T dO, issued: rP (P^T in the input dtype, in the S^T registers) as the
        register A operand, or under split_d (tPsP, tdVrPt: P^T's stmatrix destination and SS
        operand) through shared memory, once every consumer has written its queries' share
        (dV's k runs over both warpgroups' queries)."""
        if cutlass.const_expr(self.cfg.split_d):
            cute.copy(r2s, thr_r2s.retile(rP), tPsP)
            cute.arch.fence_view_async_shared()
            self._consumer_sync()
            gemm(mma_dkv, acc_dV, tdVrPt, tdVrdOt[None, None, None, stage], False)
        else:
            gemm(mma_dkv, acc_dV,
                 cute.make_tensor(rP.iterator, wgmma.acc_to_a_layout(rP.layout)),
                 tdVrdOt[None, None, None, stage], False)

    @cute.jit
    def _consume(self, storage, grads: "Grads", scale_log2, softmax_scale, softcap_scale,
                 seqlen: SeqlenInfo, blocks: QueryBlocks, batch, head_kv, head0, n_block,
                 per_head, steps, mCuSeqlensQ, mCuSeqlensK, ctidx, share, base=None, tile=None,
                 score_tensors=None):
        """The consumers' tile: every step, then dK and dV out. base, tile: a persistent CTA's
        ring rounds and tiles before this one (`_persistent`); it waits for K and V even
        without steps (the producer loads them for every tile, so the barrier's phases stay
        one per tile) and, once dK and dV have left their staging in the K and V tiles,
        releases those to the next tile's loads."""
        cfg, bars = self.cfg, self.bars
        bm, bn, dp, stages = cfg.block_m, cfg.block_n, cfg.head_dim_padded, cfg.q_stages
        dtype = cutlass_dtype(cfg.dtype)
        mbar = storage.mbar.data_ptr()
        # the wgmma operands: the TMA tiles, the swizzle carried by the pointer
        lq = tma.tma_smem_layout(cfg, "Q", stages)
        lkv = tma.tma_smem_layout(cfg, "K")
        lds = bwd_wgmma.smem_layout_ds(cfg)
        sQ = storage.sQ.get_tensor(lq.outer, swizzle=lq.inner)
        sdO = storage.sdO.get_tensor(lq.outer, swizzle=lq.inner)
        sK = storage.sK.get_tensor(lkv.outer, swizzle=lkv.inner)
        sV = storage.sV.get_tensor(lkv.outer, swizzle=lkv.inner)
        sdS = storage.sdS.get_tensor(lds.outer, swizzle=lds.inner)
        sLSE = storage.sLSE.get_tensor(cute.make_layout(bm * stages))
        sD = storage.sD.get_tensor(cute.make_layout(bm * stages))

        mma_sdp = bwd_wgmma.tiled_mma_sdp(cfg)
        mma_dkv = bwd_wgmma.tiled_mma_dkv(cfg)
        mma_dq = bwd_wgmma.tiled_mma_dq(cfg)
        # the descriptors are the warpgroup's: partition the operands by its first thread,
        # known warp-uniform, so that ptxas builds them in uniform registers (without it, two
        # R2UR moves and a 64-bit add per wgmma: 522 instead of 437 per query block at d128)
        wg = cute.arch.make_warp_uniform(ctidx // wgmma.WARPGROUP_THREADS)
        wg_first = wg * wgmma.WARPGROUP_THREADS
        wg_sdp, wg_dkv, wg_dq = (m.get_slice(wg_first) for m in (mma_sdp, mma_dkv, mma_dq))
        tSrK = wg_sdp.make_fragment_A(wg_sdp.partition_A(sK))
        tSrQ = wg_sdp.make_fragment_B(wg_sdp.partition_B(sQ))
        tdPrV = wg_sdp.make_fragment_A(wg_sdp.partition_A(sV))
        tdPrdO = wg_sdp.make_fragment_B(wg_sdp.partition_B(sdO))
        tdVrdOt = wg_dkv.make_fragment_B(wg_dkv.partition_B(wgmma.transposed(sdO)))
        tdKrQt = wg_dkv.make_fragment_B(wg_dkv.partition_B(wgmma.transposed(sQ)))
        dq_t = cfg.dq_transposed
        if cutlass.const_expr(dq_t):
            # dQ^T = K^T dS^T: A = K^T (d, key), B = dS^T (query, key), both MN-major
            tdQrKt = wg_dq.make_fragment_A(wg_dq.partition_A(wgmma.transposed(sK)))
            tdQrdSt = wg_dq.make_fragment_B(wg_dq.partition_B(sdS))
        else:
            tdQrdS = wg_dq.make_fragment_A(wg_dq.partition_A(sdS))
            tdQrKt = wg_dq.make_fragment_B(wg_dq.partition_B(wgmma.transposed(sK)))
        split_d = cfg.split_d
        tdVrPt = tPsP = None  # split_d's P^T in shared memory
        if cutlass.const_expr(split_d):
            # dV's and dK's A operands: P^T and dS^T as the (key, query) views of the tiles
            sP = storage.sP.get_tensor(lds.outer, swizzle=lds.inner)
            tdVrPt = wg_dkv.make_fragment_A(wg_dkv.partition_A(wgmma.transposed(sP)))
            tdKrdSt = wg_dkv.make_fragment_A(wg_dkv.partition_A(wgmma.transposed(sdS)))

        sdQ_chunk = None
        if cutlass.const_expr(cfg.dq_writer):
            sdQ_chunk = storage.sdQ.get_tensor(bwd_layouts.accum_chunk_layout(
                bm, dp, cfg.num_threads, self.dq_vector))

        thr_sdp = mma_sdp.get_slice(ctidx)
        acc_dK = cute.make_rmem_tensor(mma_dkv.get_slice(ctidx).partition_shape_C((bn, dp)),
                                       cutlass.Float32)
        acc_dV = cute.make_rmem_tensor(acc_dK.layout, cutlass.Float32)
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)
        tScS = thr_sdp.partition_C(cute.make_identity_tensor((bn, bm)))
        place = tile_place(cute.make_tensor(tScS.iterator, wgmma.acc_rowcol_layout(tScS.layout)))
        r2s = wgmma.stmatrix_copy_c(cfg, mma_sdp)
        thr_r2s = r2s.get_slice(ctidx)
        tdSsdS = thr_r2s.partition_D(wgmma.transposed(sdS))
        if cutlass.const_expr(split_d):
            tPsP = thr_r2s.partition_D(wgmma.transposed(sP))
        shape_S = thr_sdp.partition_shape_C((bn, bm))
        shape_dQ = mma_dq.get_slice(ctidx).partition_shape_C(bwd_wgmma.dq_shape(cfg))
        rows = place["row_offsets"]
        cols = place["col_offsets"]
        key0 = n_block * bn + place["row0"]

        if cutlass.const_expr(base is None):
            if steps > 0:
                cute.arch.mbarrier_wait(mbar + bars.kv, 0)
        else:
            cute.arch.mbarrier_wait(mbar + bars.kv, tile % 2)
        for i in cutlass.range(steps, unroll=1):
            head, m_block, needs_mask = self._step_place(i, blocks, head0, per_head)
            stage, phase = ring.ring_slot(ring.ring_round(i, base), stages)
            cute.arch.mbarrier_wait(mbar + bars.q_full + stage, phase)
            acc_S = cute.make_rmem_tensor(shape_S, cutlass.Float32)
            gemm(mma_sdp, acc_S, tSrK, tSrQ[None, None, None, stage], True)
            cute.arch.mbarrier_wait(mbar + bars.do_full + stage, phase)
            acc_dP = cute.make_rmem_tensor(shape_S, cutlass.Float32)
            gemm(mma_sdp, acc_dP, tdPrV, tdPrdO[None, None, None, stage], True)
            cute.arch.mbarrier_wait(mbar + bars.rows_full + stage, phase)
            warpgroup.wait_group(1)

            dtanh = self._softcap_scores(acc_S, softcap_scale)
            acc_S_mn = cute.make_tensor(acc_S.iterator, wgmma.acc_rowcol_layout(acc_S.layout))
            query0 = m_block * bm + place["col0"]
            # the mods see (query, key): the tile is S^T, so its view with the modes swapped
            coords = mods.TileCoords(cols, rows, query0)
            dmod, dcaptures = None, ()
            if cutlass.const_expr(self.has_mods):
                dmod, dcaptures = self._mod_scores(acc_S, _swapped(acc_S_mn), coords, key0,
                                                   seqlen, batch, head, score_tensors,
                                                   softcap_scale, needs_mask)
            if self._masked(m_block, n_block, blocks, seqlen):
                mask.apply_mask_transposed(acc_S_mn, rows, cols, key0, query0, seqlen.seqlen_k,
                                           blocks.upper, self.causal, blocks.window_offset)
            lse0 = stage * bm + place["col0"]  # this thread's first query's LSE and D
            for c in cutlass.range_constexpr(len(cols)):
                lse = sLSE[lse0 + cols[c]]
                for r in cutlass.range_constexpr(len(rows)):
                    acc_S_mn[r, c] = cute.math.exp2(acc_S_mn[r, c] * scale_log2 - lse,
                                                    fastmath=True)
            rP = cute.make_fragment_like(acc_S, dtype)
            rP.store(acc_S.load().to(dtype))
            dv_late = cfg.dv_after_ds  # dV issued behind dS's stores, not under its arithmetic
            if cutlass.const_expr(not dv_late):
                self._issue_dv(mma_dkv, acc_dV, rP, tdVrdOt, stage, r2s, thr_r2s, tPsP,
                               tdVrPt)
                warpgroup.wait_group(1)  # dP^T (dV's group may still run)
            else:
                warpgroup.wait_group(0)  # dP^T
            acc_dP_mn = cute.make_tensor(acc_dP.iterator, wgmma.acc_rowcol_layout(acc_dP.layout))
            for c in cutlass.range_constexpr(len(cols)):
                d = sD[lse0 + cols[c]]
                for r in cutlass.range_constexpr(len(rows)):
                    acc_dP_mn[r, c] = acc_S_mn[r, c] * (acc_dP_mn[r, c] - d)
            if cutlass.const_expr(self.softcap):
                acc_dP.store(acc_dP.load() * dtanh.load())
            if cutlass.const_expr(len(dcaptures) > 0):
                self._capture_grads(_swapped(acc_dP_mn), dcaptures, coords, key0, seqlen, batch,
                                    head, score_tensors)
            if cutlass.const_expr(self.score_mod is not None):
                acc_dP.store(acc_dP.load() * dmod.load())
            rdS = cute.make_fragment_like(acc_dP, dtype)
            rdS.store(acc_dP.load().to(dtype))
            cute.copy(r2s, thr_r2s.retile(rdS), tdSsdS)
            if cutlass.const_expr(dv_late):
                self._issue_dv(mma_dkv, acc_dV, rP, tdVrdOt, stage, r2s, thr_r2s, None, None)
            tdKrdS = cute.make_tensor(rdS.iterator, wgmma.acc_to_a_layout(rdS.layout))
            dq_first = cfg.dq_before_dk
            if cutlass.const_expr(split_d):
                cute.arch.fence_view_async_shared()
                self._consumer_sync()
                gemm(mma_dkv, acc_dK, tdKrdSt, tdKrQt[None, None, None, stage], False)
            elif cutlass.const_expr(not dq_first):
                gemm(mma_dkv, acc_dK, tdKrdS, tdKrQt[None, None, None, stage], False)
                cute.arch.fence_view_async_shared()  # dS's generic-proxy writes, seen by wgmma
                self._consumer_sync()
            else:
                cute.arch.fence_view_async_shared()
                self._consumer_sync()
            acc_dQ = cute.make_rmem_tensor(shape_dQ, cutlass.Float32)
            if cutlass.const_expr(dq_t):
                gemm(mma_dq, acc_dQ, tdQrKt, tdQrdSt, True)
            else:
                gemm(mma_dq, acc_dQ, tdQrdS, tdQrKt, True)
            if cutlass.const_expr(dq_first):
                # dK behind dQ: dQ's hand-over runs under dK, the stage is released after it
                gemm(mma_dkv, acc_dK, tdKrdS, tdKrQt[None, None, None, stage], False)
                warpgroup.wait_group(1)
                self._hand_over_dq(acc_dQ, grads, sdQ_chunk, mbar, ring.ring_round(i, base), head,
                                   m_block, n_block, blocks, seqlen, batch, mCuSeqlensQ, ctidx)
                warpgroup.wait_group(0)
                self._release(mbar, stage)
            else:
                warpgroup.wait_group(0)
                self._release(mbar, stage)
                self._hand_over_dq(acc_dQ, grads, sdQ_chunk, mbar, ring.ring_round(i, base), head,
                                   m_block, n_block, blocks, seqlen, batch, mCuSeqlensQ, ctidx)
            self._consumer_sync()  # every warpgroup has read dS (and P) before a rewrite

        # dS was formed from scores S = Q K^T, the logits are S * softmax_scale
        acc_dK.store(acc_dK.load() * softmax_scale)
        if cutlass.const_expr(self.kv_accum):
            block = bwd_layouts.dq_block(n_block, batch, bn, mCuSeqlensK)
            entry = 0 if cutlass.const_expr(self.varlen_k) else batch
            lock = None
            if cutlass.const_expr(self.deterministic):
                # the key block's shares add in turn, share 0 first: each waits only for CTAs
                # the grid starts before it (the previous share is the previous grid row)
                lock = grads.kv_semaphore[batch, head_kv, None].iterator + n_block
                self._wait_turn(lock, share, ctidx)
                self._consumer_sync()
            for acc, sums in ((acc_dK, grads.dk_accum), (acc_dV, grads.dv_accum)):
                self._reduce_into(acc, bwd_layouts.kv_accum_chunk(sums, entry, head_kv, block,
                                                                  cfg, self.dq_vector), ctidx)
            if cutlass.const_expr(self.deterministic):
                self._consumer_sync()
                self._pass_turn(lock, ctidx)
        else:
            rows_k = cfg.kv_rows
            cdK = cute.local_tile(cute.make_identity_tensor((seqlen.seqlen_k, cfg.head_dim)),
                                  (bn, dp), (n_block, 0))
            sK_o = storage.sK.get_tensor(smem.smem_layout_o(rows_k))
            sV_o = storage.sV.get_tensor(smem.smem_layout_o(rows_k))
            epilogue.store_O(rows_k, acc_dK, mma_dkv, sK_o,
                             cute.local_tile(seqlen.k_rows(grads.dk, batch, head_kv), (bn, dp),
                                             (n_block, 0)), cdK, seqlen.seqlen_k, ctidx,
                             sync=self._consumer_sync)
            epilogue.store_O(rows_k, acc_dV, mma_dkv, sV_o,
                             cute.local_tile(seqlen.k_rows(grads.dv, batch, head_kv), (bn, dp),
                                             (n_block, 0)), cdK, seqlen.seqlen_k, ctidx,
                             sync=self._consumer_sync)
        if cutlass.const_expr(base is not None):
            # the staging's generic-proxy accesses ordered before the next tile's TMA writes
            cute.arch.fence_view_async_shared()
            cute.arch.mbarrier_arrive(mbar + bars.kv_empty)


def _swapped(tensor: cute.Tensor) -> cute.Tensor:
    """A 2-d tensor's view with its modes swapped: the (query, key) view of an S^T tile."""
    return cute.make_tensor(tensor.iterator, cute.select(tensor.layout, mode=[1, 0]))
