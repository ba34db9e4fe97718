"""The layout facts of docs/walkthrough.md, checked on the live layouts.

Expected values are typed in from the formulas and tables of that document, never
produced by the code under test. Notation: w = tid/32, lane = tid%32,
g = lane/4, a = lane%4.
"""

import pytest

THREADS = range(128)


def wga(tid):
    lane = tid % 32
    return tid // 32, lane // 4, lane % 4


# ---- §3: the four warps split the 64 query rows -----------------------------------------

@pytest.mark.parametrize("warp, rows", [(0, range(0, 16)), (1, range(16, 32)),
                                        (2, range(32, 48)), (3, range(48, 64))])
def test_warp_rows(walkthrough, warp, rows):
    tids = range(32 * warp, 32 * warp + 32)
    s = {c for t in tids for c in walkthrough.s_coords(t)}
    o = {c for t in tids for c in walkthrough.o_coords(t)}
    assert {q for q, _ in s} == set(rows)
    assert {k for _, k in s} == set(range(64))  # every key of the round
    assert {q for q, _ in o} == set(rows)
    assert {d for _, d in o} == set(range(64))  # every output dim


# ---- MMA lane coordinates (the formulas of docs/walkthrough.md §7) -----------------------

@pytest.mark.parametrize("tid", THREADS)
def test_mma_a_operand_q(walkthrough, tid):
    w, g, a = wga(tid)
    expected = {(16 * w + r, 16 * h + d) for r in (g, g + 8) for h in range(4)
                for d in (2 * a, 2 * a + 1, 2 * a + 8, 2 * a + 9)}
    got = walkthrough.q_coords(tid)
    assert len(got) == 32 and set(got) == expected


@pytest.mark.parametrize("tid", THREADS)
def test_mma_b_operand_k(walkthrough, tid):
    _, g, a = wga(tid)
    expected = {(8 * j + g, 16 * h + d) for j in range(8) for h in range(4)
                for d in (2 * a, 2 * a + 1, 2 * a + 8, 2 * a + 9)}
    got = walkthrough.k_coords(tid)
    assert len(got) == 128 and set(got) == expected


