"""docs/walkthrough.md: the committed file is what `cute_fa.explain.walkthrough.render()` produces, and
every table it shows holds the values worked out by hand.

Expected values are typed in from the hand example's arithmetic and from the layout formulas
(w = tid/32, lane = tid%32, g = lane/4, a = lane%4; cp.async: row = tid/8 + 16r,
col = 8*(tid%8) + v; swizzle: offset = 64r + (c XOR 8*(r%8))), never produced by the code under
test.
"""

import math
import re
from fractions import Fraction as F
from pathlib import Path

import pytest

from cute_fa.explain import walkthrough as wt

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "walkthrough.md"
INF = -math.inf


def test_committed_document_is_rendered():
    committed = DOC.read_bytes().decode("utf-8")
    assert wt.render() == committed, (
        "docs/walkthrough.md is stale: regenerate with "
        "`python -m cute_fa.explain.walkthrough > docs/walkthrough.md`")


def test_sections_are_numbered_in_order():
    headings = re.findall(r"^## (\d+)\. (.+)$", DOC.read_text(encoding="utf-8"), re.M)
    assert [int(n) for n, _ in headings] == list(range(1, 12))
    assert [t for _, t in headings][:3] == ["What attention computes", "Two rounds by hand",
                                           "Block, warp and lane"]


def test_citations_point_at_existing_sections():
    # every "docs/walkthrough.md §N" (or §N-§M) in code, tests and notebooks names a real section
    n_sections = len(re.findall(r"^## \d+\. ", DOC.read_text(encoding="utf-8"), re.M))
    files = [*ROOT.glob("cute_fa/**/*.py"), *ROOT.glob("tests/*.py"),
             *ROOT.glob("notebooks/*.ipynb")]
    cited = set()
    for path in files:
        text = path.read_text(encoding="utf-8")
        for ref in re.findall(r"walkthrough\.md (§\d+(?:-§\d+)?)", text):
            cited.update(int(n) for n in re.findall(r"\d+", ref))
    assert cited, "nothing cites docs/walkthrough.md"
    assert all(1 <= n <= n_sections for n in cited), sorted(cited)


# ---- §2 the hand example ------------------------------------------------------------------

def test_hand_inputs_and_scores():
    assert wt.hand_input_table() == [(0, (1, 0), (0, 1), (1, 0)), (1, (0, 1), (1, 0), (0, 1)),
                                     (2, None, (2, 1), (1, 1)), (3, None, (0, 2), (2, 0))]
    # S(0, 2) = (1,0).(2,1) = 2, S(1, 3) = (0,1).(0,2) = 2
    assert wt.hand_scores() == [(0, [0, 1, 2, 0]), (1, [1, 0, 1, 2])]


def test_hand_rounds():
    # round 1: both rows have max 1; weights 2^(S-1); l = 3/2; O = P~ V[0:2]
    # round 2: max 2, alpha = 2^(1-2) = 1/2; l = 3/4 + 5/4 = 2 and 3/4 + 3/2 = 9/4;
    # O = O1/2 + P~ V[2:4], e.g. query 0: (1/4,1/2) + 1*(1,1) + 1/4*(2,0) = (7/4, 3/2)
    assert wt.hand_rounds_table() == [
        (1, range(0, 2), 0, 1, 0, (F(1, 2), 1), F(3, 2), (F(1, 2), 1), (F(1, 2), 1)),
        (1, range(0, 2), 1, 1, 0, (1, F(1, 2)), F(3, 2), (1, F(1, 2)), (1, F(1, 2))),
        (2, range(2, 4), 0, 2, F(1, 2), (1, F(1, 4)), 2, (F(3, 2), 1), (F(7, 4), F(3, 2))),
        (2, range(2, 4), 1, 2, F(1, 2), (F(1, 2), 1), F(9, 4), (F(5, 2), F(1, 2)), (3, F(3, 4))),
    ]


