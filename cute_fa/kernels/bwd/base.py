"""What the backward kernels share (`sm80.py`, `sm90.py`): which query blocks a key block's CTA
visits, which of those tiles need the mask, and the deterministic mode's turn order of the CTAs
adding into one query block's dQ sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from ...layouts import bwd as bwd_layouts
from ...mods.grad import capture_derivatives, score_derivative
from ..common import mask, mods
from ..sched.seqlen import QueryRows, SeqlenInfo


@dataclass(frozen=True)
class QueryBlocks:
    """The query blocks a key block's CTA visits, [m_lo, m_hi), and the edges of the keys its
    rows see: `upper` (causal: key <= query + upper) and `window_offset` (a window's lower
    edge: key >= query + window_offset; None without one). lists: under block_sparse, the
    block mask's query tiles of this key block, (count per query head (heads,), tiles per
    query head (heads, query tiles), heads visited), `BlockMask.query_tiles`' at (batch entry,
    key block); None otherwise."""

    m_lo: object
    m_hi: object
    upper: object
    window_offset: object = None
    lists: object = None


@dataclass(frozen=True)
class KeyBlockWork:
    """One CTA's work: its key block, K/V head and batch entry, the entry's lengths, the causal
    offset (bottom-right per entry in a ragged batch), the query heads it visits (`group` of
    them from head0: the K/V head's whole group, or share number `share` of it where the group
    is split over CTAs; share 0 otherwise)."""

    n_block: object
    head_kv: object
    batch: object
    seqlen: SeqlenInfo
    causal_offset: object
    group: object
    head0: object
    share: object = 0


_ROWS = QueryRows(1)  # the backward's tiles hold one query head


class FlashBwdBase:
    """Built from a backward kernel key (`compile.keys.BwdKey`, `BwdSm90Key`)."""

    def __init__(self, key):
        self.cfg = key.tile
        self.causal = key.causal
        self.local = key.local
        self.softcap = key.softcap
        self.score_mod, self.mask_mod = key.score_mod, key.mask_mod
        self.has_mods = key.score_mod is not None or key.mask_mod is not None
        self.score_mod_grad = None
        if key.score_mod is not None:  # d score_mod / d score, run next to the mod
            self.score_mod_grad = score_derivative(key.score_mod)
        # (load, d score_mod / d load) of the captured elements whose gradients are added
        self.capture_slots = getattr(key, "capture_grads", ())
        self.capture_pairs = capture_derivatives(key.score_mod, self.capture_slots) \
            if self.capture_slots else ()
        self.n_captures = len(key.mod_captures)
        self.block_sparse = key.block_sparse  # the block mask's query tile lists follow them
        self.varlen_q = key.varlen_q
        self.varlen_k = key.varlen_k
        self.deterministic = key.deterministic
        self.ctas_per_sm = key.ctas_per_sm
        self.dq_vector = bwd_layouts.dq_vector(key.arch)

    @cute.jit
    def _work(self, mQ, mK, seq_mode: cutlass.Constexpr, head_mode: cutlass.Constexpr,
              causal_offset, mCuSeqlensQ, mCuSeqlensK, head_splits=None,
              place=None) -> KeyBlockWork:
        """This CTA's `KeyBlockWork` from its place in the grid (key block, K/V head, entry)
        and the extents of Q and K, whose modes seq_mode and head_mode are the sequence and
        the heads ((batch, seqlen, heads, d): 1, 2; the TMA view (seqlen, d, heads, batch): 0,
        2). head_splits: the grid's second place is K/V head * head_splits + the CTA's share
        of the group's query heads (None: the K/V head; the CTA visits the whole group).
        place: (key block, K/V head, entry) of a persistent CTA's tile, instead of the
        grid's."""
        if cutlass.const_expr(place is None):
            n_block, head_kv, batch = cute.arch.block_idx()
            if cutlass.const_expr(self.deterministic and self.causal):
                # the causal turns go from the last key block down (`_turn`): those CTAs
                # start first, so a CTA only ever waits for CTAs started before it (never for
                # one that cannot start while it holds an SM)
                n_block = cute.arch.grid_dim()[0] - 1 - n_block
        else:
            n_block, head_kv, batch = place
        seqlen = SeqlenInfo.of(batch, mQ.shape[seq_mode], mK.shape[seq_mode], mCuSeqlensQ,
                               mCuSeqlensK)
        if cutlass.const_expr(self.varlen_q or self.varlen_k):
            causal_offset = seqlen.seqlen_k - seqlen.seqlen_q  # bottom-right, per entry
        group = mQ.shape[head_mode] // mK.shape[head_mode]
        head0 = head_kv * group
        share = 0
        if cutlass.const_expr(head_splits is not None):
            share = head_kv % head_splits
            head_kv = head_kv // head_splits
            head0 = head_kv * group
            group = group // head_splits
            head0 = head0 + share * group
        return KeyBlockWork(n_block, head_kv, batch, seqlen, causal_offset, group, head0, share)

    @cute.jit
    def _visits(self, work: KeyBlockWork, window_left, window_right,
                score_tensors=None) -> tuple:
        """(`QueryBlocks`, query blocks per head, steps: those of every head it visits) of a
        CTA's work; under block_sparse the tiles the lists in score_tensors (after the
        captures) give the heads visited (`QueryBlocks.lists`; per head, the dense count, is
        then unused: `_step_place` reads the lists)."""
        blocks = self._query_blocks(work.n_block, work.seqlen, work.causal_offset, window_left,
                                    window_right)
        per_head = cutlass.max(blocks.m_hi - blocks.m_lo, 0)
        steps = per_head * work.group
        if cutlass.const_expr(self.block_sparse):
            counts = score_tensors[self.n_captures][work.batch, None, work.n_block]
            listed = score_tensors[self.n_captures + 1][work.batch, None, work.n_block, None]
            steps = cutlass.Int32(0)
            for g in cutlass.range(work.group, unroll=1):
                steps = steps + counts[work.head0 + g]
            blocks = QueryBlocks(blocks.m_lo, blocks.m_hi, blocks.upper, blocks.window_offset,
                                 (counts, listed, work.group))
        return blocks, per_head, steps

    @cute.jit
    def _query_blocks(self, n_block, seqlen: SeqlenInfo, causal_offset, window_left,
                      window_right) -> QueryBlocks:
        """The query blocks whose rows see a key of key block n_block: from the first query
        whose upper edge reaches the block's first key, to the last query whose lower edge
        is at or below its last key (the forward's `BlockInfo` rule turned around)."""
        bm, bn = self.cfg.block_m, self.cfg.block_n
        upper = causal_offset
        window_offset = None
        m_hi = cute.ceil_div(seqlen.seqlen_q, bm)
        if cutlass.const_expr(self.local):
            window_offset = causal_offset - window_left
            upper = causal_offset + window_right
            last_query = (n_block + 1) * bn - 1 - window_offset
            m_hi = cutlass.min(m_hi, cutlass.max(last_query + bm, 0) // bm)
        m_lo = 0
        if cutlass.const_expr(self.causal):
            m_lo = cutlass.max(n_block * bn - upper, 0) // bm
        return QueryBlocks(m_lo, m_hi, upper, window_offset)

    @cute.jit
    def _masked(self, m_block, n_block, blocks: QueryBlocks, seqlen: SeqlenInfo):
        """Whether the (m_block, n_block) tile holds a score the mask removes: a key past
        seqlen_k, one above a row's causal edge or below its window's lower edge."""
        bm, bn = self.cfg.block_m, self.cfg.block_n
        masked = (n_block + 1) * bn > seqlen.seqlen_k
        if cutlass.const_expr(self.causal):
            masked = masked | ((n_block + 1) * bn - 1 - m_block * bm > blocks.upper)
        if cutlass.const_expr(self.local):
            masked = masked | (n_block * bn - ((m_block + 1) * bm - 1) < blocks.window_offset)
        return masked

    @cute.jit
    def _softcap_scores(self, acc_S, softcap_scale):
        """Under a softcap, the recomputed scores through tanh in place (`mask.apply_softcap`,
        before the mask) and 1 - tanh^2, the factor dS takes; None without one."""
        dtanh = None
        if cutlass.const_expr(self.softcap):
            mask.apply_softcap(acc_S, softcap_scale)
            dtanh = cute.make_fragment_like(acc_S)
            dtanh.store(1.0 - acc_S.load() * acc_S.load())
        return dtanh

    def _mod_scores(self, acc_S, acc_S_mn, coords: mods.TileCoords, key0, seqlen: SeqlenInfo,
                    batch, head, score_tensors, pre_scale, needs_mask=True):
        """With mods, the recomputed scores through them as in the forward (`mods.apply_mods`:
        score_mod of S * pre_scale, -inf where mask_mod drops the key), before the mask; returns
        score_mod's derivative at each score, the factor dS takes (None without a score_mod),
        and, per `capture_pairs`, its derivative with respect to that load (in acc_S_mn's
        layout: `_capture_grads` reads them). acc_S_mn: acc_S's (query, key) view, whose rows
        are queries coords.query0 + coords.row_offsets of `head`, its columns keys key0 +
        coords.col_offsets (a kernel whose tile is S^T passes the view with its modes
        swapped). needs_mask: True, or a block-sparse list's flag (`list_entry`), False on a
        tile every score of which the block mask keeps, where the mask_mod is skipped."""
        grad = None
        derivatives = ()
        if cutlass.const_expr(self.has_mods):
            grad_mn = None
            if cutlass.const_expr(self.score_mod is not None):
                grad = cute.make_fragment_like(acc_S)
                grad_mn = cute.make_tensor(grad.iterator, acc_S_mn.layout)
            derivatives = tuple(
                (graph, cute.make_tensor(cute.make_fragment_like(acc_S).iterator,
                                         acc_S_mn.layout)) for _, graph in self.capture_pairs)
            at = mods.ModArgs(batch, head, score_tensors if score_tensors is None
                              else score_tensors[:self.n_captures])
            if cutlass.const_expr(needs_mask is True or self.mask_mod is None):
                mods.apply_mods(acc_S_mn, coords, key0, _ROWS, seqlen, at, self.score_mod,
                                self.mask_mod, pre_scale, self.score_mod_grad, grad_mn,
                                derivatives)
            else:
                mods.apply_mods_unless_whole(acc_S_mn, coords, key0, _ROWS, seqlen, at,
                                             self.score_mod, self.mask_mod, pre_scale,
                                             needs_mask, self.score_mod_grad, grad_mn,
                                             derivatives)
        return grad, tuple(mn for _, mn in derivatives)

    def _capture_grads(self, dS_mn, derivative_mns, coords: mods.TileCoords, key0,
                       seqlen: SeqlenInfo, batch, head, score_tensors):
        """dL / d score_mod of the tile (dS_mn, before score_mod's derivative, in the (query,
        key) view `_mod_scores` took) into the captured tensors' gradients
        (`mods.add_capture_grads`), the score tensors after the captures."""
        if cutlass.const_expr(len(self.capture_pairs) > 0):
            n_mods = len(self.score_mod.captures)
            mods.add_capture_grads(
                dS_mn, coords, key0, _ROWS, seqlen, mods.ModArgs(batch, head,
                                                                 score_tensors[:n_mods]),
                self.capture_pairs, derivative_mns, self.capture_slots,
                score_tensors[self.n_captures + (2 if self.block_sparse else 0):])

    def _dq_sync(self):
        raise NotImplementedError

    @cute.jit
    def _dq_chunk(self, dq_accum, batch, head, m_block, mCuSeqlensQ):
        """Query block m_block's float32 sums in dQaccum, [element, thread]
        (`layouts.bwd.dq_accum_chunk`; a ragged batch's blocks by `layouts.bwd.dq_block`)."""
        return bwd_layouts.dq_accum_chunk(
            dq_accum, 0 if cutlass.const_expr(self.varlen_q) else batch, head,
            bwd_layouts.dq_block(m_block, batch, self.cfg.block_m, mCuSeqlensQ), self.cfg,
            self.dq_vector)

    @cute.jit
    def _dq_lock(self, mSemaphore, batch, head, m_block):
        """deterministic: the address of the turn counter of (batch, head, m_block)."""
        return mSemaphore[batch, head, None].iterator + m_block

    @cute.jit
    def _add_dq(self, acc_dQ, dq_accum, head, m_block, n_block, blocks: QueryBlocks,
                seqlen: SeqlenInfo, batch, mCuSeqlensQ, mSemaphore, lock, seen, tid):
        """dQaccum's block m_block += acc_dQ: float32 reductions at L2 (vector ones from sm90
        on), in the dQ TiledMMA's register order (`layouts.bwd.dq_accum_chunk`; the
        postprocess reads them back through the same TiledMMA), unpredicated (rows past
        seqlen_q and columns past head_dim are zeros: their dS rows and K columns are). tid
        counts the threads that add (`_dq_sync`'s). deterministic: in key-block order
        (`_turn`), one CTA at a time: wait for the counter of (batch, head, m_block) in
        mSemaphore to reach this key block's turn, add, pass the turn on. lock, seen: the
        counter's address and its value where the caller read it already (under its dQ GEMM),
        else None: found and read here."""
        chunk = self._dq_chunk(dq_accum, batch, head, m_block, mCuSeqlensQ)
        if cutlass.const_expr(self.deterministic):
            if cutlass.const_expr(lock is None):
                lock = self._dq_lock(mSemaphore, batch, head, m_block)
            self._wait_turn(lock, self._turn(m_block, n_block, blocks, seqlen), tid, seen)
            self._dq_sync()
        self._reduce_into(acc_dQ, chunk, tid)
        if cutlass.const_expr(self.deterministic):
            self._dq_sync()
            self._pass_turn(lock, tid)

    @cute.jit
    def _wait_turn(self, lock, turn, tid, seen=None):
        """Thread 0 spins until the counter at lock reads turn (acquire: the sums added before
        it are visible); seen: its value read already, else None. The caller's barrier then
        holds the other threads."""
        if tid == 0:
            count = seen if cutlass.const_expr(seen is not None) else cute.arch.load(
                lock, cutlass.Int32, sem="acquire", scope="gpu")
            while count != turn:
                count = cute.arch.load(lock, cutlass.Int32, sem="acquire", scope="gpu")

    @cute.jit
    def _pass_turn(self, lock, tid):
        """After the caller's barrier (every thread's sums issued): thread 0 passes the turn
        on, a release add, so the next CTA's acquire sees the sums."""
        if tid == 0:
            cute.arch.red(lock, cutlass.Int32(1), op="add", dtype="s32", sem="release",
                          scope="gpu")

    @cute.jit
    def _reduce_into(self, acc, chunk, tid):
        """chunk[None, tid] += acc (an `layouts.bwd.accum_chunk` of cfg.num_threads threads):
        float32 reductions at L2, dq_vector floats each."""
        vec = self.dq_vector
        mine = chunk[None, tid]
        acc_v = cute.make_tensor(acc.iterator, cute.make_layout((vec, cute.size(acc) // vec)))
        for r in cutlass.range(cute.size(acc_v, mode=[1]), unroll_full=True):
            value = acc_v[None, r].load() if cutlass.const_expr(vec > 1) else acc_v[0, r]
            cute.arch.red(mine.iterator + r * self.cfg.num_threads * vec, value, op="add",
                          dtype="f32", sem="relaxed", scope="gpu")

    @cute.jit
    def _turn(self, m_block, n_block, blocks: QueryBlocks, seqlen: SeqlenInfo):
        """deterministic: this key block's place among those adding into query block m_block.
        Causal: from the last key block down (the block on the diagonal starts its rows, so a
        CTA reaching its first query block never waits); else from the first key block up.
        Either way a CTA waits only for CTAs the grid starts before it (`kernel`)."""
        bm, bn = self.cfg.block_m, self.cfg.block_n
        if cutlass.const_expr(self.causal):
            last_key = (m_block + 1) * bm - 1 + blocks.upper
            n_last = cutlass.min(cute.ceil_div(seqlen.seqlen_k, bn),
                                 cutlass.max(last_key + 1 + bn - 1, 0) // bn) - 1
            return n_last - n_block
        if cutlass.const_expr(self.local):
            return n_block - cutlass.max(m_block * bm + blocks.window_offset, 0) // bn
        return n_block


@dataclass(frozen=True)
class RowData:
    """One query head's per-row inputs of this entry: LSE and D (seqlen,); dQaccum (all of it:
    `layouts.bwd.dq_accum_chunk` finds the head's blocks) and the head."""

    lse: object
    d: object
    dq_accum: object
    head: object


@dataclass(frozen=True)
class Grads:
    """Where a CTA's gradients go: dQ's float32 sums, dK and dV (or, under kv_accum, their
    float32 sums), and the deterministic mode's counters of dQ's and (under kv_accum) of dK
    and dV's sums (None where the key has none)."""

    dq_accum: object
    dk: object
    dv: object
    dk_accum: object
    dv_accum: object
    semaphore: object
    kv_semaphore: object
