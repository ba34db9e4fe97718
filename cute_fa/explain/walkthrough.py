"""docs/walkthrough.md: one forward pass of the fp16, d=64, 64x64-tile, 4-warp kernel.

The prose lives here; every table is computed when the document is rendered, from
`cute_fa.explain.FlashLayouts` (the layouts the kernels run) and `cute_fa.reference`
(the float64 hand example), so the document cannot drift from the code. Each table has
a function returning its rows as plain Python values; tests/test_walkthrough_doc.py
checks those rows against values typed in by hand.

    python -m cute_fa.explain.walkthrough > docs/walkthrough.md
"""

from __future__ import annotations

import functools
import math
import re
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

from ..kernels.fwd_tma import LAZY_RESCALE_THRESHOLD
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


# ---- formatting ---------------------------------------------------------------------

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


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return "−∞" if v == -math.inf else f"{v:g}"
    if isinstance(v, range):
        return f"{v.start}–{v.stop - 1}" if len(v) > 1 else str(v.start)
    if isinstance(v, tuple):
        return "(" + ", ".join(_fmt(x) for x in v) + ")"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v) or "none"
    return str(v)


def _table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _fill(text: str, **values) -> str:
    """Replace each <<name>> of the prose by its (formatted) value."""
    out = re.sub(r"<<(\w+)>>", lambda m: _fmt(values[m.group(1)]), text)
    if "<<" in out:
        raise ValueError("unfilled placeholder in the walkthrough prose")
    return out.strip("\n")


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
    from ..kernels import (epilogue, fwd_base, fwd_sm80, fwd_tma, gemm, mask, softmax,
                           thread_mma, work)
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
        ("which tile a CTA computes, key blocks visited (§3, §8)",
         [work.SingleTileScheduler, work.BlockInfo]),
        ("which key a query sees (§8)", [visibility.key_visible]),
        ("quad all-reduce, online softmax, LSE (§9-§10)",
         [softmax.quad_allreduce, softmax.OnlineSoftmax.step, softmax.OnlineSoftmax.rescale_O,
          softmax.OnlineSoftmax.finalize]),
        ("O through smem, LSE store (§10)", [epilogue.store_O, epilogue.store_LSE]),
        ("one K/V round, the loop over rounds, the epilogue",
         [fwd_base.FlashFwdBase._round, fwd_base.FlashFwdBase._rounds,
          fwd_base.FlashFwdBase._epilogue]),
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


# ---- the document ----------------------------------------------------------------------

SECTIONS = [
    "What attention computes", "Two rounds by hand", "Block, warp and lane",
    "Global to shared memory with cp.async", "The shared-memory swizzle",
    "Shared memory to registers with ldmatrix", "The MMA fragments", "The causal mask",
    "Quad reductions", "Online softmax across rounds", "Where each piece lives",
]


def _heading(n: int) -> str:
    return f"## {n}. {SECTIONS[n - 1]}"


def _anchor(n: int) -> str:
    return "#" + re.sub(r"[^\w\- ]", "", _heading(n)[3:].lower()).replace(" ", "-")


def _nb(name: str) -> str:
    return f"[`notebooks/{name}`](../notebooks/{name})"


def _code_list(names) -> str:
    return ", ".join(f"`{n}`" for n in names)