def test_hand_output_matches_direct_attention():
    # O = O2 / l2: (7/4, 3/2)/2 and (3, 3/4)/(9/4); L = s*m + ln l = ln 4 + ln 2, ln 4 + ln 9/4
    assert wt.hand_output_table() == [
        (0, (F(7, 4), F(3, 2)), 2, (F(7, 8), F(3, 4)), (F(7, 8), F(3, 4)), "ln 8"),
        (1, (3, F(3, 4)), F(9, 4), (F(4, 3), F(1, 3)), (F(4, 3), F(1, 3)), "ln 9"),
    ]


# ---- §3 the configuration ------------------------------------------------------------------

def test_config_table():
    assert [v for _, v in wt.config_table()] == [
        64, 64, 64, 128, 4, "float16", "mma.sync m16n8k16",
        3 * 64 * 64 * 2,  # Q, K and V tiles of 64x64 fp16
        F(1, 8),  # 1/sqrt(64)
    ]


def test_cta_table():
    # key blocks walked last first; under causal, query block 0 sees key block 0 only
    assert wt.cta_table() == [(0, range(0, 64), [1, 0], [0], [0]),
                              (1, range(64, 128), [1, 0], [1, 0], [1])]


def test_warp_rows_table():
    assert wt.warp_rows_table() == [
        (w, range(32 * w, 32 * w + 32), range(16 * w, 16 * w + 16), range(0, 64), range(0, 64))
        for w in range(4)]


# ---- §4-§6 copies, swizzle, ldmatrix ------------------------------------------------------

def test_copy_table():
    assert wt.copy_table() == [(0, [0, 16, 32, 48], range(0, 8)),
                               (7, [0, 16, 32, 48], range(56, 64)),
                               (8, [1, 17, 33, 49], range(0, 8)),
                               (32, [4, 20, 36, 52], range(0, 8)),
                               (127, [15, 31, 47, 63], range(56, 64))]


def test_swizzle_table():
    assert wt.swizzle_table() == [(0, 0, 0, 0), (0, 8, 8, 8), (1, 0, 64, 72), (1, 8, 72, 64),
                                  (7, 56, 504, 448), (8, 0, 512, 512)]


def test_swizzle_chunk_grid():
    grid = wt.swizzle_chunk_grid()
    assert grid[1] == (1, [1, 0, 3, 2, 5, 4, 7, 6])
    assert grid[7] == (7, [7, 6, 5, 4, 3, 2, 1, 0])
    assert grid == [(r, [j ^ (r % 8) for j in range(8)]) for r in range(9)]


def test_bank_table():
    # lane l addresses row l, col 0: row-major at byte 128*l (group 0), swizzled at
    # element 64*l + 8*l, byte 144*l, group 9*l % 8 = l
    assert wt.bank_table() == [(lane, (lane, 0), 0, lane) for lane in range(8)]


def test_ldmatrix_table():
    assert wt.ldmatrix_table() == [
        # lanes, Q rows, Q col, K keys, K d, V keys, V d
        (range(0, 8), range(0, 8), 0, range(0, 8), 0, range(0, 8), 0),
        (range(8, 16), range(8, 16), 0, range(0, 8), 8, range(8, 16), 0),
        (range(16, 24), range(0, 8), 8, range(8, 16), 0, range(0, 8), 8),
        (range(24, 32), range(8, 16), 8, range(8, 16), 8, range(8, 16), 8),
    ]


def test_ldmatrix_count_table():
    # Q: one x4 per k-step; K and V: 64 keys / 16 per x4 = 4 per k-step, 4 k-steps
    assert wt.ldmatrix_count_table() == [("Q", "tXrQ", (8, 1, 4), 4, 8),
                                         ("K", "tXrK", (8, 4, 4), 16, 8),
                                         ("V", "tXrVt", (8, 4, 4), 16, 8)]


# ---- §7 MMA fragments ---------------------------------------------------------------------

def test_lane_fragment_table():
    expected = []
    for tid in (0, 1, 4, 5, 33, 127):
        w, lane = tid // 32, tid % 32
        g, a = lane // 4, lane % 4
        q = 16 * w + g
        dims = [2 * a, 2 * a + 1, 2 * a + 8, 2 * a + 9]
        expected.append((tid, w, lane, g, a, [q, q + 8], dims, [g], dims,
                         [(q, 2 * a), (q, 2 * a + 1), (q + 8, 2 * a), (q + 8, 2 * a + 1)]))
    assert wt.lane_fragment_table() == expected
    # the walkthrough's lane 0: queries 0 and 8 at d 0,1,8,9; key 0; S(0,0),(0,1),(8,0),(8,1)
    assert wt.lane_fragment_table()[0][5:] == ([0, 8], [0, 1, 8, 9], [0], [0, 1, 8, 9],
                                               [(0, 0), (0, 1), (8, 0), (8, 1)])


