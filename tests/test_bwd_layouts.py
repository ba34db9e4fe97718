"""The backward kernel's fragments, P exchange and ldmatrix banks against hand formulas (CPU only).

The expected coordinates are written out here, not read from the code under test:

* the PTX ISA's mma.m16n8k16 fragments ("Matrix Fragments for mma.m16n8k16", 16-bit A and B,
  f32 C); lane l, g = l // 4, t = l % 4:
  A (16 x 16, row-major): a_i, i = 0 .. 7, is row g + 8 ((i // 2) % 2),
                          col 2 t + i % 2 + 8 (i // 4);
  B (16 x 8, "col"):      b_i, i = 0 .. 3, is k-row 2 t + i % 2 + 8 (i // 2), n-col g;
  C (16 x 8):             c_i, i = 0 .. 3, is row g + 8 (i // 2), col 2 t + i % 2;
* the warp grid of `layouts.bwd.tiled_mma` (warps (wm, wn), permutation (16 wm, 16 wn, 16)), as a
  small experiment on the TiledMMA showed and the CuTe docs' atom layout / permutation rules say:
  warp w sits at (wi, wj) = (w % wm, w // wm) (column-major); the permutation's M extent is the
  warps' own (16 wm), so warp wi takes the m16 atoms wi, wi + wm, wi + 2 wm, ... (rows
  16 (wi + wm i) ...); its N extent 16 wn is twice the warps' 8 wn, an identity permutation, so
  warp wj takes the n8 atoms wj, wj + wn, wj + 2 wn, ... (columns 8 (wj + wn j) ...): a warp's
  two n8 atoms of one 16 wn-wide step are 8 wn columns apart, not side by side;
* register order is CuTe's colexicographic one: A ((2,2,2), M atoms, k-steps), B ((2,2), N atoms,
  k-steps), C ((2,2), M atoms, N atoms);
* ldmatrix.x4: lanes 8j ... 8j + 7 give the 8 row addresses of matrix j, which lands in registers
  a_2j, a_2j+1 (A: matrix j is rows 8 (j % 2), k-cols 8 (j // 2) of the m16k16 tile) or, for B,
  b_{2(j%2)}, b_{2(j%2)+1} of the warp's n8 atom 2c + j // 2 (copy c); a row is 8 elements
  contiguous in smem: along K for a normal read, along M (N) for .trans;
* the swizzle (`layouts/smem.py`): a 64-column atom is Swizzle<3,3,3>, 16-byte chunk XOR (row % 8);
  a 32-column atom (64-byte rows) is Swizzle<2,3,3>, chunk XOR ((row // 2) % 4); atoms stack down
  the rows first, then across the columns.
"""

from collections import Counter

import pytest

from cute_fa.explain import BwdLayouts
from cute_fa.layouts.config import BwdTileConfig

TILES = {
    "d64-64x128-bf16": BwdTileConfig(64, 64, 128, 256, "bfloat16", (2, 4), (4, 2), (2, 4), 2),
    "d128-64x64-fp16": BwdTileConfig(128, 64, 64, 256, "float16", (2, 4), (4, 2), (4, 2), 1),
    "d192-32x32-bf16": BwdTileConfig(192, 32, 32, 128, "bfloat16", (2, 2), (2, 2), (2, 2), 1),
}


@pytest.fixture(scope="module", params=list(TILES), ids=list(TILES))
def lay(request):
    return BwdLayouts(TILES[request.param])


@pytest.fixture(scope="module")
def d64():
    return BwdLayouts(TILES["d64-64x128-bf16"])


def extents(c, product):
    """(M, N, K) and the warp grid of a product."""
    bm, bn, dp = c.block_m, c.block_n, c.head_dim_padded
    return {"sdp": ((bm, bn, dp), c.warps_sdp), "dkv": ((bn, dp, bm), c.warps_dkv),
            "dq": ((bm, dp, bn), c.warps_dq)}[product]


def split(t, warps):
    w, lane = divmod(t, 32)
    return w % warps[0], w // warps[0], lane // 4, lane % 4


