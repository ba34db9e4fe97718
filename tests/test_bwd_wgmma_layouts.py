"""The Hopper backward's fragments per thread (`cute_fa.explain.WgmmaBwdLayouts`, read from the
layout objects the kernel builds) against coordinates computed here by hand from the PTX ISA's
wgmma figure for the m64nNk16 accumulator D (f32): in a warpgroup, thread t of warp w = t // 32,
lane l = t % 32 holds, for register i = 0 ... N/2 - 1,

    row = 16 w + l // 4 + 8 ((i // 2) % 2),   col = 8 (i // 4) + 2 (l % 4) + i % 2,

(a warpgroup's atom shifted by its place in the tiled MMA: along M by keys, or under split_d
along N by queries or d), and the RS-wgmma's A fragment (m64k16, 16-bit) for register
j = 0 ... 7 of a k-step,

    row = 16 w + l // 4 + 8 ((j // 2) % 2),   col = 2 (l % 4) + j % 2 + 8 (j // 4).
"""

import numpy as np
import pytest

from cute_fa.explain import WgmmaBwdLayouts
from cute_fa.layouts.config import WgmmaBwdTileConfig
from cute_fa.tuning_bwd import bwd_sm90_tile


def _d_fragment(t: int, n: int) -> np.ndarray:
    w, lane = (t % 128) // 32, t % 32
    return np.array([(16 * w + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2)
                     for i in range(n // 2)])


def _a_fragment(t: int) -> np.ndarray:
    w, lane = (t % 128) // 32, t % 32
    return np.array([(16 * w + lane // 4 + 8 * ((j // 2) % 2), 2 * (lane % 4) + j % 2 + 8 * (j // 4))
                     for j in range(8)])


def _one_of_the_consumers(layouts, tid):
    if tid >= layouts.cfg.num_threads:
        pytest.skip(f"the tile has {layouts.cfg.num_threads} consumer threads")


TILES = [bwd_sm90_tile("bfloat16", 128), bwd_sm90_tile("bfloat16", 128, deterministic=True),
         bwd_sm90_tile("bfloat16", 64), bwd_sm90_tile("bfloat16", 64, softcap=True),
         bwd_sm90_tile("bfloat16", 192), bwd_sm90_tile("bfloat16", 256)]


@pytest.fixture(scope="module", params=TILES,
                ids=lambda c: f"d{c.head_dim}_m{c.block_m}_c{c.consumers}"
                + ("_split_d" if c.split_d else ""))
def layouts(request):
    return WgmmaBwdLayouts(request.param)


@pytest.mark.parametrize("tid", [0, 1, 5, 37, 100, 127, 128, 131, 200, 255])
def test_scores_are_the_isa_fragment_on_the_keys(layouts, tid):
    """S^T (keys x queries): warpgroup g's atom starts at key 64 g; N = block_m queries.
    split_d: both warpgroups on keys 0-63, g's atom at query block_m / 2 g, N = block_m / 2."""
    _one_of_the_consumers(layouts, tid)
    cfg = layouts.cfg
    g = tid // 128
    if cfg.split_d:
        n = cfg.block_m // 2
        expected = _d_fragment(tid, n) + np.array([0, n * g])
    else:
        expected = _d_fragment(tid, cfg.block_m) + np.array([64 * g, 0])
    assert (layouts.scores(tid) == expected).all()


@pytest.mark.parametrize("tid", [0, 37, 128, 255])
def test_dk_dv_are_the_isa_fragment(layouts, tid):
    """dK, dV (keys x d): one atom of N = head_dim_padded per warpgroup, keys from 64 g.
    split_d: keys 0-63 for both, g's atom at column head_dim_padded / 2 g, N the half."""
    _one_of_the_consumers(layouts, tid)
    cfg = layouts.cfg
    g = tid // 128
    if cfg.split_d:
        n = cfg.head_dim_padded // 2
        expected = _d_fragment(tid, n) + np.array([0, n * g])
    else:
        expected = _d_fragment(tid, cfg.head_dim_padded) + np.array([64 * g, 0])
    assert (layouts.grads_kv(tid) == expected).all()


@pytest.mark.parametrize("tid", [0, 37, 128, 255])
def test_dq_splits_the_columns_between_warpgroups(layouts, tid):
    """dQ (queries x d): warpgroup g of c takes columns g * d/c ...; block_m / 64 atoms along
    M. A block_m off the multiples of 64 (80) computes dQ^T (d x queries): warpgroup g's atom
    at d = 64 g, N = block_m, each (d, query) reported as (query, d)."""
    _one_of_the_consumers(layouts, tid)
    cfg = layouts.cfg
    if cfg.block_m % 64:
        assert cfg.dq_transposed and cfg.head_dim_padded == 64 * cfg.consumers
        expected = _d_fragment(tid, cfg.block_m) + np.array([64 * (tid // 128), 0])
        assert (layouts.grad_q(tid) == expected[:, ::-1]).all()
        assert "dQ^T = K^T dS^T" in layouts.describe(tid)
        return
    share = cfg.head_dim_padded // cfg.consumers
    one = _d_fragment(tid, share) + np.array([0, share * (tid // 128)])
    expected = np.concatenate([one + np.array([64 * m, 0]) for m in range(cfg.block_m // 64)])
    assert (layouts.grad_q(tid) == expected).all()


@pytest.mark.parametrize("tid", [0, 9, 130, 255])
def test_p_is_the_a_operand_of_dv_in_place(layouts, tid):
    """P^T through acc_to_a_layout is the ISA's A fragment at every k-step (k = 16 queries):
    the S^T registers feed dV += P^T dO with no lane exchange."""
    _one_of_the_consumers(layouts, tid)
    cfg = layouts.cfg
    if cfg.split_d:
        # P^T and dS^T through shared memory, read back by SS-wgmma: no register A view
        assert "Pt_A" not in layouts.tables and layouts.a_registers is None
        assert "Pt_view" not in layouts.layouts
        assert "SS-wgmma" in layouts.describe(tid)
        return
    a = layouts.tables["Pt_A"][tid].reshape(cfg.block_m // 16, 8, 2)
    for s in range(cfg.block_m // 16):
        expected = _a_fragment(tid) + np.array([64 * (tid // 128), 16 * s])
        assert (a[s] == expected).all(), s


def test_every_score_has_one_owner(layouts):
    cfg = layouts.cfg
    pairs = layouts.tables["St"].reshape(-1, 2)
    assert len({tuple(p) for p in pairs}) == cfg.block_n * cfg.block_m == len(pairs)
    dq = layouts.tables["dQ"].reshape(-1, 2)  # and each (query, d) of dQ, transposed or not
    assert len({tuple(p) for p in dq}) == cfg.block_m * cfg.head_dim_padded == len(dq)


def test_roles_and_text(layouts):
    assert layouts.role(0).startswith("TMA producer")
    assert layouts.role(1).startswith("row loader")
    cfg = layouts.cfg
    consumers = cfg.consumers
    if cfg.split_d:
        half = cfg.head_dim_padded // 2
        assert "queries 0-31" in layouts.role(4) and f"d columns 0-{half - 1}" in layouts.role(4)
        assert "queries 32-63" in layouts.role(8)
        assert f"d columns {half}-{2 * half - 1}" in layouts.role(8)
        text = layouts.describe(130)
        assert "warpgroup 1" in text and "keys 0, 8" in text and "queries 36..37" in text
    else:
        assert "keys 0-63" in layouts.role(4)
        if consumers == 2:
            assert "keys 64-127" in layouts.role(8)
            text = layouts.describe(130)
            assert "warpgroup 1" in text and "keys 64, 72" in text
    with pytest.raises(ValueError, match="warp must be in"):
        layouts.role(4 * (consumers + 1))
    with pytest.raises(ValueError, match="tid must be in"):
        layouts.describe(128 * consumers)
    with pytest.raises(TypeError, match="WgmmaBwdTileConfig"):
        WgmmaBwdLayouts(object())
    assert isinstance(layouts.cfg, WgmmaBwdTileConfig)


def test_dq_sums_by_hand(layouts):
    """Each dQ register's place in its query block's float32 sums, written here: register e of
    thread t at float 4 (e // 4) T + 4 t + e % 4 (T consumer threads; 16-byte runs, a warp's
    512 consecutive bytes per run), every float of the block owned once. Under dq_writer these
    are the offsets in the shared block the writer warp adds whole (warp 2's role)."""
    cfg = layouts.cfg
    T = cfg.num_threads
    for t in (0, 1, 31, 32, T - 1):
        e = np.arange(len(layouts.grad_q(t)))
        np.testing.assert_array_equal(layouts.dq_sums(t), 4 * (e // 4) * T + 4 * t + e % 4)
    every = np.concatenate([layouts.dq_sums(t) for t in range(T)])
    assert sorted(every) == list(range(cfg.block_m * cfg.head_dim_padded))
    assert layouts.role(2).startswith("dQ writer" if cfg.dq_writer else "idle")
    assert layouts.role(3).startswith("idle")


def test_split_d_tables_cover_the_tile_once():
    """split_d: each (key, d) of dK / dV and each (query, d) of dQ has one owner over both
    warpgroups, and the two warpgroups' queries of S^T do not overlap."""
    layouts = WgmmaBwdLayouts(bwd_sm90_tile("bfloat16", 192))
    cfg = layouts.cfg
    assert (cfg.head_dim_padded, cfg.block_n) == (192, 64)
    kv = layouts.tables["dKV"].reshape(-1, 2)
    assert len({tuple(p) for p in kv}) == len(kv) == 64 * 192
    dq = layouts.tables["dQ"].reshape(-1, 2)
    assert len({tuple(p) for p in dq}) == len(dq) == cfg.block_m * 192
    q0, q1 = (set(layouts.tables["St"][g * 128:(g + 1) * 128, :, 1].ravel()) for g in (0, 1))
    assert not q0 & q1 and len(q0 | q1) == cfg.block_m