# The prose. <<name>> marks a value or a table that render() computes; the prose itself states
# formulas and reasons, never the content of a table.
PROSE = {
    "intro": """
# One forward pass of FlashAttention, block by block and lane by lane

This document follows one forward pass of this repository's sm80 FlashAttention-2 kernel in one
configuration: fp16, head_dim <<d>>, tiles of <<bm>> queries by <<bn>> keys, <<warps>> warps
(<<threads>> threads), one head whose Q, K and V have <<seqlen>> rows. At each step it answers the
question CuTe code hides best: which values does thread N hold, and with which threads does it
work?

Every table is generated by `cute_fa/explain/walkthrough.py` from `cute_fa.explain.FlashLayouts`, which
partitions identity tensors through the very TiledCopy and TiledMMA objects the kernels build,
and from the float64 reference `cute_fa.reference`; `tests/test_walkthrough_doc.py` checks each
table against values worked out by hand. Regenerate with
`python -m cute_fa.explain.walkthrough > docs/walkthrough.md`; code and notebooks cite it as
"docs/walkthrough.md §N".

<<toc>>
""",
    1: """
A row of Q is a query, a row of K a key, and row k of V is what key k contributes. For each
query, attention scores every key with a dot product, turns the scores into positive weights that
sum to one, and returns the weighted sum of the rows of V:

    S = Q Kᵀ,    P = softmax_row(s·S),    O = P V

Each row is normalised on its own. Standard attention scales by s = 1/√d
([Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)), <<scale>> here.

Storing S and P costs memory quadratic in the sequence length. FlashAttention
([Dao et al., 2022](https://arxiv.org/abs/2205.14135)) never stores them: a CTA keeps one block of
queries on chip, streams K and V past it a block at a time, and carries only a few values per
query row from block to block. The notation is that of Algorithm 1 of FlashAttention-2
([Dao, 2023](https://arxiv.org/abs/2307.08691)), with the scale written out:

- N, d: sequence length, head dimension. B_r, B_c: query rows per block, keys per round
  (`block_m`, `block_n` of `TileConfig`).
- j = 1 … T_c, T_c = ⌈N / B_c⌉: the K/V rounds (the code counts key blocks `n_block` from 0).
- S⁽ʲ⁾ = Q Kⱼᵀ: the round's raw scores, before the scale.
- m⁽ʲ⁾: the running row max of the raw scores. The kernels keep the max unscaled and weigh a score
  by exp(s·(S − m)), the same as taking the max of s·S since s > 0.
- P̃⁽ʲ⁾ = exp(s·(S⁽ʲ⁾ − m⁽ʲ⁾)): the round's weights, not normalised (P is the normalised whole).
- ℓ⁽ʲ⁾ and O⁽ʲ⁾: the running row sum of the weights and the running numerator Σ weight × V row,
  both relative to m⁽ʲ⁾. Only at the end does O⁽ᵀᶜ⁾ / ℓ⁽ᵀᶜ⁾ become O.
- L = s·m + ln ℓ: each row's log-sum-exp (LSE), which the kernels can also return.
""",
    2: """
The recurrence is easiest to follow on numbers small enough to check by hand: two queries, four
keys of dimension 2, <<hand_bn>> keys per round and, for this example only, s = ln 2, so that
exp(s·x) = 2ˣ and every weight is a power of two. No mask yet (§8). The inputs:

<<hand_inputs>>

The raw scores S = Q Kᵀ; round 1 sees the first two keys, round 2 the last two:

<<hand_scores>>

Per row, a round raises the running max m to cover its scores; computes α = exp(s·(m_old − m_new)),
which moves everything accumulated so far onto the new max; turns its scores into weights
P̃ = exp(s·(S − m_new)); and updates ℓ ← α·ℓ + rowsum P̃ and O ← α·O + P̃ Vⱼ. Subtracting the max
leaves the softmax unchanged (numerator and denominator both gain the factor exp(−s·m)) and keeps
the exponentials in range. The state starts at m = −∞, ℓ = 0, O = 0, so round 1 has α = 0 and
nothing to rescale. The state after each round, as `cute_fa.reference.flash_forward_tiles`
computes it in float64, shown as the exact fractions those floats are:

<<hand_rounds>>

Round 2 is why the rescale exists: both rows meet a larger score, so α < 1 shrinks the old ℓ and
the old O before the new weights are added. Scaling ℓ alone, or adding unscaled numerators, would
mix sums taken against two different maxima. After the last round each row is divided once by its
ℓ, which gives the attention computed directly from the whole score matrix
(`cute_fa.reference.attention`):

<<hand_output>>

No round was normalised on its own; the rounds were merged through m, ℓ and O and divided once. In
general, for round j of a query block:

    m⁽ʲ⁾ = max(m⁽ʲ⁻¹⁾, rowmax S⁽ʲ⁾)          α⁽ʲ⁾ = exp(s·(m⁽ʲ⁻¹⁾ − m⁽ʲ⁾))
    P̃⁽ʲ⁾ = exp(s·(S⁽ʲ⁾ − m⁽ʲ⁾))             ℓ⁽ʲ⁾ = α⁽ʲ⁾·ℓ⁽ʲ⁻¹⁾ + rowsum P̃⁽ʲ⁾
    O⁽ʲ⁾ = diag(α⁽ʲ⁾)·O⁽ʲ⁻¹⁾ + P̃⁽ʲ⁾ Vⱼ      and at the end  O = diag(ℓ)⁻¹ O⁽ᵀᶜ⁾,  L = s·m + ln ℓ

This is the online normaliser of [Milakov and Gimelshein (2018)](https://arxiv.org/abs/1805.02867)
carried across blocks. <<nb1>> runs the rounds step by step, the causal variant, and a last round
shorter than B_c.
""",
    3: """
From here on the configuration is the real one:

<<config>>

**Blocks.** The grid has one CTA per query block, head and batch. A CTA loads its <<bm>> rows of Q
once, keeps them in shared memory and visits the key blocks one round each. The kernels walk the
key blocks from the last one down, so that the rounds that may need a mask come first (§8); the
online softmax does not care about the order. Under causal masking a CTA skips the key blocks
wholly in the future of all its queries and masks element by element only those the diagonal
crosses. For one head of <<seqlen>> rows:

<<ctas>>

**Warps.** The <<warps>> warps split the CTA's query rows into slabs of <<warp_rows>>; each warp
covers every key of the round and every output dimension, so a softmax row never leaves its warp
and no reduction crosses warps. Read off the S and O accumulators of each warp's threads:

<<warps_table>>

**Lanes.** Write w = tid / 32 and lane = tid mod 32; the MMA layout splits the lane again into
g = lane / 4, which picks rows, and a = lane mod 4, which picks columns (integer divisions). The
four lanes sharing g form a *quad*: they hold the same two rows of S and O, and a row max or row
sum is a reduction within a quad (§9). Coordinates are tile-local: add <<bm>>·m_block to a query
and <<bn>>·n_block to a key for the global position.
""",
    4: """
A tile first travels from global to shared memory with `cp.async`, <<vec>> fp16 values (16 bytes)
per thread per instruction, without passing through registers. The tiled copy
(`copies.gmem_tiled_copy_qkv`) arranges the threads as a <<rows_per_pass>> × <<per_row>> grid:
<<per_row>> neighbouring threads share a row, a pass covers <<rows_per_pass>> rows and <<passes>>
passes cover the tile, so thread t copies columns <<vec>>·(t mod <<per_row>>) onwards of rows
t / <<per_row>> + <<rows_per_pass>>·r. Q, K and V tiles all use this partition:

<<copy>>

The copier is rarely a consumer: thread 0's rows lie in the slabs of every warp (§3). That is
the point of staging through shared memory: the copy partition is chosen for wide, coalesced
global loads, and the MMA reads the tile later in its own partition (§6). The kernel closes a
batch of copies with `cp_async_commit_group`, waits with `cp_async_wait_group(0)`, and a CTA
barrier makes the tile visible to all warps. Rows past the sequence end are zero-filled.
""",
    5: """
Shared memory has 32 banks of 4 bytes: a 128-byte line spans them all, in eight 16-byte *bank
groups*. `ldmatrix` (§6) reads an 8×8 matrix as eight 16-byte rows at once. With 128-byte tile
rows stored row-major, the eight rows of a matrix would sit in one bank group of eight lines and
the read would be serialised eight ways.

The tiles use `smem.smem_layout_atom` tiled to the tile shape: <<atom>>, a row-major atom of 8 rows
× 64 columns composed with Swizzle<3,3,3>, which XORs bits 6–8 of an element offset into bits
3–5. In words, the 16-byte chunk index is XORed with the row mod 8:

    offset(r, c) = 64·r + (c XOR 8·(r mod 8))

A value keeps its logical (row, col); only its place in memory moves. Element offsets of Q:

<<swizzle>>

The chunks of a row are permuted, never split, so each still suits a 16-byte `cp.async` store and
a 16-byte `ldmatrix` row. The physical chunk that logical chunk j of row r lands in:

<<chunks>>

The bank view: the eight rows addressed by warp 0's first `ldmatrix` of Q fall into
<<plain_groups>> bank group without the swizzle and into <<swz_groups>> different ones with it:

<<banks>>

Every copy into a tile and every read from it goes through this one layout, so a value is read
where it was written. K and V share Q's layout, and the output tile reuses Q's memory (§10).
<<nb3>> draws the bank map of whole tiles and checks head_dim 32 and 96, whose atoms are 32
columns wide.
""",
    6: """
`ldmatrix.x4` moves four 8×8 fp16 matrices from shared memory into a warp's registers in one
instruction. Each lane supplies the address of one 16-byte row (lanes 0–7 those of the first
matrix, and so on) and receives from each matrix the values that the MMA fragment layout assigns
to it, so the data arrive distributed as `mma.sync` wants them (§7). The copies are derived from
the TiledMMA (`make_tiled_copy_A` / `make_tiled_copy_B` in `copies.smem_tiled_copy_q`, `_k`, `_v`),
not written by hand. Row addresses of warp 0's first `ldmatrix.x4` of each tile:

<<ldsm>>

For Q the four matrices are the quarters of the 16 × 16 A block of a k-step; for K, two n8 atoms of
keys at both halves of the k-step. The other warps read Q <<warp_rows>> rows further down each, and
the same K and V rows, since every warp needs every key. K is stored (key, d), exactly the B
operand of Q·Kᵀ (CuTe's B is N × K), so it needs no transposed copy. V is stored (key, d) too, but
P̃·V wants its B as (d, key): V is read with `ldmatrix.trans` through the view sVt(d, key) of the
same swizzled memory (`smem.transposed_v`).

Each copy writes a *retiled* view of an MMA fragment: `retile` regroups the same registers into
the shape one `ldmatrix` fills, copying nothing. Per thread and round (`gemm.gemm_ldmatrix` issues
them one k-step or one instruction ahead of the MMAs that consume them):

<<ldsm_count>>
""",
    7: """
The tensor cores run `mma.sync.aligned.m16n8k16`: a warp multiplies a 16 × 16 A by a 16 × 8 B (CuTe
keeps B as N × K, 8 × 16) and adds the product into a 16 × 8 fp32 C. In Q·Kᵀ, M is the query, N
the key and K the sum over d (the GEMM's reduction axis, not the matrix K). The TiledMMA
(`mma.tiled_mma`) stacks the warps along M; a warp repeats the instruction over the keys in n8
atoms and over d in k16 steps, accumulating the k-steps into one C:

<<mma_counts>>

The whole warp executes each instruction, but a lane holds a sliver of its operands, <<a_vals>> fp16
values of A, <<b_vals>> of B and <<c_vals>> fp32 values of C, fixed by the lane alone. With
w = tid / 32, g = lane / 4, a = lane mod 4, n8 atom j = 0 … 7 and k-step h = 0 … 3:

    A (Q):  query = 16w + {g, g+8}    d   = 16h + {2a, 2a+1, 2a+8, 2a+9}
    B (K):  key   = 8j + g            d   = 16h + {2a, 2a+1, 2a+8, 2a+9}
    C (S):  query = 16w + {g, g+8}    key = 8j + {2a, 2a+1}

The first instruction of a round (keys 0–<<n_last>>, d 0–<<k_last>>) for a few threads:

<<lanes>>

Over a round a thread thus holds rows g and g+8 of its warp's slab of S and, in each, two
neighbouring keys of every n8 atom: <<s_slots>> fp32 values. Its register tensors, with their
top-level modes (values of one atom, repeats along M or N, k-steps):

<<fragments>>

**P̃·V** reuses the TiledMMA with new roles: A is P̃(query, key), B is Vᵀ(d, key), C is O(query, d);
the k-steps walk the keys 16 at a time and the n8 atoms walk the output dimensions. The C layout
of two neighbouring n8 atoms of S holds, in the same thread, exactly what the A layout of one k16
step asks for. So after the softmax the fp32 scores are converted to fp16 (`rP`) and *viewed* as
the A operand (`mma.acc_to_a_layout`): P̃ never leaves the registers, with no shuffle and no trip
through shared memory. (The renderer checks, for every slot of all <<threads>> threads, that the
view gives the (query, key) the MMA expects.) Thread 0 in P̃·V:

<<pv>>

Its O accumulator holds queries <<lane0_rows>> at dims <<o_dims_lane0>>: the column pattern of S,
now over output dimensions. The rescale and the final division (§10) touch only these registers.
<<nb2>> draws the ownership grids of every operand.
""",
    8: """
Causal attention lets query q see only keys k ≤ q, aligned at the top left as in torch SDPA
(`causal_offset` moves the diagonal for other alignments). The rule is written once, in
`cute_fa/kernels/mask.py`, for the kernels, the reference and the introspection. It acts twice.

On whole blocks: a CTA does not visit the key blocks wholly in the future of all its queries
(`work.BlockInfo.n_block_max`; the causal column in §3), so their loads, Q·Kᵀ and P̃·V never happen.
Blocks wholly in the past need no mask. Only a block the diagonal crosses, here
n_block = m_block, is masked element by element (as is the last key block when the sequence
length is not a multiple of B_c): after its Q·Kᵀ, so the masked scores were computed anyway, and
before the row max.

On elements: a thread needs the global query and key of each of its scores. It views its
accumulator as rows × columns (`mma.acc_rowcol_layout`), here <<rowcol>>: the row coordinate
(mi, ·) picks row g or g+8, the column coordinate (b, nj) picks key 2a + b of n8 atom nj, and the
register slot of (mi, (b, nj)) is 2·mi + b + 4·nj, so a row is not a run of registers. The
score at (mi, (b, nj)) is query <<bm>>·m_block + 16w + g + 8·mi against key
<<bn>>·n_block + 2a + b + 8·nj. Lanes 0–3 on the diagonal block of query block 0:

<<causal>>

Between them the four lanes keep <<keep_first>> of query <<q_first>>'s keys and <<keep_second>> of
query <<q_second>>'s, and no lane needs another lane's data to decide. `mask.apply_mask`
computes one limit per row and compares it with column offsets that are compile-time constants
read from the same layout.

Masked scores become −∞, not 0: exp(s·(−∞ − m)) = 0 weighs nothing in ℓ or O, whereas a 0 would
get a positive weight and, in a row of negative scores, raise the max. Hence the mask precedes the
max. The hand example of §2 under the same rule: its second K/V block lies wholly in the future of
both queries, so a kernel would skip it, and in the first block the first query still loses the
key after it:

<<causal_hand>>
""",
    9: """
After the mask each row needs its max over all <<bn>> keys, and after the exponentials its sum. A
row is spread over the four lanes of a quad, <<keys_per_lane>> keys each, so a reduction has two
stages: each thread combines its own values, without communication; then the quad combines them
with two butterfly shuffles (`shfl.sync.bfly`), each lane reading the value of lane XOR 2, then of
lane XOR 1. The kernel does not hard-code the offsets: `mma.row_reduce_offsets` reads them off the
MMA atom's C layout as the lane bits whose flip keeps a lane on the same rows; here <<offsets>>.
The quads, their rows, and the partners of their first thread:

<<quads>>

With lane = 4g + a, XOR 2 and XOR 1 flip only bits of a, so quads never mix and the
<<quads_per_warp>> quads of a warp reduce at the same time; a thread's two rows are reduced
separately. The keys each lane of quad 0 holds, the same in both rows:

<<quad_cols>>

A worked max: a row whose first keys score <<max_head>> and whose other <<max_rest_n>> keys score
<<max_rest>>. Each lane takes the max of its own keys, then the two shuffles run:

<<max_example>>

After XOR 2 a lane has the max over its own and its partner's keys, <<half_keys>> in all; after
XOR 1, reading the partner's already combined value, the max over the whole row. It is an
all-reduce: all four lanes end with the row max, so each computes its own weights
exp(s·(S − m)) without waiting for a broadcast. One fp32 value per row crosses lanes; the scores
stay put. The row sum is the same butterfly with + for max; with partial sums <<sum_inputs>> in
lanes 0–3:

<<sum_example>>

The kernels all-reduce the max every round but the sum only once, at the end
(`OnlineSoftmax.finalize`). Each thread keeps its share of ℓ, the sum of its own weights in the
row, rescaled by the same α as its share of O; α is equal across the quad, which shares m, so the
shares stay consistent and one reduction at the end gives ℓ. This also avoids a trap of reducing
every round: an all-reduced ℓ must stay out of the next round's reduction, or it would be counted
once per lane.
""",
    10: """
What a thread carries from round to round:

<<state>>

In a round (`FlashFwdBase._round`), after Q·Kᵀ and the mask, `OnlineSoftmax.step` works on the
row view of S, and `OnlineSoftmax.rescale_O` then applies the factors it returns to O's row view.
For each of the thread's rows:

1. m_new = max(m_old, its scores), then the quad max all-reduce (§9); with m_old taking part, this
   is max(m_old, the round's whole row).
2. P̃ = exp(s·(S − m_new)) for its scores, in place in the S registers; masked −∞ become 0.
3. α = exp(s·(m_old − m_new)); its share of ℓ becomes α·ℓ + its sum of P̃, and (`rescale_O`) its
   values of O are multiplied by α. In the first round m_old = −∞, so α = 0 on an ℓ and O of 0: no
   special case.

The S registers are then converted to fp16 and P̃·V adds the round's share into O (§7). Between
the softmax and P̃·V the kernel waits for the V tile, loading since before Q·Kᵀ, and starts the
next K tile, which loads under P̃·V.

One α serves ℓ and O: an old weight exp(s·(S − m_old)) times exp(s·(m_old − m_new)) is
exp(s·(S − m_new)), the weight it would have had against the new max. Every term of ℓ and of O
carries one such weight, so both take the same α, which is 1 when the max does not move. Round 2
of §2 in these terms:

<<rescale>>

The exponentials are exp2: the kernels pass scale_log2 = s·log₂e and evaluate
exp2(S·scale_log2 − m·scale_log2), one fused multiply-add per score. The TMA kernel may also skip
a rescale while a row's max has grown by at most <<lazy>> in log2 units (`lazy_threshold`): the
weights are then at most 2 to that power, harmless in fp32 sums and in fp16 P̃, and a thread saves
its <<o_slots>> multiplies of O; one warp vote per round keeps the branch uniform.

**The end.** After the last round `OnlineSoftmax.finalize` all-reduces each row's ℓ over the
quad, multiplies the thread's O by 1/ℓ and forms L = s·m + ln ℓ. `epilogue.store_O` converts O to
fp16 and writes it through shared memory, reusing Q's tile: the MMA layout scatters a row over a
quad in pairs, and the detour lets each thread store whole 16-byte runs with the partition of §4.
One lane per quad writes the LSE of its rows (`epilogue.store_LSE`). For the hand example, L equals
the log-sum-exp of the scaled scores taken directly:

<<lse>>
""",
    11: """
The pieces of this document in the code (each name is resolved by import when the document is
rendered, so a rename fails the render):

<<sources>>

Compared with the CuTe C++ kernel of
[tiny-flash-attention](https://github.com/66RING/tiny-flash-attention) (sm80, fp16), whose
structure this document follows, these kernels choose differently in a few places: key blocks
run from the last one down, so the masked rounds come first; the wait for V comes after the
softmax, not before it; the exponentials are exp2 with the scale folded into one multiply-add;
and the row sum is all-reduced once at the end rather than every round (§9). The TMA kernel
(`fwd_tma.py`, <<nb4>>) replaces the `cp.async` copies of §4 with tensor copies into a ring of K/V
stages; from shared memory on it runs the same code.

The notebooks print and draw the same layouts; `tests/test_notebooks.py` runs them:

<<notebooks>>

Without a GPU, `python -m cute_fa` prints the per-lane tour of this configuration
(`cute_fa/explain/tour.py`), and `python -m cute_fa layouts --tid N` describes any one thread.
""",
}


