"""The wgmma kernel's fragments, swizzles and ring against the hardware's definitions (CPU only).

The expected coordinates are written out here from the PTX ISA's wgmma fragment figures
("Matrix fragments for wgmma.mma_async", m64nNk16), not read from the code:

* the f32 accumulator D (S, O): thread t of the warpgroup (warp w = t // 32, lane l = t % 32)
  holds, for value v = 4 k + 2 i + j (k = 0 .. N/8 - 1 the 8-column slice, i, j in {0, 1}),
  row 16 w + l // 4 + 8 i and column 8 k + 2 (l % 4) + j;
* the 16-bit register A operand (P) of k-step s: a_r, r = 0 .. 7, is row
  16 w + l // 4 + 8 ((r // 2) % 2) and column 16 s + 2 (l % 4) + (r % 2) + 8 (r // 4);
* consumer warpgroup g holds rows 64 g ... 64 g + 63 of the CTA's tile.

The swizzles are TMA's (CU_TENSOR_MAP_SWIZZLE_128B / _64B), as in test_tma_layouts.py.
"""


import pytest

from cute_fa.explain import WgmmaLayouts, pipeline_rounds
from cute_fa.layouts import TileConfig
from cute_fa.layouts.wgmma import check_tile
from layout_checks import assert_s_and_o_owned_once

TILES = {
    "128x128-d128": TileConfig(head_dim=128, block_m=128, block_n=128, num_threads=256,
                               dtype="bfloat16", wgmma=True),
    "128x80-d256": TileConfig(head_dim=256, block_m=128, block_n=80, num_threads=256,
                              dtype="bfloat16", wgmma=True),
    "192x128-d64": TileConfig(head_dim=64, block_m=192, block_n=128, num_threads=384,
                              wgmma=True),
}


@pytest.fixture(scope="module", params=list(TILES), ids=list(TILES))
def lay(request):
    return WgmmaLayouts(TILES[request.param])


@pytest.fixture(scope="module")
def d128():
    return WgmmaLayouts(TILES["128x128-d128"])


def where(t):
    """(row of the thread's warpgroup's first row + its warp's, lane) of consumer thread t."""
    g, in_wg = divmod(t, 128)
    w, lane = divmod(in_wg, 32)
    return 64 * g + 16 * w, lane


