"""The Hopper backward's persistent form (`BwdSm90Key.persistent`), mixed into `sm90.FlashBwdSm90`:
a grid of at most that many CTAs, each walking (key block, K/V head, batch entry) tiles at a
fixed stride. Every role (the producer, the row loader, the dQ writer, the consumers) runs the
one-tile kernel's code per tile, with the Q/dO ring's rounds running on across tiles, so the
next tile's first loads go under this tile's last query blocks and its dK/dV epilogue. The K/V
empty barrier (`layouts.bwd_wgmma.QBarriers.kv_empty`) holds the next tile's K and V until this
tile's dK and dV, staged in their shared-memory tiles, are out."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass.cute.nvgpu import cpasync

from ...layouts import wgmma
from .base import Grads, KeyBlockWork, QueryBlocks


class PersistentTiles:
    """The persistent kernel's tile walk (`FlashBwdSm90` supplies the roles it calls)."""

    @cute.jit
    def _persistent(self, tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K,
                    tma_atom_V, tma_V, mLSE, mD, mdQaccum, mdK, mdV, scale_log2, softmax_scale,
                    causal_offset, Storage, window_left, window_right, softcap_scale,
                    score_tensors):
        """A persistent CTA: tiles blockIdx.x, blockIdx.x + gridDim.x, ... of (key block, K/V
        head, batch entry), key blocks fastest as the one-tile grid starts them. Every role
        walks the same tiles (`_over_tiles`) with the ring's rounds running on, so the
        producer and the row loader fill the next tile's first stages while the consumers
        finish this tile's last query blocks and store its dK and dV. Only the next tile's K
        and V wait for that store, which stages dK and dV in their tiles (K/V empty)."""
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        storage = cutlass.memory.SmemAllocator().allocate(Storage)
        mbar = storage.mbar.data_ptr()
        self._init_barriers(mbar, warp)
        walk = (tma_Q, tma_K, causal_offset, window_left, window_right)
        if warp < 4:
            cute.arch.setmaxregister_decrease(self.roles.producer_regs)
            if warp == 0:
                with cute.arch.elect_one():
                    for atom in (tma_atom_Q, tma_atom_dO, tma_atom_K, tma_atom_V):
                        cpasync.prefetch_descriptor(atom)
                self._over_tiles(lambda work, blocks, per_head, steps, base, tile:
                                 self._produce_tile(storage, tma_atom_Q, tma_Q, tma_atom_dO,
                                                    tma_dO, tma_atom_K, tma_K, tma_atom_V,
                                                    tma_V, work, blocks, per_head, steps, base,
                                                    tile), *walk)
            if warp == 1:
                self._over_tiles(lambda work, blocks, per_head, steps, base, tile:
                                 self._load_rows(storage, mLSE, mD, work.seqlen, blocks,
                                                 work.batch, work.head0, per_head, steps, base),
                                 *walk)
            if cutlass.const_expr(cfg.dq_writer):
                if warp == 2:
                    self._over_tiles(lambda work, blocks, per_head, steps, base, tile:
                                     self._write_dq(storage, mdQaccum, None, work.seqlen,
                                                    blocks, work.batch, work.head0,
                                                    work.n_block, per_head, steps, None, base),
                                     *walk)
        else:
            cute.arch.setmaxregister_increase(self.roles.consumer_regs)
            grads = Grads(mdQaccum, mdK, mdV, None, None, None, None)
            self._over_tiles(lambda work, blocks, per_head, steps, base, tile:
                             self._consume(storage, grads, scale_log2, softmax_scale,
                                           softcap_scale, work.seqlen, blocks, work.batch,
                                           work.head_kv, work.head0, work.n_block, per_head,
                                           steps, None, None, tidx - wgmma.WARPGROUP_THREADS,
                                           0, base, tile, score_tensors), *walk)

    @cute.jit
    def _over_tiles(self, body, tma_Q, tma_K, causal_offset, window_left, window_right):
        """body(work, blocks, per_head, steps, base, tile) for each of this persistent CTA's
        tiles: its `KeyBlockWork`, query blocks and steps (`_single`'s), the ring rounds
        (steps) of its earlier tiles and their count."""
        n_blocks = cute.ceil_div(tma_K.shape[0], self.cfg.block_n)
        heads_kv = tma_K.shape[2]
        total = n_blocks * heads_kv * tma_Q.shape[3]
        base = cutlass.Int32(0)
        tile = cutlass.Int32(0)
        t = cute.arch.block_idx()[0]
        while t < total:
            rest = t // n_blocks
            work = self._work(tma_Q, tma_K, 0, 2, causal_offset, None, None,
                              place=(t - rest * n_blocks, rest % heads_kv, rest // heads_kv))
            blocks, per_head, steps = self._visits(work, window_left, window_right)
            body(work, blocks, per_head, steps, base, tile)
            base = base + steps
            tile = tile + 1
            t = t + cute.arch.grid_dim()[0]

    @cute.jit
    def _produce_tile(self, storage, tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K,
                      tma_atom_V, tma_V, work: KeyBlockWork, blocks: QueryBlocks, per_head,
                      steps, base, tile):
        """Warp 0, a persistent CTA's tile: Q and dO of the steps the ring has room for (its
        stages are freed by the previous tile's last query blocks), then K and V once the
        previous tile's dK and dV have left them, then the other steps. K and V are loaded
        even for a tile without steps: the consumers wait for them once per tile."""
        first = cutlass.min(steps, self.cfg.q_stages)
        for i in cutlass.range(first, unroll=1):
            self._load_step(storage, tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, work.seqlen,
                            blocks, work.batch, work.head0, per_head, i, base + i)
        if tile > 0:
            cute.arch.mbarrier_wait(storage.mbar.data_ptr() + self.bars.kv_empty,
                                    (tile - 1) % 2)
        self._load_kv(storage, tma_atom_K, tma_K, tma_atom_V, tma_V, work.seqlen, work.batch,
                      work.head_kv, work.n_block)
        for i in cutlass.range(first, steps, unroll=1):
            self._load_step(storage, tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, work.seqlen,
                            blocks, work.batch, work.head0, per_head, i, base + i)
