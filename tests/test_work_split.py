"""The work-split rules of the decode path, on plain integers: which (query, head) a GQA-packed
tile row holds and where it lives in memory (checked against torch's own element offsets),
and how split-KV shares a query block's key blocks (checked against the union it must cover)."""

import itertools

import pytest

from cute_fa.kernels.sched.block_info import BlockInfo
from cute_fa.kernels.sched.seqlen import QueryRows
from cute_fa.tuning import (MANY_WAVES, MAX_SPLITS, MIN_BLOCKS_PER_SPLIT, SPLIT_EFFICIENCY,
                            num_splits_heuristic)

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("transposed", [False, True])
def test_packed_row_offsets_match_torch(group, transposed):
    """Row r of head head0's tile, shifted from the tile's row base_row as the kernels shift it,
    lands on the element torch addresses as q[b, r // group, head0 + r % group]."""
    seqlen_q, heads_kv, head_dim = 5, 3, 16
    heads_q = heads_kv * group
    if transposed:  # torch SDPA's (B, H, S, D) memory seen as (B, S, H, D)
        q = torch.empty(2, heads_q, seqlen_q, head_dim).transpose(1, 2)
    else:
        q = torch.empty(2, seqlen_q, heads_q, head_dim)
    stride_q, stride_h = q.stride(1), q.stride(2)
    rows = QueryRows(group)
    assert rows.count(seqlen_q) == seqlen_q * group
    for head_kv, r in itertools.product(range(heads_kv), range(rows.count(seqlen_q))):
        head0 = head_kv * group
        base_row = r % 4  # any row of the tile the copy starts from
        base = q[1, base_row, head0].storage_offset()
        target = q[1, rows.query(r), rows.head(head0, r)].storage_offset()
        assert base + rows.offset(r, base_row, stride_q, stride_h) == target


@pytest.mark.parametrize("n_blocks", [0, 1, 2, 7, 64, 129])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 16, 128])
def test_split_ranges_cover_the_key_blocks_once(n_blocks, num_splits):
    seen = []
    for split in range(num_splits):
        lo, hi = (int(x) for x in BlockInfo.split_range(n_blocks, split, num_splits))
        assert 0 <= lo <= hi <= n_blocks
        seen.extend(range(lo, hi))
    assert seen == list(range(n_blocks))  # in order, each block once


def test_split_heuristic():
    """Worked by hand for the shipped constants (efficiency 0.9, at least 4 blocks per split,
    at most 128 splits, no split from 4 waves on), then properties over a grid."""
    assert (SPLIT_EFFICIENCY, MIN_BLOCKS_PER_SPLIT, MAX_SPLITS, MANY_WAVES) == (0.9, 4, 128, 4)
    sms = 132
    # a full grid, or too few key blocks to share: no split
    assert num_splits_heuristic(tiles=4 * sms, n_blocks=1000, num_sms=sms) == 1
    assert num_splits_heuristic(tiles=8, n_blocks=7, num_sms=sms) == 1
    # 3.88 waves of one CTA per SM: 97% busy already
    assert num_splits_heuristic(tiles=512, n_blocks=128, num_sms=sms) == 1
    # batch 1, 8 K/V heads, 512 key blocks: a wave of 8 s CTAs is 8 s / 132 busy, the best is
    # 1.0 (s = 33); the fewest at >= 0.9 of it: s = 15 (120 CTAs, 0.909; s = 14: 0.848)
    assert num_splits_heuristic(tiles=8, n_blocks=512, num_sms=sms) == 15
    # one tile, 48 blocks: at most 12 splits (4 blocks each), best 12/132; 0.9 of it: 10.8/132
    assert num_splits_heuristic(tiles=1, n_blocks=48, num_sms=sms) == 11
    # 64 tiles: 2 splits fill 128 of 132 SMs (0.97; the best, 1.0 at 33 splits, is 2 waves)
    assert num_splits_heuristic(tiles=64, n_blocks=64, num_sms=sms) == 2
    for tiles, n_blocks in itertools.product((1, 8, 64, 300), (8, 64, 512, 4096, 10**6)):
        splits = num_splits_heuristic(tiles, n_blocks, sms)
        assert 1 <= splits <= MAX_SPLITS
        assert splits == 1 or n_blocks // splits >= MIN_BLOCKS_PER_SPLIT


def _launch_order(m_blocks, heads, batch, causal, lpt):
    """(m_block, head, batch) of each CTA of SingleTileScheduler's grid, in the order the GPU
    starts them (x fastest, then y, then z), written out from its grid and tile rules: without
    lpt the grid is (query blocks, heads, batch) and under causal x counts query blocks from
    the last; with lpt it is (heads, query blocks, batch), y from the last."""
    out = []
    if lpt:
        for z, y, x in itertools.product(range(batch), range(m_blocks), range(heads)):
            out.append((m_blocks - 1 - y, x, z))
    else:
        for z, y, x in itertools.product(range(batch), range(heads), range(m_blocks)):
            out.append((m_blocks - 1 - x if causal else x, y, z))
    return out


@pytest.mark.parametrize("m_blocks, heads, batch", [(1, 1, 1), (5, 3, 2), (8, 16, 1), (3, 1, 4)])
@pytest.mark.parametrize("causal, lpt", [(False, False), (True, False), (True, True)])
def test_persistent_tiles_follow_the_launch_order(m_blocks, heads, batch, causal, lpt):
    """The persistent scheduler's tile t is the t-th CTA the one-tile grid starts, and CTAs
    c, c + ctas, ... of any grid of ctas cover every tile once."""
    from cute_fa.kernels.sched.tile_scheduler import tile_coords

    total = m_blocks * heads * batch
    order = [tile_coords(t, m_blocks, heads, causal, lpt) for t in range(total)]
    assert order == _launch_order(m_blocks, heads, batch, causal, lpt)
    for ctas in (1, 7, 132, total):
        visited = [order[t] for c in range(min(ctas, total)) for t in range(c, total, ctas)]
        assert sorted(visited) == sorted(order) and len(set(visited)) == total
