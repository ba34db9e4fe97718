"""Decode's GQA packing as the explanations show it: which (query, head) each row of a decode
tile holds and which threads hold it. Expected values come from the definition of packing
(row r = query r // group, head r % group) and from the PTX ISA's m16n8k16 accumulator layout
(row i of a warp's 16-row slab sits in lanes 4*(i % 8) .. 4*(i % 8) + 3), not from cute_fa."""

import pytest

from cute_fa.explain import FlashLayouts

DECODE_TILE = dict(head_dim=128, block_m=64, block_n=64, num_threads=128, dtype="bfloat16")


@pytest.mark.parametrize("group, seqlen_q", [(1, 1), (4, 1), (8, 1), (8, 4), (3, 5), (64, 1)])
def test_packed_rows(group, seqlen_q):
    table = FlashLayouts(**DECODE_TILE).packed_rows(group, seqlen_q)
    assert [r["row"] for r in table] == list(range(64))
    for r in table:
        i = r["row"]
        if i < group * seqlen_q:
            assert (r["query"], r["head"]) == (i // group, i % group)
        else:
            assert r["query"] is None and r["head"] is None
        warp = i // 16  # 4 warps split the 64 rows in 16-row slabs
        lane0 = 4 * (i % 8)
        assert r["warps"] == [warp]
        assert r["threads"] == [32 * warp + lane0 + j for j in range(4)]


WARP_SPLIT_TILE = dict(head_dim=128, block_m=16, block_n=64, num_threads=128, dtype="bfloat16",
                       warps_split_keys=True)


@pytest.mark.parametrize("group, seqlen_q", [(4, 1), (8, 2), (1, 1), (16, 1)])
def test_packed_rows_of_the_warp_split_tile(group, seqlen_q):
    """Every warp holds the 16 rows, each in the same quad of lanes as one warp would."""
    table = FlashLayouts(**WARP_SPLIT_TILE).packed_rows(group, seqlen_q)
    assert [r["row"] for r in table] == list(range(16))
    for r in table:
        i = r["row"]
        useful = i < group * seqlen_q
        assert (r["query"], r["head"]) == ((i // group, i % group) if useful else (None, None))
        assert r["warps"] == [0, 1, 2, 3]
        assert r["threads"] == [32 * w + 4 * (i % 8) + j for w in range(4) for j in range(4)]


def test_warp_split_tile_s_coordinates():
    """From the PTX ISA's m16n8k16 accumulator: lane l holds rows l // 4 and l // 4 + 8 and
    columns 2 (l % 4) and 2 (l % 4) + 1 of each 8-column atom; warp w's atoms cover keys
    16 w .. 16 w + 15 of the 64-key tile (64 keys over 4 warps)."""
    L = FlashLayouts(**WARP_SPLIT_TILE)
    for tid in range(128):
        w, lane = divmod(tid, 32)
        expected = {(row, 16 * w + 8 * atom + 2 * (lane % 4) + c)
                    for row in (lane // 4, lane // 4 + 8) for atom in range(2) for c in range(2)}
        assert set(L.s_coords(tid)) == expected
        # O: each warp its own partial O of every row, over all of head_dim
        assert set(L.o_coords(tid)) == {(row, 8 * atom + 2 * (lane % 4) + c)
                                        for row in (lane // 4, lane // 4 + 8)
                                        for atom in range(16) for c in range(2)}


def test_two_slab_warp_split_tile_s_coordinates():
    """32 rows, 4 warps: warp w holds slab w // 2 (rows 16 (w // 2) ...) and keys 32 (w % 2) ...
    of the 64-key tile; within it the m16n8k16 accumulator's lanes as above."""
    L = FlashLayouts(head_dim=128, block_m=32, block_n=64, num_threads=128, dtype="bfloat16",
                     warps_split_keys=True)
    for tid in range(128):
        w, lane = divmod(tid, 32)
        rows = (16 * (w // 2) + lane // 4, 16 * (w // 2) + lane // 4 + 8)
        assert set(L.s_coords(tid)) == {(row, 32 * (w % 2) + 8 * atom + 2 * (lane % 4) + c)
                                        for row in rows for atom in range(4) for c in range(2)}
        assert {q for q, _ in L.q_coords(tid)} == set(rows)
    table = L.packed_rows(8, 4)
    assert [r["warps"] for r in table[14:18]] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert table[17]["threads"] == [68, 69, 70, 71, 100, 101, 102, 103]
    assert L.describe_packing(8, 4).splitlines()[-1].endswith(
        "warp 2 rows 16..31 keys 0..31, warp 3 rows 16..31 keys 32..63")


def test_describe_packing_of_the_warp_split_tile():
    text = FlashLayouts(**WARP_SPLIT_TILE).describe_packing(4)
    lines = text.splitlines()
    assert lines[0].endswith("4 of 16 rows hold a (query, head) pair, in warps 0, 1, 2 and 3")
    assert "row   1: query 0, head h0+1, threads 4..7, 36..39, 68..71, 100..103" in text
    assert "padding rows only" not in text
    assert lines[-1] == ("  each warp for its own keys of every K/V tile: warp 0 keys 0..15, "
                         "warp 1 keys 16..31, warp 2 keys 32..47, warp 3 keys 48..63")


def test_second_query_block():
    table = FlashLayouts(**DECODE_TILE).packed_rows(8, 16, m_block=1)  # rows 64..127 of 128
    assert [(r["query"], r["head"]) for r in table[:3]] == [(8, 0), (8, 1), (8, 2)]
    assert table[-1]["query"] == 15 and table[-1]["head"] == 7


def test_describe_packing_names_the_idle_warps():
    text = FlashLayouts(**DECODE_TILE).describe_packing(4)
    assert text.splitlines()[0].endswith("4 of 64 rows hold a (query, head) pair, in warp 0")
    assert "row   3: query 0, head h0+3, threads 12..15" in text
    assert "warps 1, 2 and 3: padding rows only" in text


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_bad_group(bad):
    with pytest.raises(ValueError, match="group must be a positive int"):
        FlashLayouts(**DECODE_TILE).packed_rows(bad)


def test_packed_rows_map_colours_rows_by_warp():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from cute_fa.explain.figures import packed_rows_map

    ax = packed_rows_map(FlashLayouts(**DECODE_TILE), group=8, seqlen_q=4)
    colours = ax.images[0].get_array()  # a masked array: padding rows are masked (NaN)
    assert [colours[i, 0] for i in (0, 15, 16, 31)] == [0, 0, 1, 1]  # warps 0 and 1
    assert all(colours.mask[i, 0] for i in range(32, 64))
    assert ax.texts[17].get_text() == "q2 h0+1  T36..39"
    # the warp-split tile: columns of 16 keys per warp, every useful row
    ax = packed_rows_map(FlashLayouts(**WARP_SPLIT_TILE), group=4, seqlen_q=1)
    colours = ax.images[0].get_array()
    assert [colours[2, k] for k in (0, 15, 16, 47, 48, 63)] == [0, 0, 1, 2, 3, 3]
    assert all(colours.mask[4, k] for k in range(64))
    assert ax.texts[3].get_text() == "q0 h0+3"


def test_readme_shows_what_describe_packing_prints():
    """The README's two packing examples are the functions' output, verbatim."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for kwargs in (DECODE_TILE, WARP_SPLIT_TILE):
        assert "```\n" + FlashLayouts(**kwargs).describe_packing(group=4) + "\n```" in readme