def render() -> str:
    L = layouts()
    c = L.config
    if any(L.p_coords(t) != L.pv_a_coords(t) for t in range(c.num_threads)):
        raise AssertionError("the S->A register view does not give the A operand of P@V")
    shape, stride = L.s_rowcol_layout
    frags = L.fragment_shapes
    lane0_rows = [q for q, _ in L.s_rowcol(0)]
    lane0_keys = L.s_rowcol(0)[0][1]
    steps = ["local"] + [f"after XOR {o}" for o in L.reduce_offsets]
    chunks = [str(j) for j in range(c.head_dim_padded // c.vector_elems)]
    half = c.block_n // 2
    values = dict(
        toc="\n".join(f"{n}. [{t}]({_anchor(n)})" for n, t in enumerate(SECTIONS, start=1)),
        nb1=_nb("01_online_softmax_by_hand.ipynb"), nb2=_nb("02_fragments_qk_pv.ipynb"),
        nb3=_nb("03_swizzle_and_copy.ipynb"), nb4=_nb("04_tma_variant.ipynb"),
        d=c.head_dim, bm=c.block_m, bn=c.block_n, threads=c.num_threads, warps=c.num_warps,
        seqlen=SEQLEN, warp_rows=c.block_m // c.num_warps, vec=c.vector_elems,
        per_row=c.copy_threads_per_row, rows_per_pass=c.copy_rows_per_pass,
        passes=c.block_m // c.copy_rows_per_pass, atom=f"`{L._t['swizzle_atom']}`",
        rowcol=f"`{_fmt(shape)}:{_fmt(stride)}`".replace(" ", ""),
        offsets=" then ".join(f"XOR {o}" for o in L.reduce_offsets),
        a_vals=frags["tCrQ"][0], b_vals=frags["tCrK"][0], c_vals=frags["tCrS"][0],
        n_last=MMA_N - 1, k_last=MMA_K - 1, s_slots=len(L.s_coords(0)),
        o_slots=len(L.o_coords(0)), o_dims_lane0=sorted({d for _, d in L.o_coords(0)}),
        lane0_rows=" and ".join(map(str, lane0_rows)), q_first=lane0_rows[0],
        q_second=lane0_rows[1], keys_per_lane=len(lane0_keys), half_keys=2 * len(lane0_keys),
        quads_per_warp=WARP_SIZE // len(L.reduce_group(0)),
        scale=config_table()[-1][1], hand_bn=HAND_BLOCK_N,
        plain_groups=len({b[2] for b in bank_table()}),
        swz_groups=len({b[3] for b in bank_table()}),
        keep_first=sum(len(r[2]) for r in causal_table()),
        keep_second=sum(len(r[3]) for r in causal_table()),
        max_head=MAX_EXAMPLE_ROW[:8], max_rest_n=len(MAX_EXAMPLE_ROW) - 8,
        max_rest=MAX_EXAMPLE_ROW[8], sum_inputs=SUM_EXAMPLE, lazy=LAZY_RESCALE_THRESHOLD,
        notebooks="\n".join(f"- [`{p}`](../{p}): {w}" for p, w in notebook_list()),
    )
    tables = dict(
        hand_inputs=(["row", "Q (query)", "K (key)", "V (key)"], hand_input_table()),
        hand_scores=(["query \\ key"] + [str(k) for k in range(len(HAND_K))],
                     [(q, *row) for q, row in hand_scores()]),
        hand_rounds=(["round j", "keys", "query", "m⁽ʲ⁾", "α⁽ʲ⁾", "P̃⁽ʲ⁾ row", "ℓ⁽ʲ⁾",
                      "P̃⁽ʲ⁾ Vⱼ row", "O⁽ʲ⁾ row"], hand_rounds_table()),
        hand_output=(["query", "O⁽²⁾", "ℓ⁽²⁾", "O = O⁽²⁾ / ℓ⁽²⁾", "softmax(sS) V, direct", "L"],
                     hand_output_table()),
        config=(["setting", "value"], config_table()),
        ctas=(["m_block", "queries", "key blocks (kernel order)", "… causal",
               "… masked (causal)"], cta_table()),
        warps_table=(["warp w", "threads", "query rows of S and O", "keys of S", "dims of O"],
                     warp_rows_table()),
        copy=(["thread", "rows", "columns"], copy_table()),
        swizzle=(["row", "col", "row-major offset", "swizzled offset"], swizzle_table()),
        chunks=(["row \\ logical chunk"] + chunks, [(r, *js) for r, js in swizzle_chunk_grid()]),
        banks=(["lane", "(row, col) addressed", "bank group, row-major", "bank group, swizzled"],
               bank_table()),
        ldsm=(["lanes", "Q rows", "Q col", "K rows (keys)", "K col (d)", "V rows (keys)",
               "V col (d)"], ldmatrix_table()),
        ldsm_count=(["tensor", "view", "modes", "ldmatrix.x4 per round", "values each"],
                    [(t, f"`{v}`", *rest) for t, v, *rest in ldmatrix_count_table()]),
        lanes=(["tid", "w", "lane", "g", "a", "A: queries", "A: d (k-step 0)", "B: key (atom 0)",
                "B: d (k-step 0)", "C: first four slots (query, key)"], lane_fragment_table()),
        mma_counts=(["GEMM", "who", "M", "N", "K", "mma.sync"], mma_count_table()),
        fragments=(["tensor", "role", "modes", "layout", "values"],
                   [(n, r, m, f"`{lay}`", e) for n, r, m, lay, e in fragment_table()]),
        pv=(["k-step h", "P̃ keys (A)", "V keys (B)", "V dims (B)"], pv_table()),
        causal=(["lane", "keys held"] + [f"query {q} keeps" for q in lane0_rows], causal_table()),
        causal_hand=(["query", "masked scores", "causal O", "L"], causal_hand_table()),
        quads=(["warp", "g", "threads", "row 0 (mi=0)", "row 1 (mi=1)", "partners"], quad_table()),
        quad_cols=(["lane", f"keys 0–{half - 1}", f"keys {half}–{c.block_n - 1}"],
                   quad_columns_table()),
        max_example=(["lane"] + steps, max_example_table()),
        sum_example=(["lane"] + steps, sum_example_table()),
        state=(["register tensor", "values per thread", "holds"], register_state_table()),
        rescale=(["query", "m⁽¹⁾", "m⁽²⁾", "α⁽²⁾", "ℓ⁽¹⁾", "α⁽²⁾ℓ⁽¹⁾", "rowsum P̃⁽²⁾", "ℓ⁽²⁾"],
                 rescale_table()),
        lse=(["query", "m⁽²⁾", "ℓ⁽²⁾", "L = s·m + ln ℓ", "ln Σₖ exp(s·S), direct"], lse_table()),
        sources=(["piece", "file", "names"],
                 [(p, f"[`{f}`](../{f})", _code_list(n)) for p, f, n in source_table()]),
    )
    values.update({name: _table(header, rows) for name, (header, rows) in tables.items()})
    parts = [_fill(PROSE["intro"], **values)]
    for n in range(1, len(SECTIONS) + 1):
        parts.append(_heading(n) + "\n\n" + _fill(PROSE[n], **values))
    return "\n\n".join(parts) + "\n"


def main() -> None:
    sys.stdout.buffer.write(render().encode("utf-8"))


if __name__ == "__main__":
    main()