def test_mma_count_table():
    # a warp: 8 n8 atoms x 4 k16 steps = 32 mma.sync per GEMM; the CTA: 4 warps
    assert wt.mma_count_table() == [("Q·Kᵀ", "CTA", 64, 64, 64, 128),
                                    ("Q·Kᵀ", "one warp", 16, 64, 64, 32),
                                    ("P̃·V", "CTA", 64, 64, 64, 128),
                                    ("P̃·V", "one warp", 16, 64, 64, 32),
                                    ("either", "one instruction", 16, 8, 16, 1)]


def test_fragment_table():
    rows = {name: (modes, layout, count) for name, _, modes, layout, count in wt.fragment_table()}
    assert {n: (m, c) for n, (m, _, c) in rows.items()} == {
        "tCrQ": ((8, 1, 4), 32), "tCrK": ((4, 8, 4), 128), "tCrS": ((4, 1, 8), 32),
        "tXrQ": ((8, 1, 4), 32), "tXrK": ((8, 4, 4), 128), "tOrP": ((8, 1, 4), 32),
        "tOrVt": ((4, 8, 4), 128), "tXrVt": ((8, 4, 4), 128), "tOrO": ((4, 1, 8), 32),
    }
    # C: the atom's 2x2 values, 1 M repeat, 8 n8 atoms 4 registers apart
    assert rows["tCrS"][1] == rows["tOrO"][1] == "((2,2),1,8):((1,2),0,4)"
    # A of P@V: the C values of two neighbouring n8 atoms form one k16 step
    assert rows["tOrP"][1] == "(((2,2),2),1,4):(((1,2),4),0,8)"


def test_pv_table_of_thread_0():
    # k-step h of P@V covers keys 16h..16h+15; lane 0 (a=0, g=0): keys 16h+{0,1,8,9}, dims 8j
    assert wt.pv_table() == [(h, [16 * h, 16 * h + 1, 16 * h + 8, 16 * h + 9],
                              [16 * h, 16 * h + 1, 16 * h + 8, 16 * h + 9],
                              [0, 8, 16, 24, 32, 40, 48, 56]) for h in range(4)]


# ---- §8-§10 mask, reductions, online softmax ---------------------------------------------

def test_causal_table():
    held = {a: [8 * nj + 2 * a + b for nj in range(8) for b in (0, 1)] for a in range(4)}
    assert wt.causal_table() == [(0, held[0], [0], [0, 1, 8]), (1, held[1], [], [2, 3]),
                                 (2, held[2], [], [4, 5]), (3, held[3], [], [6, 7])]


def test_causal_hand_table():
    # query 0 sees key 0 (weight 1): O = V[0]; query 1 sees keys 0,1 with weights 1, 1/2
    assert wt.causal_hand_table() == [(0, (0, INF, INF, INF), (1, 0), "ln 1"),
                                      (1, (1, 0, INF, INF), (F(2, 3), F(1, 3)), "ln 3")]


def test_quad_table():
    expected = [(0, g, range(4 * g, 4 * g + 4), g, g + 8, [4 * g + 2, 4 * g + 1]) for g in range(8)]
    expected += [(1, 0, range(32, 36), 16, 24, [34, 33]),
                 (3, 7, range(124, 128), 55, 63, [126, 125])]
    assert wt.quad_table() == expected


def test_quad_columns_table():
    assert wt.quad_columns_table() == [
        (0, [0, 1, 8, 9, 16, 17, 24, 25], [32, 33, 40, 41, 48, 49, 56, 57]),
        (1, [2, 3, 10, 11, 18, 19, 26, 27], [34, 35, 42, 43, 50, 51, 58, 59]),
        (2, [4, 5, 12, 13, 20, 21, 28, 29], [36, 37, 44, 45, 52, 53, 60, 61]),
        (3, [6, 7, 14, 15, 22, 23, 30, 31], [38, 39, 46, 47, 54, 55, 62, 63]),
    ]


