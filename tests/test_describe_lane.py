"""`describe_lane` summaries say exactly what the tables hold, over many tiles and threads.

The summary text is parsed back into sets here, with a parser written for the format
('a..b' runs, 'x, y, …, z (every P)' progressions), and compared to the coordinate tables.
"""

import re

import pytest

from cute_fa.explain import FlashLayouts
from cute_fa.explain.introspect import fmt_ranges

TILES = [  # (head_dim, block_m, block_n, num_threads)
    (64, 64, 64, 128),
    (128, 128, 64, 256),
    (128, 128, 128, 256),
    (64, 128, 64, 128),
    (40, 64, 64, 128),
    (96, 64, 32, 128),
    (192, 128, 64, 256),
    (256, 64, 32, 128),
]


def parse_ranges(text: str) -> set:
    text = text.strip()
    every = re.fullmatch(r"(.*) \(every (\d+)\)", text)
    if every:
        first, second, ellipsis, last = [p.strip() for p in every.group(1).split(",")]
        assert ellipsis == "…"
        step = int(every.group(2))
        a0, b0 = _run(first)
        a1, b1 = _run(second)
        al, bl = _run(last)
        assert a1 - a0 == step and b1 - a1 == b0 - a0 == bl - al
        return {a + o for a in range(a0, al + 1, step) for o in range(b0 - a0 + 1)}
    out = set()
    for part in text.split(","):
        a, b = _run(part.strip())
        out |= set(range(a, b + 1))
    return out


def _run(part: str):
    if ".." in part:
        a, b = part.split("..")
        return int(a), int(b)
    return int(part), int(part)


def _queries(text: str) -> set:
    return {int(x) for x in re.split(r", | and ", text)}


@pytest.mark.parametrize("values, text", [
    ([0, 1, 2, 3, 4, 5, 6, 7, 64, 65, 66, 67, 68, 69, 70, 71], "0..7, 64..71"),
    ([0, 1, 8, 9, 16, 17, 24, 25, 32, 33], "0..1, 8..9, …, 32..33 (every 8)"),
    ([0, 32, 64, 96], "0, 32, 64, 96"),
    ([0, 16, 32, 48, 64], "0, 16, …, 64 (every 16)"),
    ([5], "5"),
    ([3, 1, 2, 9], "1..3, 9"),
])
def test_fmt_ranges_by_hand(values, text):
    assert fmt_ranges(values) == text


def test_wide_tile_copy_columns_are_two_runs():
    # the case a user reported: 256 threads copy a 128-wide tile as 8-column chunks 0..7 and
    # 64..71 (two 64-column swizzle atoms), not the span 0..71
    L = FlashLayouts(head_dim=128, block_m=128, num_threads=256)
    line = L.describe_lane(0).splitlines()[-1]
    assert "cols 0..7, 64..71 " in line


# decode's tiles whose warps split the keys: (head_dim, block_m, block_n, num_threads)
WARP_SPLIT_TILES = [(128, 16, 64, 128), (64, 16, 128, 128), (256, 16, 64, 128),
                    (128, 32, 64, 128), (64, 32, 64, 128)]


