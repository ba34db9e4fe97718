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
        assert r["warp"] == warp
        assert r["threads"] == [32 * warp + lane0 + j for j in range(4)]


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