def test_max_example_table():
    # lane a holds keys 2a, 2a+1 of the first atom: max(-4,-3), max(-2,-1), max(0,1), max(2,3)
    assert wt.max_example_table() == [(0, -3, 1, 3), (1, -1, 3, 3), (2, 1, 1, 3), (3, 3, 3, 3)]


def test_sum_example_table():
    assert wt.sum_example_table() == [(0, F(1, 2), F(3, 4), 2), (1, 1, F(5, 4), 2),
                                      (2, F(1, 4), F(3, 4), 2), (3, F(1, 4), F(5, 4), 2)]


def test_register_state_table():
    assert [(name, n) for name, n, _ in wt.register_state_table()] == [
        ("OnlineSoftmax.row_max", 2), ("OnlineSoftmax.row_sum", 2), ("acc_S (tCrS)", 32),
        ("rP (tOrP)", 32), ("acc_O (tOrO)", 32)]


def test_rescale_table():
    # alpha = 2^(1-2); alpha*l1 = 3/4; rowsum P~2 = 1 + 1/4 and 1/2 + 1
    assert wt.rescale_table() == [(0, 1, 2, F(1, 2), F(3, 2), F(3, 4), F(5, 4), 2),
                                  (1, 1, 2, F(1, 2), F(3, 2), F(3, 4), F(3, 2), F(9, 4))]


def test_lse_table():
    # ln 2 * 2 + ln 2 = ln 8; ln 4 + ln 9/4 = ln 9; directly: 1 + 2 + 4 + 1 = 8, 2 + 1 + 2 + 4 = 9
    assert wt.lse_table() == [(0, 2, 2, "ln 8", "ln 8"), (1, 2, F(9, 4), "ln 9", "ln 9")]


# ---- §11 ----------------------------------------------------------------------------------

def test_source_table():
    rows = {path: names for _, path, names in wt.source_table()}
    assert rows["cute_fa/kernels/common/softmax.py"] == ["quad_allreduce", "OnlineSoftmax.step",
                                                         "OnlineSoftmax.rescale_O",
                                                         "OnlineSoftmax.finalize"]
    assert rows["cute_fa/kernels/common/mask.py"] == ["apply_mask"]
    assert rows["cute_fa/kernels/sched/tile_scheduler.py"] == ["SingleTileScheduler"]
    assert rows["cute_fa/kernels/sched/block_info.py"] == ["BlockInfo"]
    assert rows["cute_fa/visibility.py"] == ["key_visible"]
    assert rows["cute_fa/layouts/mma.py"] == ["tiled_mma", "acc_rowcol_layout", "acc_to_a_layout",
                                              "row_reduce_offsets"]
    assert rows["cute_fa/kernels/fwd/base.py"] == ["FlashFwdBase.run_round",
                                                   "FlashFwdBase.run_rounds",
                                                   "FlashFwdBase.write_epilogue"]
    assert rows["cute_fa/kernels/fwd/sm80.py"] == ["FlashFwdSm80.kernel", "FlashFwdSm80.before_s",
                                                   "FlashFwdSm80.after_softmax"]
    assert all((ROOT / path).is_file() for path in rows)


def test_notebook_list():
    assert [p for p, _ in wt.notebook_list()] == [
        "notebooks/01_online_softmax_by_hand.ipynb", "notebooks/02_fragments_qk_pv.ipynb",
        "notebooks/03_swizzle_and_copy.ipynb", "notebooks/04_tma_variant.ipynb",
        "notebooks/05_hopper_warp_specialized.ipynb", "notebooks/06_backward_fragments.ipynb"]


@pytest.mark.parametrize("value, text", [(range(3, 4), "3"), (range(0, 16), "0–15"), ([], "none"),
                                         ((F(1, 2), 1), "(1/2, 1)"), (INF, "−∞"), (None, "—")])
def test_cell_format(value, text):
    assert wt._fmt(value) == text