def ptx_accumulator(t, n):
    """(row, column) of each f32 accumulator register of a m64nNk16 wgmma, PTX order."""
    row0, lane = where(t)
    out = []
    for k in range(n // 8):
        for i in range(2):
            for j in range(2):
                out.append((row0 + lane // 4 + 8 * i, 8 * k + 2 * (lane % 4) + j))
    return out


def ptx_a_operand(t, s):
    """(row, column) of the 8 16-bit A registers of k-step s (columns 16 s ... 16 s + 15)."""
    row0, lane = where(t)
    return [(row0 + lane // 4 + 8 * ((r // 2) % 2), 16 * s + 2 * (lane % 4) + r % 2 + 8 * (r // 4))
            for r in range(8)]


def test_s_accumulator_is_the_ptx_fragment(lay):
    c = lay.config
    for t in range(c.num_threads):
        assert lay.s_coords(t) == ptx_accumulator(t, c.block_n), t


def test_o_accumulator_is_the_ptx_fragment(lay):
    c = lay.config
    for t in range(c.num_threads):
        assert lay.o_coords(t) == ptx_accumulator(t, c.head_dim_padded), t


def test_s_and_o_held_exactly_once(lay):
    assert_s_and_o_owned_once(lay)


def test_p_view_is_the_ptx_a_fragment(lay):
    for t in range(lay.config.num_threads):
        for s in range(lay.k_steps):
            assert lay.p_coords(t, s) == ptx_a_operand(t, s), (t, s)


def test_p_view_is_what_the_pv_mma_partitions(lay):
    """acc_to_a_layout over the S partition == the RS TiledMMA's own partition_A."""
    for t in range(lay.config.num_threads):
        for s in range(lay.k_steps):
            assert lay.p_coords(t, s) == lay.pv_a_coords(t, s), (t, s)


def test_p_never_moves_between_lanes(lay):
    """k-step s of P is exactly the S elements of columns 16 s ... 16 s + 15 of the same thread,
    and every S register feeds exactly one A register."""
    for t in range(lay.config.num_threads):
        s_held = lay.s_coords(t)
        for s in range(lay.k_steps):
            mine = {rc for rc in s_held if 16 * s <= rc[1] < 16 * s + 16}
            assert set(lay.p_coords(t, s)) == mine and len(mine) == 8, (t, s)
    regs = [r for s in range(lay.k_steps) for r in lay.p_registers(s)]
    assert sorted(regs) == list(range(len(lay.s_coords(0))))
    for t in (0, 37, lay.config.num_threads - 1):
        s_held = lay.s_coords(t)
        for s in range(lay.k_steps):
            assert [s_held[r] for r in lay.p_registers(s)] == lay.p_coords(t, s)


def test_numpy_reading_matches_the_dsl_indexing(lay):
    for (name, t), values in lay._t["dsl_samples"].items():
        if name == "S":
            assert lay.s_coords(t)[:8] == values
        else:
            assert lay.pv_a_coords(t, 0) + lay.pv_a_coords(t, 1) == values


def test_row_reduction(d128):
    assert d128.reduce_offsets == (2, 1)
    for t in range(d128.config.num_threads):
        quad = d128.reduce_group(t)
        assert quad == [t - t % 4 + i for i in range(4)]
        rows = {q for q, _ in d128.s_coords(t)}
        assert all({q for q, _ in d128.s_coords(u)} == rows for u in quad)


def test_warp_roles():
    for cfg, consumers in ((TILES["128x128-d128"], 2), (TILES["192x128-d64"], 3)):
        L = WgmmaLayouts(cfg)
        table = L.warp_table()
        assert len(table) == 4 * (consumers + 1)
        assert [w["role"] for w in table[:4]] == ["tma", "idle", "idle", "idle"]
        assert [w["role"] for w in table[4:]] == [f"consumer {g}" for g in range(consumers)
                                                 for _ in range(4)]
        split = L.register_split()
        assert split["producer_total"] == 128 * split["producer_regs"]
        assert split["consumer_total"] == 128 * consumers * split["consumer_regs"]
        assert split["total"] <= 65536
        place = L.place(130)
        assert (place["warpgroup"], place["warp"], place["lane"], place["cta_thread"],
                place["cta_warp"]) == (1, 0, 2, 258, 8)
        assert table[place["cta_warp"]]["role"] == "consumer 1"


def tma_swizzle_byte(r, c, *, rows, row_bytes, elem_bytes=2):
    """Byte TMA writes (r, c) of a tile to: a column of atoms of `row_bytes`-byte rows; within
    an atom chunk ch of row r goes to ch XOR (r % 8) (128 B) or ch XOR ((r // 2) % 4) (64 B)."""
    cols = row_bytes // elem_bytes
    chunk, within = divmod(c % cols * elem_bytes, 16)
    chunk ^= r % 8 if row_bytes == 128 else (r // 2) % 4
    return (c // cols) * rows * row_bytes + row_bytes * r + 16 * chunk + within


def test_128_byte_swizzle_head_dim_128(d128):
    c = d128.config
    for name in ("Q", "K", "V"):
        assert d128.swizzle_bytes(name) == 128
        assert d128.swizzle(name) == (3, 4, 3)
    # the task's formula inside one 64-column atom, on a sample
    for r, col in ((0, 0), (1, 0), (1, 8), (3, 17), (7, 63), (8, 8), (13, 40), (127, 63)):
        assert d128.smem_byte("K", r, col) == 128 * r + ((col * 2 // 16) ^ (r % 8)) * 16 + col * 2 % 16
    for r in range(c.block_n):
        for col in range(c.head_dim_padded):
            want = tma_swizzle_byte(r, col, rows=c.block_n, row_bytes=128)
            assert d128.smem_byte("K", r, col) == want, (r, col)
            assert d128.smem_byte("V", r, col, stage=1) == want + c.block_n * c.head_dim_padded * 2
    for r in range(0, c.block_m, 7):
        for col in range(c.head_dim_padded):
            assert d128.smem_byte("Q", r, col) == tma_swizzle_byte(r, col, rows=c.block_m,
                                                                   row_bytes=128)
    # 8 rows of one 16-byte column of chunks (an 8x8 matrix of a descriptor) hit 8 bank groups
    assert sorted(d128.smem_chunk("K", r, 8)["bank_group"] for r in range(8)) == list(range(8))
    assert d128.smem_chunk("K", 1, 8) == dict(byte=128, chunk=8, bank_group=0)


def test_64_byte_swizzle_head_dim_96():
    L = WgmmaLayouts(TileConfig(head_dim=96, block_m=128, block_n=128, num_threads=256,
                                wgmma=True))
    c = L.config
    assert L.swizzle_bytes("K") == L.swizzle_bytes("Q") == 64
    for r in range(16):
        for col in range(c.head_dim_padded):
            assert L.smem_byte("K", r, col) == tma_swizzle_byte(r, col, rows=c.block_n,
                                                                row_bytes=64), (r, col)
    assert L.stage_byte_offset(1) == c.block_n * 96 * 2


def test_stage_offsets_and_descriptor_steps(d128):
    c = d128.config
    stage_bytes = c.block_n * c.head_dim_padded * 2
    assert [d128.stage_byte_offset(s) for s in range(2)] == [0, stage_bytes]
    assert d128.stage_byte_offset(1, "V") == stage_bytes
    # the DSL's descriptors step by the same bytes: K's k-steps 32 bytes apart within a 64-column
    # atom, the second atom block_n rows of 128 bytes further; V^T's k-steps 16 rows apart
    k = d128.descriptor_steps("K")
    assert k["k_steps"] == [32 * (s % 4) + (s // 4) * c.block_n * 128 for s in range(8)]
    assert k["stages"] == [0, stage_bytes]
    vt = d128.descriptor_steps("Vt")
    assert vt["k_steps"] == [16 * 128 * s for s in range(c.block_n // 16)]
    assert vt["stages"] == [0, stage_bytes]
    assert d128.descriptor_steps("Q")["k_steps"] == [32 * (s % 4) + (s // 4) * c.block_m * 128
                                                     for s in range(8)]


def test_pipeline_rounds_two_stages():
    rounds = pipeline_rounds(6, stages=2)
    #            round stage full  producer waits empty of (round, phase)  pv of round
    expected = [(0, 0, 0, None, None, None),
                (1, 1, 0, None, None, 0),
                (2, 0, 1, 0, 0, 1),
                (3, 1, 1, 1, 0, 2),
                (4, 0, 0, 2, 1, 3),
                (5, 1, 0, 3, 1, 4)]
    assert [(r["round"], r["stage"], r["full_phase"], r["producer_waits_round"],
             r["empty_phase"], r["pv_round"]) for r in rounds] == expected
    assert [r["key_block"] for r in rounds] == [5, 4, 3, 2, 1, 0]
    assert WgmmaLayouts.pipeline_rounds(3, 3)[2]["producer_waits_round"] is None


@pytest.mark.parametrize("kwargs, argument", [
    (dict(block_m=256, num_threads=512), "num_threads"),   # four consumer warpgroups
    (dict(block_n=272), "block_n"),                        # past wgmma's N = 256
])
def test_check_tile_rejects_bad_tiles(kwargs, argument):
    base = dict(head_dim=128, block_m=128, block_n=128, num_threads=256, wgmma=True)
    cfg = TileConfig(**{**base, **kwargs})
    with pytest.raises(ValueError, match=argument):
        check_tile(cfg)
    with pytest.raises(ValueError, match=argument):
        WgmmaLayouts(cfg)


def test_argument_checks(d128):
    with pytest.raises(ValueError, match="tid"):
        d128.s_coords(256)
    with pytest.raises(ValueError, match="k must"):
        d128.p_coords(0, 8)
    with pytest.raises(ValueError, match="tensor"):
        d128.smem_byte("O", 0, 0)
    with pytest.raises(ValueError, match="d must"):
        d128.smem_byte("K", 0, 128)


def test_default_tile_is_the_shipped_one():
    from cute_fa.explain import WgmmaLayouts
    from cute_fa.tuning import sm90_tile

    W = WgmmaLayouts()
    assert W.config == sm90_tile("bfloat16", 128, causal=False)
    assert W.s_coords(0)[:4] == [(0, 0), (0, 1), (8, 0), (8, 1)]
    assert W.smem_byte("K", 1, 0) == 128 + 16  # row 1: chunk 0 XOR 1


@pytest.mark.parametrize("group, seqlen_q, m_block", [(4, 2000, 0), (4, 2000, 62), (8, 100, 6),
                                                      (3, 7, 0), (16, 1, 0)])
def test_packed_rows(lay, group, seqlen_q, m_block):
    """GQA packing of the wgmma tile (`WgmmaLayouts.packed_rows`): row r of query block m is
    packed row p = m * block_m + r, query p // group of head p % group while p < seqlen_q *
    group, held by the quad of lanes 4 (r % 8) ... 4 (r % 8) + 3 of warp (r % 64) // 16 of
    warpgroup r // 64 (the PTX ISA's accumulator fragment, `where` above)."""
    cfg = lay.config
    table = lay.packed_rows(group, seqlen_q, m_block)
    assert [r["row"] for r in table] == list(range(cfg.block_m))
    for r in table:
        row = r["row"]
        p = m_block * cfg.block_m + row
        expected = (p // group, p % group) if p < seqlen_q * group else (None, None)
        assert (r["query"], r["head"]) == expected, row
        first = 128 * (row // 64) + 32 * ((row % 64) // 16) + 4 * (row % 8)
        assert r["threads"] == list(range(first, first + 4)), row
        assert all(where(t)[0] + where(t)[1] // 4 in (row, row - 8) for t in r["threads"])
        assert r["warpgroup"] == row // 64


def test_packed_rows_checks_and_words(d128):
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="group must be an int of at least 1"):
            d128.packed_rows(bad, 10)
    with pytest.raises(ValueError, match="m_block must be an int of at least 0"):
        d128.packed_rows(4, 10, -1)
    text = d128.describe_packing(group=4, seqlen_q=2000, m_block=62)
    assert text.splitlines()[0].endswith("64 of 128 rows hold a (query, head) pair")
    assert "row   5: query 1985, head h0+1, threads 20..23 (warpgroup 0)" in text
    assert text.splitlines()[-1] == "  warpgroup 1: padding rows only (zeros from TMA, not stored)"
