"""`describe_lane` summaries say exactly what each thread holds and copies, over many tiles and
threads.

The summary text is parsed back into sets here, with a parser written for the format
('a..b' runs, 'x, y, …, z (every P)' progressions), and every line is compared, for each tensor
it names, to coordinates worked out here, not read from `cute_fa.explain`:

* the MMA lines to the PTX ISA's mma.m16n8k16 fragments ("Matrix Fragments for mma.m16n8k16",
  16-bit A and B, f32 C); lane l, g = l // 4, t = l % 4:
  A (16 x 16, row-major): a_i, i = 0 .. 7, is row g + 8 ((i // 2) % 2),
                          col 2 t + i % 2 + 8 (i // 4);
  B (16 x 8, "col"):      b_i, i = 0 .. 3, is k-row 2 t + i % 2 + 8 (i // 2), n-col g;
  C (16 x 8):             c_i, i = 0 .. 3, is row g + 8 (i // 2), col 2 t + i % 2;
  so the lanes 4 g .. 4 g + 3 of a quad share their rows, and a row reduction XORs lane bits 1
  and 2. Warp w takes the 16-row slabs w, w + num_warps, ... (`layouts.mma.tiled_mma`: warps
  (num_warps, 1, 1) along M) and all block_n keys; where the warps split the keys
  (`warps_split_keys`), the num_warps // (block_m // 16) warps of one slab share it, warp w
  taking slab w // that and its (w % that)-th equal share of the keys. Q@K^T is (query, d) x
  (key, d) over k = d; P@V is (query, key) x (key, d) over k = key, so V's B k-row is a key and
  its n-col a d. Widths are head_dim padded up to a multiple of 32.
* the cp.async line to a partition of identity tensors of the tile each tensor is copied in,
  Q's (block_m, padded head_dim) and K's and V's (block_n, padded head_dim), through the
  kernels' own TiledCopy (`layouts.copies.gmem_tiled_copy_qkv`), read through the DSL's own
  indexing; and that partition to the rule written out by hand: a 16-byte chunk is 8 elements,
  a row of a swizzle atom (64 columns, or 32 where the padded width is no multiple of 64) is
  split over atom / 8 threads, so thread t copies rows t // (atom / 8) + R r, R = num_threads /
  (atom / 8) rows per pass, and columns 8 (t % (atom / 8)) + atom a ... + 7; of them only
  columns below head_dim, the rest being zero-filled.
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
    (128, 128, 64, 128),  # 4 warps, two 16-row slabs each: Q's copy rows are not K's
    (64, 64, 128, 128),   # more keys than queries
    (40, 128, 64, 128),   # padding threads copy nothing of either tile
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


def test_copy_lines_name_each_tensors_rows():
    # 128 threads copy 16 rows of a 128-wide tile per pass (8 threads per 64-column atom row):
    # thread 0 rows 0, 16, ... of each tile, 8 of the 128 Q rows but 4 of the 64 K/V rows
    L = FlashLayouts(head_dim=128, block_m=128, block_n=64, num_threads=128)
    assert L.describe_lane(0).splitlines()[7:] == [
        "  cp.async:      rows 0, 16, …, 112 (every 16), cols 0..7, 64..71 of every Q tile "
        "(128 elements)",
        "  cp.async:      rows 0, 16, 32, 48, cols 0..7, 64..71 of every K/V tile (64 elements)"]
    # 256 threads: 32 rows per pass
    L = FlashLayouts(head_dim=128, block_m=128, block_n=64, num_threads=256)
    assert L.describe_lane(0).splitlines()[7:] == [
        "  cp.async:      rows 0, 32, 64, 96, cols 0..7, 64..71 of every Q tile (64 elements)",
        "  cp.async:      rows 0, 32, cols 0..7, 64..71 of every K/V tile (32 elements)"]
    # decode: one pass covers the 16 Q rows, four the 64 K/V rows
    L = FlashLayouts(head_dim=128, block_m=16, block_n=64, num_threads=128, dtype="bfloat16",
                     warps_split_keys=True)
    assert L.describe_lane(0).splitlines()[7:9] == [
        "  cp.async:      rows 0, cols 0..7, 64..71 of every Q tile (16 elements)",
        "  cp.async:      rows 0, 16, 32, 48, cols 0..7, 64..71 of every K/V tile (64 elements)"]
    # d = 40 pads to 64: thread 5's chunk 40..47 is zero-filled in Q, K and V alike
    L = FlashLayouts(head_dim=40, block_m=128, block_n=64, num_threads=128)
    assert L.describe_lane(5).splitlines()[7:] == [
        "  cp.async:      nothing: its cols 40..47 of every Q/K/V tile lie past head_dim 40, "
        "so it zero-fills them"]


# decode's tiles whose warps split the keys: (head_dim, block_m, block_n, num_threads)
WARP_SPLIT_TILES = [(128, 16, 64, 128), (64, 16, 128, 128), (256, 16, 64, 128),
                    (128, 32, 64, 128), (64, 32, 64, 128)]

WARP_SPLIT_LINE = re.compile(r"  warp split:    its softmax and O are warp (\d+)'s over keys "
                             r"(\d+)\.\.(\d+) of each tile; the (\d+) warps' O, max and sum are "
                             r"combined in shared memory at the end")


def warp_keys(tid, block_m, block_n, num_threads, split):
    """(first key, number of keys) of each K/V tile that `tid`'s warp multiplies, and how many
    warps share its 16-row slab."""
    if not split:
        return 0, block_n, 1
    sharing = num_threads // 32 // (block_m // 16)
    return (tid // 32 % sharing) * (block_n // sharing), block_n // sharing, sharing


def warp_slabs(tid, block_m, num_threads, split):
    """First rows of the 16-row slabs `tid`'s warp holds."""
    w, warps = tid // 32, num_threads // 32
    if split:
        return [16 * (w // (warps // (block_m // 16)))]
    return [16 * (w + warps * m) for m in range(block_m // (16 * warps))]


def ptx_fragments(tid, head_dim, block_m, block_n, num_threads, split):
    """Each operand and accumulator of `tid` from the m16n8k16 fragment formulas: A (Q) and
    the S accumulator as register-ordered lists ((2,2,2) / (2,2) slots, then M atoms, then N
    atoms or k-steps), the others as sets."""
    lane = tid % 32
    g, t = lane // 4, lane % 4
    dp = -(-head_dim // 32) * 32
    slabs = warp_slabs(tid, block_m, num_threads, split)
    key0, keys, _ = warp_keys(tid, block_m, block_n, num_threads, split)
    rows = [s + g + 8 * h for s in slabs for h in range(2)]
    return dict(
        Q=[(s + g + 8 * ((i // 2) % 2), 16 * k + 2 * t + i % 2 + 8 * (i // 4))
           for k in range(dp // 16) for s in slabs for i in range(8)],
        K={(key0 + 8 * n + g, 16 * k + 2 * t + i % 2 + 8 * (i // 2))
           for n in range(keys // 8) for k in range(dp // 16) for i in range(4)},
        S=[(s + g + 8 * (i // 2), key0 + 8 * n + 2 * t + i % 2)
           for n in range(keys // 8) for s in slabs for i in range(4)],
        V={(key0 + 16 * k + 2 * t + i % 2 + 8 * (i // 2), 8 * n + g)
           for n in range(dp // 8) for k in range(keys // 16) for i in range(4)},
        O={(r, 8 * n + 2 * t + c) for r in rows for n in range(dp // 8) for c in range(2)},
        rows=set(rows),
        keys={key0 + 8 * n + 2 * t + c for n in range(keys // 8) for c in range(2)},
    )


def copy_partition(cfg, tids) -> dict:
    """{(tensor, tid): every (row, col) of its tile tid's cp.async partition covers}, padding
    columns included: identity tensors of each tensor's tile partitioned by the kernels'
    TiledCopy, read through the DSL's own indexing."""
    import cutlass.cute as cute

    from cute_fa.layouts import copies

    out = {}

    @cute.jit
    def trace():
        g2s = copies.gmem_tiled_copy_qkv(cfg)
        for tensor, rows in (("Q", cfg.block_m), ("K", cfg.block_n), ("V", cfg.block_n)):
            ident = cute.make_identity_tensor((rows, cfg.head_dim_padded))
            for tid in tids:
                part = g2s.get_slice(tid).partition_S(ident)
                out[tensor, tid] = {tuple(int(x) for x in part[i]) for i in range(cute.size(part))}

    trace()
    return out


def copy_rule(tid, rows, head_dim, num_threads):
    """The same set by the hand rule of the module docstring."""
    dp = -(-head_dim // 32) * 32
    atom = 64 if dp % 64 == 0 else 32
    per_row = atom // 8
    per_pass = num_threads // per_row
    return {(tid // per_row + per_pass * r, 8 * (tid % per_row) + atom * a + e)
            for r in range(rows // per_pass) for a in range(dp // atom) for e in range(8)}


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
        m = WARP_SPLIT_LINE.fullmatch(split)
        assert m, split
        g = w % sharing
        assert [int(x) for x in m.groups()] == [w, g * per_warp, (g + 1) * per_warp - 1, sharing]
        assert {k for _, k in L.s_coords(tid)} <= set(range(g * per_warp, (g + 1) * per_warp))
        assert {q // 16 for q, _ in L.s_coords(tid)} == {w // sharing}


TENSORS = {"Q/K/V": "QKV", "Q": "Q", "K/V": "KV"}
COPY_LINE = re.compile(r"  cp\.async:      rows (.+), cols (.+) of every (Q/K/V|Q|K/V) tile "
                       r"\((\d+) elements\)")
NOTHING_LINE = re.compile(r"  cp\.async:      nothing: its cols (.+) of every (Q/K/V|Q|K/V) "
                          r"tile lie past head_dim (\d+), so it zero-fills them")
SUMMARY_TILES = ([t + (False, "float16") for t in TILES]
                 + [t + (True, "float16") for t in WARP_SPLIT_TILES]
                 + [(128, 16, 64, 128, True, "bfloat16")])


@pytest.mark.parametrize("tile", SUMMARY_TILES,
                         ids=lambda t: "d{}_{}x{}_{}t".format(*t) + ("_split" if t[4] else "")
                         + ("_bf16" if t[5] == "bfloat16" else ""))
def test_summary_matches_ptx_and_copy_partition(tile):
    head_dim, block_m, block_n, num_threads, split, dtype = tile
    L = FlashLayouts(head_dim=head_dim, block_m=block_m, block_n=block_n,
                     num_threads=num_threads, dtype=dtype, warps_split_keys=split)
    tids = sorted({0, 1, 5, 33 % num_threads, 37 % num_threads, 70 % num_threads,
                   num_threads - 1})
    partition = copy_partition(L.config, tids)
    for tid in tids:
        lane = tid % 32
        ptx = ptx_fragments(tid, head_dim, block_m, block_n, num_threads, split)
        head, qa, kb, s, vb, o, red, *rest = L.describe_lane(tid).splitlines()

        m = re.fullmatch(r"thread (\d+) \(warp (\d+), lane (\d+)\) holds query (.+), keys (.+), "
                         r"talks to lanes (.+)", head)
        assert m, head
        assert (int(m[1]), int(m[2]), int(m[3])) == (tid, tid // 32, lane)
        assert _queries(m[4]) == ptx["rows"]
        assert parse_ranges(m[5]) == ptx["keys"]
        assert _queries(m[6]) == {lane ^ 1, lane ^ 2}  # the other lanes of its quad

        m = re.fullmatch(r"  Q@K\^T  A \(Q\):  (\d+) values, queries (.+) x d (.+)", qa)
        assert m, qa
        assert int(m[1]) == len(ptx["Q"])
        assert {(q, d) for q in _queries(m[2]) for d in parse_ranges(m[3])} == set(ptx["Q"])
        for line, expected, label in ((kb, ptx["K"], r"Q@K\^T  B \(K\)"),
                                      (vb, ptx["V"], r"P@V    B \(V\)")):
            m = re.fullmatch(rf"  {label}:  (\d+) values, keys (.+) x d (.+)", line)
            assert m, line
            assert int(m[1]) == len(expected)
            assert {(k, d) for k in parse_ranges(m[2]) for d in parse_ranges(m[3])} == expected
        m = re.fullmatch(r"  S accumulator: (\d+) floats, first slots (.+)", s)
        assert m, s
        assert int(m[1]) == len(ptx["S"])
        assert m[2] == " ".join(str(p) for p in ptx["S"][:4])
        m = re.fullmatch(r"  O accumulator: (\d+) floats, queries (.+) x d (.+)", o)
        assert m, o
        assert int(m[1]) == len(ptx["O"])  # padding columns too: they are accumulated
        held = {(q, d) for q, d in ptx["O"] if d < head_dim}
        assert {(q, d) for q in _queries(m[2]) for d in parse_ranges(m[3])} == held
        m = re.fullmatch(r"  row max/sum:   shuffles XOR (.+) with lanes (.+) \(threads \[(.+)\]\)",
                         red)
        assert m, red
        offsets = [int(x) for x in re.split(r", | and ", m[1])]
        assert sorted(offsets) == [1, 2]
        assert [int(x) for x in re.split(r", | and ", m[2])] == [lane ^ x for x in offsets]
        assert [int(x) for x in m[3].split(", ")] == [tid - tid % 4 + i for i in range(4)]

        if split:
            *cp, last = rest
            m = WARP_SPLIT_LINE.fullmatch(last)
            assert m, last
            key0, keys, sharing = warp_keys(tid, block_m, block_n, num_threads, split)
            assert [int(x) for x in m.groups()] == [tid // 32, key0, key0 + keys - 1, sharing]
        else:
            cp = rest
        copied = {}  # of each tensor, the (row, col) below head_dim of its partition
        for tensor in "QKV":
            covered = partition[tensor, tid]
            assert covered == copy_rule(tid, block_m if tensor == "Q" else block_n, head_dim,
                                        num_threads)
            copied[tensor] = {(r, c) for r, c in covered if c < head_dim}
            assert L.copy_coords(tid, tensor) == sorted(copied[tensor])
        # one line for all three where Q's tile has K's and V's rows, or nothing is copied
        assert len(cp) == (1 if block_m == block_n or not copied["Q"] else 2)
        named = []
        for line in cp:
            m = COPY_LINE.fullmatch(line)
            nothing = NOTHING_LINE.fullmatch(line)
            assert m or nothing, line
            tensors = TENSORS[(m or nothing)[3 if m else 2]]
            named += tensors
            for tensor in tensors:
                if m:
                    assert int(m[4]) == len(copied[tensor])
                    assert {(r, c) for r in parse_ranges(m[1])
                            for c in parse_ranges(m[2])} == copied[tensor]
                else:
                    assert not copied[tensor] and int(nothing[3]) == head_dim
                    assert parse_ranges(nothing[1]) == {c for _, c in partition[tensor, tid]}
        assert sorted(named) == ["K", "Q", "V"]