def ptx_a(t, warps, m_atoms, k):
    wi, _, g, q = split(t, warps)
    return [(16 * (wi + warps[0] * m) + g + 8 * ((i // 2) % 2),
             16 * k + 2 * q + i % 2 + 8 * (i // 4)) for m in range(m_atoms) for i in range(8)]


def ptx_b(t, warps, n_atoms, k):
    _, wj, g, q = split(t, warps)
    return [(8 * (wj + warps[1] * n) + g, 16 * k + 2 * q + i % 2 + 8 * (i // 2))
            for n in range(n_atoms) for i in range(4)]


def ptx_c(t, warps, m_atoms, n_atoms):
    wi, wj, g, q = split(t, warps)
    return [(16 * (wi + warps[0] * m) + g + 8 * (i // 2), 8 * (wj + warps[1] * n) + 2 * q + i % 2)
            for n in range(n_atoms) for m in range(m_atoms) for i in range(4)]


def atoms(c, product):
    (m, n, _), (wm, wn) = extents(c, product)
    return m // (16 * wm), n // (8 * wn)


@pytest.mark.parametrize("product", ["sdp", "dkv", "dq"])
def test_fragments_are_the_ptx_ones(lay, product):
    c = lay.config
    (_, _, k_ext), warps = extents(c, product)
    m_atoms, n_atoms = atoms(c, product)
    assert lay.k_steps(product) == k_ext // 16
    for t in range(c.num_threads):
        for k in range(k_ext // 16):
            assert lay.a_coords(product, t, k) == ptx_a(t, warps, m_atoms, k), (t, k)
            assert lay.b_coords(product, t, k) == ptx_b(t, warps, n_atoms, k), (t, k)
        assert lay.c_coords(product, t) == ptx_c(t, warps, m_atoms, n_atoms), t


def test_named_examples(d64):
    # warps_dkv (4, 2): thread 128 is warp 4 = (0, 1): keys as thread 0, d columns 8 ... (the
    # second n8 atom of its 32-column step is d 24 ..., 16 = 8 * wn past its first)
    assert d64.a_coords("dkv", 0, 0)[:8] == [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9),
                                             (8, 8), (8, 9)]
    assert d64.a_coords("dkv", 0, 0)[8:10] == [(64, 0), (64, 1)]  # its second m16 atom
    assert d64.b_coords("dkv", 128, 0)[:8] == [(8, 0), (8, 1), (8, 8), (8, 9),
                                               (24, 0), (24, 1), (24, 8), (24, 9)]
    assert d64.c_coords("dkv", 128)[:4] == [(0, 8), (0, 9), (8, 8), (8, 9)]
    # warps_sdp (2, 4): thread 37 is warp 1 = (1, 0), lane 5 (g 1, t 1)
    assert d64.c_coords("sdp", 37)[:4] == [(17, 2), (17, 3), (25, 2), (25, 3)]


def test_every_element_held_once_per_warp_column(lay):
    """S, dV and dQ are each held once; P^T (A of dV) by the wn warps of a warp row."""
    c = lay.config
    for product, (m, n) in (("sdp", (c.block_m, c.block_n)),
                            ("dkv", (c.block_n, c.head_dim_padded)),
                            ("dq", (c.block_m, c.head_dim_padded))):
        held = Counter(x for t in range(c.num_threads) for x in lay.c_coords(product, t))
        assert set(held) == {(i, j) for i in range(m) for j in range(n)}
        assert set(held.values()) == {1}
    readers = lay.p_owners("dkv")["readers"]
    assert readers.shape == (c.block_m, c.block_n, c.warps_dkv[1])


def hand_writer(c, q, key):
    """The thread whose S accumulator holds P(q, key): the C formula turned around."""
    wm, wn = c.warps_sdp
    wi, wj = (q // 16) % wm, (key // 8) % wn
    return 32 * (wi + wm * wj) + 4 * (q % 8) + (key % 8) // 2


def test_p_is_stored_by_the_thread_that_computed_it(lay):
    c = lay.config
    owners = lay.p_owners("dkv")["writer"]
    for q in range(c.block_m):
        for key in range(c.block_n):
            assert owners[q, key] == hand_writer(c, q, key), (q, key)
    for t in range(c.num_threads):
        assert sorted(lay.p_written(t)) == sorted(lay.c_coords("sdp", t))
        # stores of 32 bits: two neighbouring keys of one query
        w = lay.p_written(t)
        assert all(w[i][0] == w[i + 1][0] and w[i + 1][1] == w[i][1] + 1
                   for i in range(0, len(w), 2))


@pytest.mark.parametrize("product", ["dkv", "dq"])
def test_who_reads_p_and_who_wrote_it(lay, product):
    c = lay.config
    (_, _, k_ext), warps = extents(c, product)
    m_atoms, _ = atoms(c, product)
    for t in range(c.num_threads):
        a = [rc for k in range(k_ext // 16) for rc in ptx_a(t, warps, m_atoms, k)]
        read = [(q, key) for key, q in a] if product == "dkv" else a  # P^T is (key, query)
        assert lay.p_read(t, product) == read
        want = Counter(hand_writer(c, q, key) for q, key in read)
        assert lay.writers(t, product) == dict(sorted(want.items()))
        assert lay.own_share(t, product) == (want.get(t, 0), len(read))


def test_thread_0_gets_most_of_its_p_from_others(d64):
    # dV's A of thread 0 (warps_dkv (4, 2), warp (0, 0), lane 0): keys 0, 8, 64, 72 x queries
    # 16 k + {0, 1, 8, 9}; S (warps_sdp (2, 4)) stores (q, key) at 32 ((q // 16) % 2 + 2 ((key
    # // 8) % 4)) + 4 (q % 8): keys 0, 64 -> wj 0, keys 8, 72 -> wj 1; q % 8 in {0, 1}; so eight
    # writers, 8 elements each; thread 0's own are keys 0, 64 x queries 0, 8, 32, 40
    assert d64.writers(0) == {0: 8, 4: 8, 32: 8, 36: 8, 64: 8, 68: 8, 96: 8, 100: 8}
    assert d64.own_share(0) == (8, 64)
    # thread 37 (warp 1 = (1, 0), lane 5: keys 17, 25, 81, 89; queries 16 k + {2, 3, 10, 11}):
    # key % 8 = 1 -> lane part 4 (q % 8) + 0, wj = 2 or 3 for keys 17, 25 / 81, 89: none its own
    assert d64.own_share(37) == (0, 64)
    # dQ's A is dS as stored, warps_dq = warps_sdp (2, 4): a thread reads its own rows, every key;
    # its S holds one key column pair of every 8 x 4 warps = a quarter of them
    assert all(d64.own_share(t, "dq") == (32, 128) for t in range(256))


def swizzled_offset(r, c, rows, atom_cols):
    """Element offset of (r, c) of a tile of `rows` rows stored in atoms `atom_cols` wide."""
    chunk = (c % atom_cols) // 8 ^ (r % 8 if atom_cols == 64 else (r // 2) % 4)
    return (c // atom_cols) * rows * atom_cols + atom_cols * r + 8 * chunk + c % 8


def stored(c, product, operand):
    """(stored tile rows, its atom width, read transposed) of an operand."""
    head = 64 if c.head_dim_padded % 64 == 0 else 32
    ps = 64 if c.block_n % 64 == 0 else 32
    return {("sdp", "A"): (c.block_m, head, False), ("sdp", "B"): (c.block_n, head, False),
            ("dkv", "A"): (c.block_m, ps, True), ("dkv", "B"): (c.block_m, head, True),
            ("dq", "A"): (c.block_m, ps, False), ("dq", "B"): (c.block_n, head, True)}[
        product, operand]


def hand_ldmatrix_row(c, product, operand, t, copy):
    """(first element in the operand's view) of the row lane t % 32 addresses in its copy-th
    ldmatrix.x4 of an operand."""
    (m, n, _), warps = extents(c, product)
    wi, wj, _, _ = split(t, warps)
    lane = t % 32
    j, r = divmod(lane, 8)
    transposed = stored(c, product, operand)[2]
    if operand == "A":
        along = m // (16 * warps[0])
        i, k = copy % along, copy // along
        row0, col0 = 16 * (wi + warps[0] * i) + 8 * (j % 2), 16 * k + 8 * (j // 2)
    else:
        along = n // (8 * warps[1]) // 2
        i, k = copy % along, copy // along
        row0, col0 = 8 * (wj + warps[1] * (2 * i + j // 2)), 16 * k + 8 * (j % 2)
    return (row0, col0 + r) if transposed else (row0 + r, col0)


@pytest.mark.parametrize("product, operand", [(p, o) for p in ("sdp", "dkv", "dq")
                                              for o in "AB"])
def test_ldmatrix_rows_and_banks(lay, product, operand):
    c = lay.config
    rows, atom_cols, transposed = stored(c, product, operand)
    step = (1, 0) if transposed else (0, 1)  # a row: 8 elements along the stored tile's row
    groups = {}  # (warp, copy) -> bank group of each lane
    for t in range(c.num_threads):
        for copy, got in enumerate(lay.ldmatrix_rows(product, operand, t)):
            view = hand_ldmatrix_row(c, product, operand, t, copy)
            tile = view[::-1] if transposed else view
            offset = swizzled_offset(*tile, rows, atom_cols)
            assert got["view"] == view and got["tile"] == tile, (t, copy)
            assert got["offset"] == offset and got["byte"] == 2 * offset, (t, copy)
            assert got["bank_group"] == (2 * offset // 16) % 8
            groups.setdefault((t // 32, copy), []).append(got["bank_group"])
            if t % 32 < 8:  # the 8 elements of a row are 16 contiguous bytes
                assert [lay.smem_offset(product, operand, view[0] + e * step[0],
                                        view[1] + e * step[1]) for e in range(8)] == \
                    list(range(offset, offset + 8))
    assert len(groups) == c.num_warps * lay.ldmatrix_count(product, operand)
    worst = max(max(Counter(lanes[8 * p:8 * p + 8]).values())
                for lanes in groups.values() for p in range(4))
    assert worst == 1  # every phase reads 8 rows in 8 different bank groups
    assert lay.bank_conflicts(product, operand)["worst"] == worst
    assert lay.bank_conflicts(product, operand)["conflicted"] == 0


def test_transposed_p_read_by_hand(d64):
    """Warp 0's first ldmatrix.x4.trans of P^T: lanes 0-7 address P rows (queries) 0-7 at keys
    0-7; Swizzle<3,3,3> puts query q's chunk 0 in bank group 0 XOR q = q, chunk 1 (lanes 8-15,
    keys 8-15) in 1 XOR q."""
    phases = d64.ldmatrix_phases("dkv", "A", warp=0, copy=0)
    assert [r["tile"] for r in phases[0]] == [(q, 0) for q in range(8)]
    assert [r["byte"] for r in phases[0]] == [144 * q for q in range(8)]  # 128 q + 16 q
    assert [r["bank_group"] for r in phases[0]] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert [r["tile"] for r in phases[1]] == [(q, 8) for q in range(8)]
    assert [r["bank_group"] for r in phases[1]] == [1, 0, 3, 2, 5, 4, 7, 6]
    assert [r["tile"] for r in phases[2]] == [(8 + q, 0) for q in range(8)]
    # the second m16 atom of warp 0 (keys 64 ...) lies in the second 64-column atom column,
    # 64 x 64 elements further
    assert d64.ldmatrix_rows("dkv", "A", 0)[1]["offset"] == 64 * 64
    # without the swizzle all 8 rows of a phase would sit in one bank group
    plain = d64.ldmatrix_phases("dkv", "A", warp=0, copy=0, swizzled=False)
    assert [r["bank_group"] for r in plain[1]] == [1] * 8
    assert d64.bank_conflicts("dkv", "A", swizzled=False)["worst"] == 8


def test_32_column_atom_by_hand():
    L = BwdLayouts(TILES["d192-32x32-bf16"])
    assert L.swizzle("dkv", "A") == (2, 3, 3)
    # 64-byte rows: rows 2r and 2r + 1 share a 128-byte line, chunk XOR ((q // 2) % 4)
    phase = L.ldmatrix_phases("dkv", "A", warp=0, copy=0)[0]
    assert [r["byte"] for r in phase] == [64 * q + 16 * ((q // 2) % 4) for q in range(8)]
    assert [r["bank_group"] for r in phase] == [0, 4, 1, 5, 2, 6, 3, 7]
    assert L.bank_conflicts("dkv", "A", swizzled=False)["worst"] == 4


def test_transposed_views_read_the_same_bytes(lay):
    c = lay.config
    for q in range(c.block_m):
        for key in range(c.block_n):
            assert lay.smem_offset("dkv", "A", key, q) == lay.smem_offset("dq", "A", q, key)
    for d in range(c.head_dim_padded):
        for key in range(0, c.block_n, 5):
            assert lay.smem_offset("dq", "B", d, key) == lay.smem_offset("sdp", "B", key, d)
        for q in range(0, c.block_m, 3):
            assert lay.smem_offset("dkv", "B", d, q) == lay.smem_offset("sdp", "A", q, d)


def test_numpy_reading_matches_the_dsl_indexing(lay):
    for (product, operand, t), values in lay._t["dsl_samples"].items():
        if operand == "A":
            assert lay.a_coords(product, t, 0)[:8] == values
        elif operand == "B":
            assert lay.b_coords(product, t, 0)[:8] == values
        else:
            assert lay.c_coords(product, t)[:8] == values


def test_describe_lane(d64):
    text = d64.describe_lane(0)
    assert "thread 0 (warp 0, lane 0)" in text
    assert "64 elements, 8 of them its own" in text
    assert "4, 32, 36, 64, 68, 96 and 100" in text


def test_argument_checks(d64):
    with pytest.raises(ValueError, match="tid"):
        d64.a_coords("dkv", 256, 0)
    with pytest.raises(ValueError, match="k must"):
        d64.a_coords("dkv", 0, 4)
    with pytest.raises(ValueError, match="product"):
        d64.c_coords("dv", 0)
    with pytest.raises(ValueError, match="product"):
        d64.p_read(0, "sdp")
    with pytest.raises(ValueError, match="operand"):
        d64.ldmatrix_rows("dkv", "C", 0)
    with pytest.raises(ValueError, match="copy"):
        d64.ldmatrix_phases("dkv", "A", copy=8)
    with pytest.raises(ValueError, match="row"):
        d64.smem_offset("dkv", "A", 128, 0)
    with pytest.raises(TypeError, match="BwdTileConfig"):
        BwdLayouts(object())


def test_default_tile_is_the_shipped_one():
    from cute_fa.tuning_bwd import bwd_tile

    assert BwdLayouts().config == bwd_tile("sm_80", "bfloat16", 128)