@pytest.mark.parametrize("tid", THREADS)
def test_mma_c_accumulator_s_in_slot_order(walkthrough, tid):
    # slot = 2*mi + b + 4*nj  ->  q = 16w + g + 8*mi, k = 2a + b + 8*nj
    w, g, a = wga(tid)
    expected = []
    for slot in range(32):
        b, mi, nj = slot % 2, (slot // 2) % 2, slot // 4
        expected.append((16 * w + g + 8 * mi, 2 * a + b + 8 * nj))
    assert walkthrough.s_coords(tid) == expected


def test_lane_examples(walkthrough):
    # lane 0 of the first MMA (keys 0..7, d 0..15): Q rows 0, 8 at d 0,1,8,9; K row 0; S(0,0..1),(8,0..1)
    q0 = [c for c in walkthrough.q_coords(0) if c[1] < 16]
    assert sorted(q0) == [(0, 0), (0, 1), (0, 8), (0, 9), (8, 0), (8, 1), (8, 8), (8, 9)]
    k0 = [c for c in walkthrough.k_coords(0) if c[0] < 8 and c[1] < 16]
    assert sorted(k0) == [(0, 0), (0, 1), (0, 8), (0, 9)]
    assert walkthrough.s_coords(0)[:4] == [(0, 0), (0, 1), (8, 0), (8, 1)]
    # lane 1: same Q rows at d 2,3,10,11; K row 0; keys 2,3 of queries 0 and 8
    assert sorted(c for c in walkthrough.q_coords(1) if c[1] < 16) == \
        [(0, 2), (0, 3), (0, 10), (0, 11), (8, 2), (8, 3), (8, 10), (8, 11)]
    assert walkthrough.s_coords(1)[:4] == [(0, 2), (0, 3), (8, 2), (8, 3)]
    # lane 4: queries 1 and 9, keys 0 and 1
    assert walkthrough.s_coords(4)[:4] == [(1, 0), (1, 1), (9, 0), (9, 1)]


@pytest.mark.parametrize("tid", THREADS)
def test_pv_operands(walkthrough, tid):
    # P@V: A = P(query, key), B = Vt(d, key), C = O(query, d); k-steps walk 16 keys.
    w, g, a = wga(tid)
    expected_v = {(16 * h + kk, 8 * j + g) for j in range(8) for h in range(4)
                  for kk in (2 * a, 2 * a + 1, 2 * a + 8, 2 * a + 9)}
    assert set(walkthrough.v_coords(tid)) == expected_v
    expected_o = {(16 * w + r, 8 * j + 2 * a + b) for r in (g, g + 8) for j in range(8) for b in (0, 1)}
    assert set(walkthrough.o_coords(tid)) == expected_o
    # P never leaves the thread: the S->A register view is exactly what the MMA's A wants.
    assert walkthrough.p_coords(tid) == walkthrough.pv_a_coords(tid)


def test_p_segments_of_lane0(walkthrough):
    # k-step h of P@V: lane 0 holds keys 16h + {0, 1, 8, 9} (docs/walkthrough.md §7)
    p = walkthrough.p_coords(0)
    segments = [sorted({k for _, k in p[8 * h: 8 * h + 8]}) for h in range(4)]
    assert segments == [[0, 1, 8, 9], [16, 17, 24, 25], [32, 33, 40, 41], [48, 49, 56, 57]]
    assert {q for q, _ in p} == {0, 8}


# ---- §8: accumulator row view ---------------------------------------------------------

def test_rowcol_view(walkthrough):
    assert walkthrough.s_rowcol_layout == (((2, 1), (2, 8)), ((2, 0), (1, 4)))
    rows = walkthrough.s_rowcol(0)
    assert [q for q, _ in rows] == [0, 8]
    assert rows[0][1] == [0, 1, 8, 9, 16, 17, 24, 25, 32, 33, 40, 41, 48, 49, 56, 57]
    assert rows[1][1] == rows[0][1]
    assert rows[0][1][2] == 8 and walkthrough.s_rowcol(1)[0][1][2] == 10  # ni=2 -> key 8 / key 10


# ---- §8: causal keep on the diagonal block -----------------------------------------------

def test_causal_keep_diagonal_block(walkthrough):
    expected = {
        0: {0: [0], 8: [0, 1, 8]},
        1: {0: [], 8: [2, 3]},
        2: {0: [], 8: [4, 5]},
        3: {0: [], 8: [6, 7]},
    }
    for lane, keep in expected.items():
        assert walkthrough.causal_keep(lane, m_block=0, n_block=0) == keep
    # together: query 0 keeps only key 0, query 8 keeps keys 0..8
    union = {q: sorted(k for lane in range(4) for k in walkthrough.causal_keep(lane)[q]) for q in (0, 8)}
    assert union == {0: [0], 8: list(range(9))}


def test_causal_keep_second_block(walkthrough):
    # m_block=1, n_block=1 is the diagonal block of queries 64..127: same pattern shifted by 64
    assert walkthrough.causal_keep(0, m_block=1, n_block=1) == {64: [64], 72: [64, 65, 72]}
    # n_block=0 for m_block=1 lies wholly in the past: nothing masked
    assert walkthrough.causal_keep(0, m_block=1, n_block=0)[64] == \
        [0, 1, 8, 9, 16, 17, 24, 25, 32, 33, 40, 41, 48, 49, 56, 57]


# ---- §9: quads and their reductions -------------------------------------------------------

@pytest.mark.parametrize("g", range(8))
def test_quad_groups(walkthrough, g):
    lanes = [4 * g + a for a in range(4)]
    for t in lanes:
        assert walkthrough.reduce_group(t) == lanes
        assert [q for q, _ in walkthrough.s_rowcol(t)] == [g, g + 8]


def test_quad_groups_other_warps(walkthrough):
    for t in range(32, 36):
        assert [q for q, _ in walkthrough.s_rowcol(t)] == [16, 24]
    for t in range(124, 128):
        assert [q for q, _ in walkthrough.s_rowcol(t)] == [55, 63]


def test_quad_columns(walkthrough):
    expected = {
        0: [0, 1, 8, 9, 16, 17, 24, 25, 32, 33, 40, 41, 48, 49, 56, 57],
        1: [2, 3, 10, 11, 18, 19, 26, 27, 34, 35, 42, 43, 50, 51, 58, 59],
        2: [4, 5, 12, 13, 20, 21, 28, 29, 36, 37, 44, 45, 52, 53, 60, 61],
        3: [6, 7, 14, 15, 22, 23, 30, 31, 38, 39, 46, 47, 54, 55, 62, 63],
    }
    for lane, keys in expected.items():
        for _, cols in walkthrough.s_rowcol(lane):
            assert cols == keys


def test_quad_partners(walkthrough):
    assert walkthrough.quad_partners(0) == [2, 1]  # "talks to lanes 2 and 1"
    assert walkthrough.quad_partners(4) == [6, 5]
    assert walkthrough.quad_partners(31) == [29, 30]
    assert walkthrough.reduce_offsets == (2, 1)


def test_max_reduction(walkthrough):
    row = [-4, -3, -2, -1, 0, 1, 2, 3] + [-5] * 56
    local, xor2, xor1 = walkthrough.reduce_steps(row, tid=0, op="max")
    assert local == {0: -3, 1: -1, 2: 1, 3: 3}
    assert xor2 == {0: 1, 1: 3, 2: 1, 3: 3}
    assert xor1 == {0: 3, 1: 3, 2: 3, 3: 3}


def test_sum_reduction_example(walkthrough):
    from fractions import Fraction as F

    local = {0: F(1, 2), 1: F(1), 2: F(1, 4), 3: F(1, 4)}
    _, xor2, xor1 = walkthrough.allreduce_steps(local, op="sum")
    assert xor2 == {0: F(3, 4), 1: F(5, 4), 2: F(3, 4), 3: F(5, 4)}
    assert xor1 == {0: 2, 1: 2, 2: 2, 3: 2}


# ---- §5: the swizzle -------------------------------------------------------------------

def test_swizzle_offsets(walkthrough):
    table = {(0, 0): 0, (0, 8): 8, (1, 0): 72, (1, 8): 64, (7, 56): 448, (8, 0): 512}
    for (r, c), off in table.items():
        assert walkthrough.smem_offset("Q", r, c) == off


def test_swizzle_formula_every_element(walkthrough):
    # offset = 64*r + (c XOR 8*(r%8)) for the whole 64x64 tile, for Q, K and V alike
    for tensor in ("Q", "K", "V", "O"):
        for r in range(64):
            for c in range(64):
                assert walkthrough.smem_offset(tensor, r, c) == 64 * r + (c ^ (8 * (r % 8)))


# ---- §4: the TiledCopy ------------------------------------------------------------------

def test_tiled_copy_examples(walkthrough):
    def rows_cols(t):
        coords = walkthrough.copy_coords(t)
        return sorted({r for r, _ in coords}), sorted({c for _, c in coords})

    assert rows_cols(0) == ([0, 16, 32, 48], list(range(0, 8)))
    assert rows_cols(7) == ([0, 16, 32, 48], list(range(56, 64)))
    assert rows_cols(8) == ([1, 17, 33, 49], list(range(0, 8)))
    assert rows_cols(32) == ([4, 20, 36, 52], list(range(0, 8)))


@pytest.mark.parametrize("tensor", ["Q", "K", "V"])
def test_tiled_copy_formula(walkthrough, tensor):
    # row = tid/8 + 16r, col = 8*(tid%8) + v
    for tid in THREADS:
        expected = sorted((tid // 8 + 16 * r, 8 * (tid % 8) + v) for r in range(4) for v in range(8))
        assert walkthrough.copy_coords(tid, tensor) == expected


# ---- §7: fragment sizes ---------------------------------------------------------------

def test_fragment_sizes(walkthrough):
    f = walkthrough.fragment_shapes
    assert f["tCrQ"] == (8, 1, 4)
    assert f["tCrK"] == (4, 8, 4)
    assert f["tCrS"] == (4, 1, 8)
    assert f["tXrQ"] == (8, 1, 4)
    assert f["tXrK"] == (8, 4, 4)
    # 32 half of Q, 128 half of K, 32 float of S per thread
    assert 8 * 1 * 4 == 32 and 4 * 8 * 4 == 128 and 4 * 1 * 8 == 32


def test_describe_lane_mentions_the_documented_facts(walkthrough):
    text = walkthrough.describe_lane(0)
    assert "thread 0" in text
    assert "query 0 and 8" in text
    assert "keys 0..1, 8..9, …, 56..57 (every 8)" in text
    assert "talks to lanes 2 and 1" in text