@pytest.mark.parametrize("tile", WARP_SPLIT_TILES, ids=lambda t: "d{}_{}x{}_{}t_split".format(*t))
def test_warp_split_line(tile):
    head_dim, block_m, block_n, num_threads = tile
    L = FlashLayouts(head_dim=head_dim, block_m=block_m, block_n=block_n,
                     num_threads=num_threads, warps_split_keys=True)
    sharing = num_threads // 32 // (block_m // 16)  # warps per 16-row slab
    per_warp = block_n // sharing
    for tid in (0, 33, num_threads - 1):
        *_, split = L.describe_lane(tid).splitlines()
        w = tid // 32
        m = re.fullmatch(r"  warp split:    its softmax and O are warp (\d+)'s over keys "
                         r"(\d+)\.\.(\d+) of each tile; the (\d+) warps' O, max and sum are "
                         r"combined in shared memory at the end", split)
        assert m, split
        g = w % sharing
        assert [int(x) for x in m.groups()] == [w, g * per_warp, (g + 1) * per_warp - 1, sharing]
        assert {k for _, k in L.s_coords(tid)} <= set(range(g * per_warp, (g + 1) * per_warp))
        assert {q // 16 for q, _ in L.s_coords(tid)} == {w // sharing}


@pytest.mark.parametrize("tile", TILES + [t + (True,) for t in WARP_SPLIT_TILES],
                         ids=lambda t: "d{}_{}x{}_{}t".format(*t) + ("_split" if t[4:] else ""))
def test_summary_matches_tables(tile):
    head_dim, block_m, block_n, num_threads, *split = tile
    L = FlashLayouts(head_dim=head_dim, block_m=block_m, block_n=block_n,
                     num_threads=num_threads, warps_split_keys=bool(split))
    for tid in sorted({0, 1, 5, 37 % num_threads, 70 % num_threads, num_threads - 1}):
        head, qa, kb, s, vb, o, red, cp, *_ = L.describe_lane(tid).splitlines()
        m = re.fullmatch(r"thread (\d+) \(warp (\d+), lane (\d+)\) holds query (.+), keys (.+), "
                         r"talks to lanes (.+)", head)
        assert m, head
        assert (int(m[1]), int(m[2]), int(m[3])) == (tid, tid // 32, tid % 32)
        s_set = set(L.s_coords(tid))
        queries = _queries(m[4])
        assert queries == {q for q, _ in s_set}
        assert {(q, k) for q in queries for k in parse_ranges(m[5])} == s_set
        assert {t % 32 for t in L.quad_partners(tid)} == _queries(m[6])

        m = re.fullmatch(r"  Q@K\^T  A \(Q\):  (\d+) values, queries (.+) x d (.+)", qa)
        assert int(m[1]) == len(L.q_coords(tid))
        assert {(q, d) for q in _queries(m[2]) for d in parse_ranges(m[3])} == set(L.q_coords(tid))
        for line, coords, label in ((kb, L.k_coords(tid), r"Q@K\^T  B \(K\)"),
                                    (vb, L.v_coords(tid), r"P@V    B \(V\)")):
            m = re.fullmatch(rf"  {label}:  (\d+) values, keys (.+) x d (.+)", line)
            assert m, line
            assert int(m[1]) == len(coords)
            assert {(k, d) for k in parse_ranges(m[2]) for d in parse_ranges(m[3])} == set(coords)
        m = re.fullmatch(r"  S accumulator: (\d+) floats, first slots (.+)", s)
        assert int(m[1]) == len(L.s_coords(tid))
        assert m[2] == " ".join(str(p) for p in L.s_coords(tid)[:4])
        m = re.fullmatch(r"  O accumulator: (\d+) floats, queries (.+) x d (.+)", o)
        assert int(m[1]) == len(L.o_coords(tid))
        held = {(q, d) for q, d in L.o_coords(tid) if d < head_dim}
        assert {(q, d) for q in _queries(m[2]) for d in parse_ranges(m[3])} == held
        m = re.fullmatch(r"  row max/sum:   shuffles XOR (.+) with lanes (.+) \(threads \[(.+)\]\)",
                         red)
        assert [int(x) for x in re.split(r", | and ", m[1])] == list(L.reduce_offsets)
        assert [int(x) for x in m[3].split(", ")] == L.reduce_group(tid)
        copy = set(L.copy_coords(tid))
        m = re.fullmatch(r"  cp\.async:      nothing: its cols (.+) lie past head_dim (\d+), so it "
                         r"zero-fills them", cp)
        if m:
            assert not copy and int(m[2]) == head_dim
            assert all(c >= head_dim for c in parse_ranges(m[1]))
            continue
        m = re.fullmatch(r"  cp\.async:      rows (.+), cols (.+) of every Q/K/V tile "
                         r"\((\d+) elements\)", cp)
        assert m, cp
        assert int(m[3]) == len(copy)
        assert {(r, c) for r in parse_ranges(m[1]) for c in parse_ranges(m[2])} == copy
