"""The rows of every table in docs/walkthrough.md, as plain Python values.

One function per table, named after it (`hand_rounds_table`, `swizzle_table`, ...), computed
from `cute_fa.explain.FlashLayouts` (the layouts the kernels run) and `cute_fa.reference`
(the float64 hand example), so the document cannot drift from the code. The values stay
unformatted (ranges, Fractions, tuples) so that tests/test_walkthrough_doc.py can compare them
with numbers typed in by hand; turning them into Markdown is `walkthrough.render`'s job, and
the prose around them lives in `walkthrough_prose`.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from pathlib import Path

import numpy as np

from ..layouts.config import MMA_K, MMA_M, MMA_N, WARP_SIZE
from ..reference import attention, flash_forward_tiles, visible_mask
from .introspect import FlashLayouts

CONFIG = dict(head_dim=64, block_m=64, block_n=64, num_threads=128, dtype="float16")
SEQLEN = 128  # Q, K and V of one head have 128 rows: two query blocks, two key blocks

# The hand example: two queries, four keys, two keys per round, and s = ln 2 so that
# exp(s*x) = 2**x and every weight is a power of two.
HAND_Q = [[1, 0], [0, 1]]
HAND_K = [[0, 1], [1, 0], [2, 1], [0, 2]]
HAND_V = [[1, 0], [0, 1], [1, 1], [2, 0]]
HAND_SCALE = math.log(2.0)
HAND_BLOCK_N = 2

MAX_EXAMPLE_ROW = [-4, -3, -2, -1, 0, 1, 2, 3] + [-5] * 56  # one score row of 64 keys
SUM_EXAMPLE = [Fraction(1, 2), Fraction(1), Fraction(1, 4), Fraction(1, 4)]  # lanes 0..3
SWIZZLE_EXAMPLES = [(0, 0), (0, 8), (1, 0), (1, 8), (7, 56), (8, 0)]
COPY_THREADS = (0, 7, 8, 32, 127)
LANE_EXAMPLES = (0, 1, 4, 5, 33, 127)
NOTEBOOKS = {
    "01_online_softmax_by_hand.ipynb": "the rounds of §2 in exact fractions; the causal variant",
    "02_fragments_qk_pv.ipynb": "ownership grids of Q, K, S, V, O; row view, mask, quads (§7-§9)",
    "03_swizzle_and_copy.ipynb": "swizzle, bank maps, ldmatrix phases, the copy partition (§4-§6)",
    "04_tma_variant.ipynb": "the TMA kernel: tensor maps, the 128-byte swizzle, the mbarrier ring",
    "05_hopper_warp_specialized.ipynb": "the wgmma kernel: warp roles, pipeline phases, wgmma "
                                        "fragments, descriptor swizzle, the ping-pong",
    "06_backward_fragments.ipynb": "the backward: P^T dO fragments, P's trip through shared "
                                   "memory, the transposed ldmatrix reads' banks",
}
_ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def layouts() -> FlashLayouts:
    return FlashLayouts(**CONFIG)


# ---- row values ---------------------------------------------------------------------

def _exact(x) -> Fraction:
    """A float64 result of the hand example as the fraction it stands for."""
    return Fraction(float(x)).limit_denominator(1 << 20)


def _ln(x) -> str:
    """A log-sum-exp of the hand example written as ln of a small rational."""
    return f"ln {Fraction(math.exp(float(x))).limit_denominator(1 << 10)}"


def _span(values):
    """Sorted distinct values as a range when contiguous, else as a list."""
    v = sorted(set(int(x) for x in values))
    return range(v[0], v[-1] + 1) if v == list(range(v[0], v[-1] + 1)) else v


# ---- §2 the hand example -------------------------------------------------------------

def hand_input_table():
    """(row, Q row, K row, V row); Q has two rows only."""
    return [(r, tuple(HAND_Q[r]) if r < len(HAND_Q) else None, tuple(HAND_K[r]), tuple(HAND_V[r]))
            for r in range(len(HAND_K))]


def hand_scores():
    """(query, raw scores S = Q K^T against keys 0..3)."""
    s = np.asarray(HAND_Q) @ np.asarray(HAND_K).T
    return [(q, [int(x) for x in row]) for q, row in enumerate(s)]


@functools.lru_cache(maxsize=1)
def _hand_run():
    return flash_forward_tiles(HAND_Q, HAND_K, HAND_V, scale=HAND_SCALE, block_n=HAND_BLOCK_N)


def hand_rounds_table():
    """(round, keys, query, m, alpha, P~ row, l, P~ V_j row, O row) after each round."""
    _, _, states = _hand_run()
    v = np.asarray(HAND_V, dtype=np.float64)
    rows = []
    for j, st in enumerate(states):
        start = j * HAND_BLOCK_N
        p = st["p"]
        inc = p @ v[start:start + p.shape[1]]
        for q in range(len(HAND_Q)):
            rows.append((j + 1, range(start, start + p.shape[1]), q, _exact(st["m"][q]),
                         _exact(st["alpha"][q]), tuple(map(_exact, p[q])), _exact(st["l"][q]),
                         tuple(map(_exact, inc[q])), tuple(map(_exact, st["o"][q]))))
    return rows


def hand_output_table():
    """(query, O numerator, l, O = numerator / l, softmax(sS) V directly, L) at the end."""
    o, lse, states = _hand_run()
    o_direct, lse_direct = attention(HAND_Q, HAND_K, HAND_V, scale=HAND_SCALE)
    if not (np.allclose(o, o_direct, rtol=0, atol=1e-12)
            and np.allclose(lse, lse_direct, rtol=0, atol=1e-12)):
        raise AssertionError("the two rounds disagree with the direct float64 attention")
    last = states[-1]
    return [(q, tuple(map(_exact, last["o"][q])), _exact(last["l"][q]), tuple(map(_exact, o[q])),
             tuple(map(_exact, o_direct[q])), _ln(lse[q])) for q in range(len(HAND_Q))]


# ---- §3 the configuration --------------------------------------------------------------

def config_table():
    c = layouts().config
    return [("head_dim d", c.head_dim), ("block_m = B_r (query rows per CTA)", c.block_m),
            ("block_n = B_c (keys per round)", c.block_n), ("threads per CTA", c.num_threads),
            ("warps per CTA", c.num_warps), ("dtype of Q, K, V, P", c.dtype),
            ("MMA instruction", f"mma.sync m{MMA_M}n{MMA_N}k{MMA_K}"),
            ("shared memory (Q + K + V tiles), bytes", c.smem_bytes()),
            ("softmax scale s = 1/√d", Fraction(1) / Fraction(math.isqrt(c.head_dim)))]


def cta_table():
    """(m_block, query rows, key blocks visited, key blocks visited under causal, blocks masked
    under causal) for sequences of SEQLEN rows; key blocks in the kernel's order, last first."""
    c = layouts().config
    n_blocks = SEQLEN // c.block_n
    vis = visible_mask(SEQLEN, SEQLEN, causal=True)
    rows = []
    for m in range(SEQLEN // c.block_m):
        qs = slice(m * c.block_m, (m + 1) * c.block_m)
        blocks = [vis[qs, n * c.block_n:(n + 1) * c.block_n] for n in range(n_blocks)]
        order = list(reversed(range(n_blocks)))
        rows.append((m, range(qs.start, qs.stop), order, [n for n in order if blocks[n].any()],
                     [n for n in order if blocks[n].any() and not blocks[n].all()]))
    return rows


def warp_rows_table():
    """(warp, threads, query rows of S and O, keys of S, output dims of O)."""
    L = layouts()
    rows = []
    for w in range(L.config.num_warps):
        tids = range(w * WARP_SIZE, (w + 1) * WARP_SIZE)
        s = [x for t in tids for x in L.s_coords(t)]
        o = [x for t in tids for x in L.o_coords(t)]
        rows.append((w, _span(tids), _span(q for q, _ in s), _span(k for _, k in s),
                     _span(d for _, d in o)))
    return rows


# ---- §4-§6 copies, swizzle, ldmatrix -------------------------------------------------

def copy_table():
    """(thread, tile rows it copies gmem->smem, columns of each row)."""
    L = layouts()
    return [(t, sorted({r for r, _ in L.copy_coords(t)}), _span(c for _, c in L.copy_coords(t)))
            for t in COPY_THREADS]


def swizzle_table():
    """(row, col, row-major offset, swizzled offset) of Q in shared memory, in elements."""
    L = layouts()
    width = L.config.head_dim_padded
    return [(r, c, width * r + c, L.smem_offset("Q", r, c)) for r, c in SWIZZLE_EXAMPLES]


def swizzle_chunk_grid(rows=9):
    """(row, [physical 16-byte chunk that logical chunk j of the row lands in, for each j])."""
    L = layouts()
    vec, width = L.config.vector_elems, L.config.head_dim_padded
    table = L.swizzle_table("Q")
    return [(r, [int(table[r, j * vec] - width * r) // vec for j in range(width // vec)])
            for r in range(rows)]


def _bank_group(offset: int) -> int:
    """The 16-byte group (0..7) of a 128-byte shared-memory line that an element lands in."""
    return offset * layouts().config.elem_bytes // 16 % 8


def bank_table():
    """(lane, (row, col) it addresses in warp 0's first ldmatrix of Q, bank group row-major and
    swizzled)."""
    L = layouts()
    width = L.config.head_dim_padded
    rows = []
    for lane in range(8):
        r, c = L.ldmatrix_coords(lane, "Q")[0]
        rows.append((lane, (r, c), _bank_group(width * r + c),
                     _bank_group(L.smem_offset("Q", r, c))))
    return rows


def ldmatrix_table():
    """Per 8x8 matrix of warp 0's first ldmatrix.x4: (lanes, then for Q, K and V the rows that
    those lanes address and the column they start at)."""
    L = layouts()
    out = []
    for i in range(4):
        lanes = range(8 * i, 8 * i + 8)
        row = [lanes]
        for tensor in ("Q", "K", "V"):
            addr = [L.ldmatrix_coords(t, tensor)[0] for t in lanes]
            cols = {c for _, c in addr}
            if len(cols) != 1:
                raise AssertionError(f"the lanes of one {tensor} matrix start at several columns")
            row += [_span(r for r, _ in addr), cols.pop()]
        out.append(tuple(row))
    return out


def ldmatrix_count_table():
    """(tensor, register view, its mode sizes, ldmatrix.x4 per thread per round, values each)."""
    f = layouts().fragment_shapes
    return [(t, view, f[view], f[view][1] * f[view][2], f[view][0])
            for t, view in (("Q", "tXrQ"), ("K", "tXrK"), ("V", "tXrVt"))]


# ---- §7 MMA fragments ----------------------------------------------------------------

def lane_fragment_table():
    """(tid, w, lane, g, a, A rows, A dims of k-step 0, B key of n-atom 0, B dims of k-step 0,
    the first four S slots)."""
    L = layouts()
    rows = []
    for t in LANE_EXAMPLES:
        w, lane = divmod(t, WARP_SIZE)
        q, k = L.q_coords(t), L.k_coords(t)
        rows.append((t, w, lane, lane // 4, lane % 4, sorted({r for r, _ in q}),
                     sorted({d for _, d in q if d < MMA_K}),
                     sorted({key for key, _ in k if key < MMA_N}),
                     sorted({d for key, d in k if key < MMA_N and d < MMA_K}), L.s_coords(t)[:4]))
    return rows


def mma_count_table():
    """(GEMM, who, M, N, K, mma.sync issued); per-warp counts read off the fragment shapes."""
    L = layouts()
    c, f = L.config, L.fragment_shapes
    qk = f["tCrS"][1] * f["tCrS"][2] * f["tCrQ"][2]
    pv = f["tOrO"][1] * f["tOrO"][2] * f["tOrP"][2]
    rows_per_warp = c.block_m // c.num_warps
    return [("Q·Kᵀ", "CTA", c.block_m, c.block_n, c.head_dim_padded, qk * c.num_warps),
            ("Q·Kᵀ", "one warp", rows_per_warp, c.block_n, c.head_dim_padded, qk),
            ("P̃·V", "CTA", c.block_m, c.head_dim_padded, c.block_n, pv * c.num_warps),
            ("P̃·V", "one warp", rows_per_warp, c.head_dim_padded, c.block_n, pv),
            ("either", "one instruction", MMA_M, MMA_N, MMA_K, 1)]


FRAGMENTS = {
    "tCrQ": "A of Q·Kᵀ (fp16)", "tCrK": "B of Q·Kᵀ (fp16)", "tCrS": "C of Q·Kᵀ (fp32)",
    "tXrQ": "tCrQ seen by ldmatrix", "tXrK": "tCrK seen by ldmatrix",
    "tOrP": "A of P̃·V: the S registers in fp16", "tOrVt": "B of P̃·V (fp16)",
    "tXrVt": "tOrVt seen by ldmatrix.trans", "tOrO": "C of P̃·V (fp32)",
}


def fragment_table():
    """(register tensor, role, top-level mode sizes, CuTe layout, elements per thread)."""
    L = layouts()
    f, lay = L.fragment_shapes, L.fragment_layouts
    return [(n, role, f[n], lay[n], math.prod(f[n])) for n, role in FRAGMENTS.items()]


def pv_table(tid=0):
    """(k-step, keys of tid's P~ A slots, keys of its V B slots, output dims of its V B slots)."""
    L = layouts()
    p, v = L.p_coords(tid), L.v_coords(tid)
    np_, nv = len(p) // 4, len(v) // 4
    return [(h, sorted({k for _, k in p[np_ * h:np_ * (h + 1)]}),
             sorted({k for k, _ in v[nv * h:nv * (h + 1)]}),
             sorted({d for _, d in v[nv * h:nv * (h + 1)]})) for h in range(4)]


# ---- §8-§10 mask, reductions, online softmax --------------------------------------------

def causal_table():
    """(lane, keys it holds, keys kept for its first query, keys kept for its second query)
    on the diagonal block of query block 0."""
    L = layouts()
    rows = []
    for lane in range(4):
        first, second = L.causal_keep(lane, m_block=0, n_block=0).values()
        rows.append((lane, L.s_rowcol(lane)[0][1], first, second))
    return rows


def causal_hand_table():
    """(query, raw scores with the future masked, causal O, causal L) of the hand example."""
    s = np.asarray(HAND_Q, dtype=np.float64) @ np.asarray(HAND_K, dtype=np.float64).T
    keep = visible_mask(len(HAND_Q), len(HAND_K), causal=True)
    o, lse = attention(HAND_Q, HAND_K, HAND_V, scale=HAND_SCALE, causal=True)
    return [(q, tuple(int(x) if k else -math.inf for x, k in zip(s[q], keep[q])),
             tuple(map(_exact, o[q])), _ln(lse[q])) for q in range(len(HAND_Q))]


def quad_table():
    """(warp, g, threads of the quad, query of row 0, query of row 1, XOR partners of its first
    thread) for the eight quads of warp 0, the first of warp 1 and the last of warp 3."""
    L = layouts()
    rows = []
    for t in [4 * g for g in range(8)] + [32, 124]:
        (q0, _), (q1, _) = L.s_rowcol(t)
        rows.append((t // WARP_SIZE, t % WARP_SIZE // 4, _span(L.reduce_group(t)), q0, q1,
                     L.quad_partners(t)))
    return rows


def quad_columns_table():
    """(lane, its keys below block_n/2, its keys from block_n/2 on), the same for both rows."""
    L = layouts()
    half = L.config.block_n // 2
    return [(lane, [k for k in keys if k < half], [k for k in keys if k >= half])
            for lane, keys in ((t, L.s_rowcol(t)[0][1]) for t in range(4))]


def max_example_table():
    """(lane, its own max, after each XOR step) for MAX_EXAMPLE_ROW held by quad 0."""
    steps = layouts().reduce_steps(MAX_EXAMPLE_ROW, tid=0, op="max")
    return [(lane, *(s[lane] for s in steps)) for lane in range(4)]


def sum_example_table():
    """(lane, its partial sum, after each XOR step) for SUM_EXAMPLE."""
    steps = layouts().allreduce_steps(dict(enumerate(SUM_EXAMPLE)), op="sum")
    return [(lane, *(s[lane] for s in steps)) for lane in range(4)]


def register_state_table():
    """(register tensor in the kernel, values per thread, what they are)."""
    L = layouts()
    rows = len(L.s_rowcol(0))
    return [("OnlineSoftmax.row_max", rows, "m of each of the thread's rows (same in the quad)"),
            ("OnlineSoftmax.row_sum", rows, "the thread's share of ℓ of each row"),
            ("acc_S (tCrS)", len(L.s_coords(0)), "this round's scores, then P̃ in place (fp32)"),
            ("rP (tOrP)", len(L.p_coords(0)), "P̃ converted to fp16: the A operand of P̃·V"),
            ("acc_O (tOrO)", len(L.o_coords(0)), "the thread's share of the numerator O (fp32)")]


def rescale_table():
    """(query, m before, m after, alpha, l before, alpha*l before, row sum of P~, l after)
    of the hand example's second round."""
    _, _, (st1, st2) = _hand_run()
    return [(q, _exact(st1["m"][q]), _exact(st2["m"][q]), _exact(st2["alpha"][q]),
             _exact(st1["l"][q]), _exact(st2["alpha"][q] * st1["l"][q]), _exact(st2["p"][q].sum()),
             _exact(st2["l"][q])) for q in range(len(HAND_Q))]


def lse_table():
    """(query, m, l, s*m + ln l, log-sum-exp of s*S computed directly)."""
    _, lse, states = _hand_run()
    s = HAND_SCALE * (np.asarray(HAND_Q, dtype=np.float64) @ np.asarray(HAND_K, dtype=np.float64).T)
    direct = np.log(np.exp(s).sum(axis=1))
    return [(q, _exact(states[-1]["m"][q]), _exact(states[-1]["l"][q]), _ln(lse[q]), _ln(direct[q]))
            for q in range(len(HAND_Q))]


# ---- §11 where things live -------------------------------------------------------------

def _pieces():
    from .. import reference, visibility
    from ..kernels.common import epilogue, gemm, mask, softmax, thread_mma
    from ..kernels.fwd import base as fwd_base, sm80 as fwd_sm80, tma as fwd_tma
    from ..kernels.sched import block_info, tile_scheduler
    from ..layouts import config, copies, mma, smem
    from . import introspect

    return [
        ("tile configuration (§3)", [config.TileConfig]),
        ("cp.async tiled copy (§4)", [copies.gmem_tiled_copy_qkv]),
        ("swizzled smem layouts (§5)",
         [smem.smem_layout_atom, smem.smem_layout_q, smem.smem_layout_kv]),
        ("ldmatrix copies (§6)", [copies.smem_tiled_copy_q, copies.smem_tiled_copy_k,
                                  copies.smem_tiled_copy_v]),
        ("TiledMMA, row view, S→A view, XOR offsets (§7-§9)",
         [mma.tiled_mma, mma.acc_rowcol_layout, mma.acc_to_a_layout, mma.row_reduce_offsets]),
        ("one thread's fragments and views (§7)", [thread_mma.thread_mma]),
        ("ldmatrix + mma.sync k-step loop (§6-§7)", [gemm.gemm_ldmatrix]),
        ("causal mask and sequence tail on S (§8)", [mask.apply_mask]),
        ("which tile a CTA computes (§3)", [tile_scheduler.SingleTileScheduler]),
        ("key blocks visited (§8)", [block_info.BlockInfo]),
        ("which key a query sees (§8)", [visibility.key_visible]),
        ("quad all-reduce, online softmax, LSE (§9-§10)",
         [softmax.quad_allreduce, softmax.OnlineSoftmax.step, softmax.OnlineSoftmax.rescale_O,
          softmax.OnlineSoftmax.finalize]),
        ("O through smem, LSE store (§10)", [epilogue.store_O, epilogue.store_LSE]),
        ("one K/V round, the loop over rounds, the epilogue",
         [fwd_base.FlashFwdBase.run_round, fwd_base.FlashFwdBase.run_rounds,
          fwd_base.FlashFwdBase.write_epilogue]),
        ("the sm80 kernel: cp.async loads, waits, GEMM views",
         [fwd_sm80.FlashFwdSm80.kernel, fwd_sm80.FlashFwdSm80.before_s,
          fwd_sm80.FlashFwdSm80.after_softmax]),
        ("the TMA kernel", [fwd_tma.FlashFwdTma]),
        ("host-side introspection (every table here)", [introspect.FlashLayouts]),
        ("float64 reference (§2, §10)", [reference.attention, reference.flash_forward_tiles]),
    ]


def source_table():
    """(piece, file, names defined there); names are resolved by import, so a rename fails here."""
    rows = []
    for piece, objs in _pieces():
        files = {o.__module__.replace(".", "/") + ".py" for o in objs}
        if len(files) != 1:
            raise AssertionError(f"{piece}: one file per row")
        path = files.pop()
        if not (_ROOT / path).is_file():
            raise AssertionError(f"{path} does not exist")
        rows.append((piece, path, [o.__qualname__ for o in objs]))
    return rows


def notebook_list():
    """(path from the repository root, what it shows); every notebook must exist."""
    out = []
    for name, what in NOTEBOOKS.items():
        path = f"notebooks/{name}"
        if not (_ROOT / path).is_file():
            raise AssertionError(f"{path} does not exist")
        out.append((path, what))
    return out
