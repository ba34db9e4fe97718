"""Properties of the layouts beyond the configuration of docs/walkthrough.md, from first
principles."""

from collections import Counter

import numpy as np
import pytest

from cute_fa.explain import FlashLayouts
from layout_checks import assert_s_and_o_owned_once

CONFIGS = [
    dict(head_dim=32, block_m=64, block_n=64, num_threads=128),
    dict(head_dim=40, block_m=64, block_n=64, num_threads=128),   # padded to 64: zero-filled tail
    dict(head_dim=96, block_m=64, block_n=32, num_threads=128, dtype="bfloat16"),
    dict(head_dim=128, block_m=128, block_n=64, num_threads=256),  # 8 warps
    dict(head_dim=256, block_m=128, block_n=32, num_threads=256, dtype="bfloat16"),
    dict(head_dim=64, block_m=128, block_n=128, num_threads=128),  # 2 M-repeats per warp
]


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def lay(request):
    return FlashLayouts(**request.param)


def _rows(L, tensor):
    c = L.config
    return c.block_m if tensor in ("Q", "O") else c.block_n


def test_s_and_o_owned_exactly_once(lay):
    assert_s_and_o_owned_once(lay)


def test_q_fragment_owned_exactly_once(lay):
    c = lay.config
    q = Counter(x for t in range(c.num_threads) for x in lay.q_coords(t))
    assert set(q) == {(r, d) for r in range(c.block_m) for d in range(c.head_dim_padded)}
    assert set(q.values()) == {1}


@pytest.mark.parametrize("operand", ["K", "V"])
def test_kv_fragments_owned_once_per_warp(lay, operand):
    # every warp multiplies its rows by the whole K (and V) tile
    c = lay.config
    fn = lay.k_coords if operand == "K" else lay.v_coords
    full = {(r, d) for r in range(c.block_n) for d in range(c.head_dim_padded)}
    for w in range(c.num_warps):
        held = Counter(x for t in range(32 * w, 32 * w + 32) for x in fn(t))
        assert set(held) == full and set(held.values()) == {1}


@pytest.mark.parametrize("tensor", ["Q", "K"])
def test_copy_covers_tile_once(lay, tensor):
    c = lay.config
    held = Counter(x for t in range(c.num_threads) for x in lay.copy_coords(t, tensor))
    assert set(held) == {(r, d) for r in range(_rows(lay, tensor)) for d in range(c.head_dim)}
    assert set(held.values()) == {1}
    # and each thread copies whole 16-byte runs: 8 consecutive columns from a multiple of 8
    for t in range(c.num_threads):
        runs = Counter((r, col // 8) for r, col in lay.copy_coords(t, tensor))
        assert all(n == 8 for n in runs.values())  # (threads of padding columns copy nothing)


@pytest.mark.parametrize("tensor", ["Q", "K"])
def test_swizzle_is_bijection_on_each_atom(lay, tensor):
    c = lay.config
    table = lay.swizzle_table(tensor)
    width = c.smem_atom_cols
    for r0 in range(0, table.shape[0], 8):
        for c0 in range(0, table.shape[1], width):
            atom = table[r0:r0 + 8, c0:c0 + width]
            base = atom.min()
            assert sorted(atom.ravel() - base) == list(range(8 * width))
    assert sorted(table.ravel()) == list(range(table.size))


@pytest.mark.parametrize("tensor", ["Q", "K"])
def test_sixteen_byte_runs_stay_contiguous(lay, tensor):
    table = lay.swizzle_table(tensor)
    runs = table.reshape(table.shape[0], -1, 8)
    assert (runs[:, :, 0] % 8 == 0).all()
    assert (np.diff(runs, axis=2) == 1).all()


@pytest.mark.parametrize("tensor", ["Q", "K", "V"])
def test_ldmatrix_phases_are_bank_conflict_free(lay, tensor):
    # ldmatrix reads each 8x8 matrix as 8 row addresses from 8 consecutive lanes;
    # the 8 rows must fall in 8 different 16-byte bank groups of the 128-byte line.
    c = lay.config
    for t0 in range(0, c.num_threads, 8):
        per_lane = [lay.ldmatrix_coords(t, tensor) for t in range(t0, t0 + 8)]
        for step in range(0, len(per_lane[0]), 8):  # one 16-byte row per lane per matrix
            offsets = [lay.smem_offset(tensor, *coords[step]) for coords in per_lane]
            groups = {(off * 2 // 16) % 8 for off in offsets}
            assert len(groups) == 8, (tensor, t0, step, offsets)


def test_p_feeds_pv_from_registers(lay):
    for t in range(lay.config.num_threads):
        assert lay.p_coords(t) == lay.pv_a_coords(t)


def test_reduce_groups_cover_rows(lay):
    c = lay.config
    for t in range(0, c.num_threads, 5):
        group = lay.reduce_group(t)
        rows = [[q for q, _ in lay.s_rowcol(x)] for x in group]
        assert all(r == rows[0] for r in rows)
        keys = sorted(k for x in group for k in lay.s_rowcol(x)[0][1])
        assert keys == list(range(c.block_n))
        assert set(lay.quad_partners(t)) < set(group)


def test_numpy_reading_matches_dsl_indexing(lay):
    # the numpy evaluation of each partition equals the DSL's own t[i]
    tables = lay._t["tables"]
    for (name, tid), coords in lay._t["dsl_samples"].items():
        assert [tuple(x) for x in tables[name][tid][:8].tolist()] == coords


def test_rowcol_view_rows(lay):
    c = lay.config
    rows = lay.s_rowcol(0)
    assert len(rows) == 2 * c.block_m // (16 * c.num_warps)
    for _, keys in rows:
        assert len(keys) == c.block_n // 4
