"""The Hopper (wgmma) backward compiles for sm_90a in every shipped configuration: wgmma for its
five products (S^T, dP^T and dQ from shared memory, dV and dK with their A operand in
registers, or under split_d from shared memory too), TMA loads of K, V, Q and dO, setmaxnreg between the producer and the consumer
warpgroups, stmatrix of dS, dQ's float32 sums added by vector reductions from the consumers'
registers or, under dq_writer, by one bulk reduction from shared memory; spills within
tuning_bwd.BWD_SM90_SPILL_BUDGET and shared memory within sm90's; `precompile(backward=True)`
plans it for an sm90 GPU. It takes nothing but sm90."""

import dataclasses
import re
from collections import Counter

import pytest

from cute_fa.compile.build import compile_kernel
from cute_fa.compile.keys import BwdSm90Key
from cute_fa.compile.ptxas import ptxas_resources
from cute_fa.layouts.config import WgmmaBwdTileConfig
from cute_fa.tuning import SMEM_BYTES
from cute_fa.tuning_bwd import (BWD_SM90_SPILL_BUDGET, BWD_SM90_TILES, bwd_backend, bwd_keys,
                                bwd_sm90_entry_tile, bwd_sm90_tile)

ARCH = "sm_90a"


def _ptx(key) -> str:
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    assert re.search(rf"^\.target {ARCH}\b", ptx, re.M)
    mma = "bf16" if key.tile.dtype == "bfloat16" else "f16"
    gemms = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.{mma}\.{mma}", ptx)
    cfg = key.tile
    dp, bm, bn = cfg.head_dim_padded, cfg.block_m, cfg.block_n
    # per query block: S^T and dP^T (n = block_m, head_dim / 16 k-steps each), dV and dK
    # (n = head_dim, block_m / 16 each), dQ (n = head_dim / consumers, block_n / 16 per 64
    # queries); split_d halves S^T's and dP^T's n (the queries) and dV's and dK's (d); a
    # block_m off the multiples of 64 computes dQ^T (n = block_m, block_n / 16: each
    # warpgroup's 64 columns of d are its M)
    halves = cfg.consumers if cfg.split_d else 1
    expected = Counter()
    expected[str(bm // halves)] += 2 * dp // 16
    expected[str(dp // halves)] += 2 * bm // 16
    if bm % 64:
        expected[str(bm)] += bn // 16
    else:
        expected[str(dp // cfg.consumers)] += (bm // 64) * bn // 16  # block_m / 64 atom rows
    counts = Counter(gemms)
    assert counts == expected, counts
    assert re.search(r"cp\.async\.bulk\.tensor\.4d\.shared::\w+\.global\.tile\.mbarrier", ptx)
    # the register split of a CTA's share of the file, written here: (ctas per SM, consumer
    # warpgroups) -> (consumer, producer) registers per thread; 2 x 240 + 24 of 64K, 232 + 24
    # of 32K, 256 + 56 (one warpgroup takes no more than 256)
    consumer, producer = {(1, 2): (240, 24), (2, 1): (232, 24), (1, 1): (256, 56)}[
        cfg.ctas_per_sm, cfg.consumers]
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{consumer};", ptx)
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{producer};", ptx)
    assert "stmatrix.sync.aligned" in ptx
    bulk = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"
    if cfg.dq_writer:
        # the consumers' 16-byte stores of dQ, shown to the bulk copy, which one lane issues
        assert ptx.count(bulk) == 1 and "fence.proxy.async.shared::cta" in ptx
        assert "st.shared.v4.b32" in ptx or "st.shared.v4.f32" in ptx
        assert bool(re.search(r"red\.relaxed\.gpu\.global\.add\.v4\.f32", ptx)) == key.kv_accum
    else:
        assert bulk not in ptx
        assert re.search(r"red\.relaxed\.gpu\.global\.add\.v4\.f32", ptx)
    assert "mma.sync" not in ptx and "ldmatrix" not in ptx
    res = ptxas_resources(ptx, ARCH)
    assert res["spill_stores"] <= BWD_SM90_SPILL_BUDGET, res["log"]
    assert res["spill_loads"] <= BWD_SM90_SPILL_BUDGET, res["log"]
    return ptx


@pytest.mark.parametrize("head_dim", sorted(BWD_SM90_TILES))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
def test_shipped_tiles_compile(head_dim, dtype, causal):
    _, key, post = bwd_keys(ARCH, dtype, head_dim, causal)
    assert isinstance(key, BwdSm90Key) and post.tile == key.tile
    # the CTAs an SM holds at once share its shared memory
    assert key.tile.smem_bytes() * key.tile.ctas_per_sm <= SMEM_BYTES[ARCH]
    ptx = _ptx(key)
    assert "ex2.approx" in ptx and "ld.acquire" not in ptx
    if key.tile.atom_cols == 32:
        # head_dim 192 on 64-byte atoms: told one CTA per SM, or ptxas cannot tell the
        # register count at entry, ignores setmaxnreg (C7508) and spills
        assert head_dim == 192 and key.tile.dq_writer and ".minnctapersm 1" in ptx
        log = ptxas_resources(ptx, ARCH)["log"]
        assert "C7508" not in log and "C7512" not in log


@pytest.mark.parametrize("head_dim, deterministic", [
    (64, False), (64, True), (128, False), (128, True)])
def test_wgmmas_stay_asynchronous(head_dim, deterministic):
    """ptxas keeps the shipped tile's wgmmas asynchronous: no "wgmma.mma_async instructions are
    serialized due to insufficient register resources" (C7512), under which S^T and dP^T
    cannot overlap, nor dS's arithmetic the dV GEMM. Head_dim 64's 128 x 128 tile of two
    warpgroups is asynchronous only with dV issued after dS (dv_after_ds); issued before, as
    at head_dim 128, ptxas serializes it."""
    _, key, _ = bwd_keys(ARCH, "bfloat16", head_dim, True, deterministic=deterministic)
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    assert "C7512" not in ptxas_resources(ptx, ARCH)["log"]
    if head_dim == 64:
        assert key.tile.dv_after_ds and (key.tile.block_m, key.tile.block_n) == (128, 128)
        early = dataclasses.replace(key, tile=dataclasses.replace(key.tile, dv_after_ds=False))
        early_ptx = compile_kernel(early, keep_ptx=True).__ptx__
        assert "C7512" in ptxas_resources(early_ptx, ARCH)["log"]


@pytest.mark.parametrize("head_dim", sorted(BWD_SM90_TILES))
@pytest.mark.parametrize("feature", ["local", "softcap", "varlen", "deterministic"])
def test_features_compile(feature, head_dim):
    """Every feature's kernel at each shipped head_dim class, within the spill budget (`_ptx`):
    deterministic at head_dim 64 takes its own tiles
    (`tuning_bwd.BWD_SM90_DETERMINISTIC_TILES`)."""
    _, key, _ = bwd_keys(ARCH, "bfloat16", head_dim, True, **{feature: True})
    ptx = _ptx(key)
    if feature == "softcap":
        assert "tanh.approx.f32" in ptx
    assert ("ld.acquire.gpu" in ptx) == (feature == "deterministic")
    if feature == "deterministic":
        assert re.search(r"red\.release\.gpu\.global\.add\.(s|u)32", ptx)


def test_postprocess_reads_the_wgmma_order():
    """dQ's conversion of the wgmma kernel's sums compiles with its 256 threads, no spills."""
    _, _, post = bwd_keys(ARCH, "bfloat16", 96, False, varlen=True)
    ptx = compile_kernel(post, keep_ptx=True).__ptx__
    assert "st.global.v4" in ptx and "mma" not in ptx
    assert ptxas_resources(ptx, ARCH)["spill_stores"] == 0


@pytest.mark.parametrize("head_dim, padded, atom", [
    (40, 64, 64), (64, 64, 64), (96, 128, 64), (128, 128, 64), (136, 192, 32), (160, 192, 32),
    (192, 192, 32), (200, 256, 64), (256, 256, 64)])
def test_head_dims_pad_to_whole_atoms(head_dim, padded, atom):
    """Each warpgroup's columns of dQ (and under split_d of dK and dV) are whole swizzle atoms:
    64 elements, or past 128 and up to 192 32 (64-byte rows), so that 192 runs unpadded, 96
    columns per warpgroup; 200-256 pad to 2 x 64. The dQ conversion and the dK/dV stores walk
    the same rows, on the same atom."""
    cfg = bwd_sm90_tile("bfloat16", head_dim)
    assert cfg.split_d == (head_dim > 128)
    assert (cfg.head_dim_padded, cfg.smem_atom_cols) == (padded, atom)
    assert cfg.smem_bytes() <= SMEM_BYTES[ARCH]
    for rows in (cfg.q_rows, cfg.kv_rows):
        assert (rows.head_dim_padded, rows.smem_atom_cols) == (padded, atom)


@pytest.mark.parametrize("head_dim, entry, feature", [
    (128, (80, 2, 2, 1, False, True, 64, True), None),
    (128, (80, 2, 2, 1, False, True, 64, True), "deterministic"),
    (128, (80, 2, 3, 1, False, False, 64, True), "local"), (64, (80, 1, 2, 2, False, True), None),
    (64, (48, 1, 2, 2, False, True), "varlen")])
def test_query_blocks_off_64_compute_dq_transposed(head_dim, entry, feature):
    """A block_m that is not a multiple of 64 (wgmma's M) computes dQ^T = K^T dS^T: its
    wgmmas (`_ptx`: n = block_m for dQ, block_n / 16 of them) within the spill budget, every
    feature; the conversion of its sums (dQ^T's register order, put back by coordinates)
    compiles too, its 16-byte stores by the first 128 threads (five passes of 80 rows). At
    head_dim 128 only with dV after dS (`dv_after_ds`): without it ptxas serializes."""
    kw = {feature: True} if feature else {}
    _, key, post = bwd_keys(ARCH, "bfloat16", head_dim, feature != "local", **kw)
    tile = bwd_sm90_entry_tile(entry, "bfloat16", head_dim)
    assert tile.dq_transposed
    ptx = _ptx(dataclasses.replace(key, tile=tile))
    assert "C7512" not in ptxas_resources(ptx, ARCH)["log"]
    post_ptx = compile_kernel(dataclasses.replace(post, tile=tile), keep_ptx=True).__ptx__
    assert "st.global.v4" in post_ptx and "mma" not in post_ptx
    assert tile.q_rows.num_threads == 128 and tile.block_m % tile.q_rows.copy_rows_per_pass == 0


@pytest.mark.parametrize("head_dim, deterministic, softcap", [
    (128, False, False), (128, True, False), (128, False, True), (64, False, False)])
def test_dq_before_dk_compiles(head_dim, deterministic, softcap):
    """dq_before_dk (dQ issued before dK and handed over while dK runs) on each shipped tile
    that can take it: the same wgmmas (`_ptx`) within the spill budget, all asynchronous, and
    without a writer (the softcap's tile) its reductions still from registers."""
    _, key, _ = bwd_keys(ARCH, "bfloat16", head_dim, True, deterministic=deterministic,
                         softcap=softcap)
    tile = dataclasses.replace(key.tile, dq_before_dk=True)
    ptx = _ptx(dataclasses.replace(key, tile=tile))
    assert "C7512" not in ptxas_resources(ptx, ARCH)["log"]


def test_atom_cols_errors():
    with pytest.raises(ValueError, match="atom_cols must be 32 or 64"):
        WgmmaBwdTileConfig(head_dim=192, split_d=True, atom_cols=16)
    with pytest.raises(ValueError, match="for split_d tiles"):
        WgmmaBwdTileConfig(head_dim=128, atom_cols=32)


def test_auto_and_its_limits():
    assert bwd_backend(ARCH, "bfloat16", 128) == "sm90"
    assert bwd_backend(ARCH, "bfloat16", 192) == "sm90"
    assert bwd_backend(ARCH, "bfloat16", 256, "sm90") == "sm90"
    assert bwd_backend("sm_80", "bfloat16", 64) == "sm80"
    assert bwd_backend("sm_120a", "bfloat16", 64) == "sm80"
    with pytest.raises(ValueError, match="runs on sm90 only"):
        bwd_backend("sm_80", "bfloat16", 64, "sm90")
    with pytest.raises(ValueError, match="backend must be one of"):
        bwd_backend(ARCH, "bfloat16", 64, "wgmma")


@pytest.mark.parametrize("kwargs,match", [
    (dict(consumers=3), "consumers must be 1 or 2"),
    (dict(block_m=24), "block_m must be a multiple of 16"),
    (dict(q_stages=1), "q_stages must be 2 or 3"),
    (dict(head_dim=100), "multiple of 8"),
    (dict(head_dim=256, consumers=1, split_d=True), "split_d splits d between two"),
    (dict(head_dim=256, split_d=True, block_m=48), "split_d halves block_m"),
    (dict(head_dim=256, split_d=True, dq_writer=True), "does not fit"),
    (dict(head_dim=256, split_d=True, block_m=96), "computes dQ\\^T"),
    (dict(head_dim=64, block_m=80), "head_dim_padded = 64 x consumers \\(128\\)"),
])
def test_tile_config_errors(kwargs, match):
    base = dict(head_dim=128, block_m=64, consumers=2, dtype="bfloat16", q_stages=2)
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        WgmmaBwdTileConfig(**base)


def test_precompile_plans_it_for_sm90():
    """precompile(backward=True, arch='sm_90a')'s plans: the wgmma kernel at every head_dim
    (past 128 its split-d tile)."""
    from cute_fa.api.precompile import calls
    from cute_fa.runtime.device import stand_in
    from cute_fa.runtime.plan import plan

    import torch

    target = stand_in(ARCH)
    planned = [plan(c, target, compile=False) for c in calls(
        (64, 128, 256), (torch.bfloat16,), (False, True), "auto", (), (),
        [(False, False, False)], True, target.index)]
    main = {k.tile.head_dim: k.backend for p in planned for k in p.kernel_keys()
            if k.backend.startswith("bwd_sm")}
    assert main == {64: "bwd_sm90", 128: "bwd_sm90", 256: "bwd_sm90"}


def test_split_d_flag_is_a_bool():
    with pytest.raises(TypeError, match="split_d must be a bool"):
        WgmmaBwdTileConfig(head_dim=256, split_d=1)
    with pytest.raises(TypeError, match="dq_writer must be a bool"):
        WgmmaBwdTileConfig(head_dim=128, dq_writer=1)
    with pytest.raises(TypeError, match="dv_after_ds must be a bool"):
        WgmmaBwdTileConfig(head_dim=128, dv_after_ds="late")
    with pytest.raises(TypeError, match="dq_before_dk must be a bool"):
        WgmmaBwdTileConfig(head_dim=128, dq_before_dk=0)
    for name in ("dv_after_ds", "dq_before_dk"):
        with pytest.raises(ValueError, match=f"{name} orders the register A operands"):
            WgmmaBwdTileConfig(head_dim=256, split_d=True, **{name: True})


def test_softcap_at_64_keeps_the_one_warpgroup_tile():
    """Under a softcap head_dim 64 keeps 64 x 64 in one warpgroup (BWD_SM90_SOFTCAP_TILES):
    the default 128 x 128 tile spills past the budget there (S^T and dP^T of 128 queries
    beside 1 - tanh^2), as `_ptx` would fail it."""
    plain, capped = (bwd_sm90_tile("bfloat16", 64, softcap=c) for c in (False, True))
    assert (plain.block_m, plain.consumers) == (128, 2)
    assert (capped.block_m, capped.consumers, capped.ctas_per_sm) == (64, 1, 2)
    _, key, _ = bwd_keys(ARCH, "bfloat16", 64, True, softcap=True)
    res = ptxas_resources(compile_kernel(dataclasses.replace(key, tile=plain),
                                         keep_ptx=True).__ptx__, ARCH)
    assert res["spill_stores"] > BWD_SM90_SPILL_BUDGET


@pytest.mark.parametrize("head_dim", [64, 128, 192])
@pytest.mark.parametrize("deterministic", [False, True])
def test_dq_writer_ships_up_to_192(head_dim, deterministic):
    """head_dim 64, 128 and 192 hand dQ to the writer warp, default and deterministic (the
    H200 A/Bs of docs/perf/2026-12-03-h200-bwd-dq-writer and -192); its float32 block is
    block_m x head_dim_padded x 4 bytes more shared memory, at 256 more than split_d has room
    for."""
    cfg = bwd_sm90_tile("bfloat16", head_dim, deterministic=deterministic)
    assert cfg.dq_writer
    plain = dataclasses.replace(cfg, dq_writer=False)
    assert cfg.smem_bytes() - plain.smem_bytes() == 4 * cfg.block_m * cfg.head_dim_padded
    assert not bwd_sm90_tile("bfloat16", 256).dq_writer


def test_kv_accum_keeps_register_reductions_beside_the_writer():
    """Under a head split the CTAs add dK and dV from registers (vector reductions) while dQ
    goes through the writer warp."""
    _, key, _ = bwd_keys(ARCH, "bfloat16", 128, True)
    split = BwdSm90Key(arch=ARCH, causal=True, tile=key.tile, kv_accum=True)
    _ptx(split)


def test_row_tile_takes_the_tile_atom():
    """A RowTile keeps its own atom (64 elements at 192 columns) unless the tile names one."""
    from cute_fa.layouts.config import RowTile

    assert RowTile(192, 64, 256, "bfloat16", pad=64).smem_atom_cols == 64
    assert RowTile(192, 64, 256, "bfloat16", pad=64, atom_cols=32).smem_atom_cols == 32
    with pytest.raises(ValueError, match="atom_cols must be 0, 32 or 64"):
        RowTile(192, 64, 256, "bfloat16", pad=64, atom_cols=16)


@pytest.mark.parametrize("head_dim", sorted(BWD_SM90_TILES))
@pytest.mark.parametrize("causal", [False, True])
def test_persistent_compiles(head_dim, causal):
    """The persistent form (`BwdSm90Key.persistent`) of every shipped tile: the same products,
    register split and spill budget (`_ptx`), a tile loop striding by the grid (%nctaid.x,
    which the one-tile kernel does not read) and one more mbarrier (K/V empty)."""
    from cute_fa.layouts.bwd_wgmma import QBarriers

    _, key, _ = bwd_keys(ARCH, "bfloat16", head_dim, causal)
    single = _ptx(key)
    ptx = _ptx(dataclasses.replace(key, persistent=132))
    assert "%nctaid.x" in ptx and "%nctaid.x" not in single
    cfg = key.tile
    assert single.count("mbarrier.init") == QBarriers(cfg.q_stages, cfg.dq_writer).count
    assert ptx.count("mbarrier.init") == QBarriers(cfg.q_stages, cfg.dq_writer, True).count


def test_persistent_refusals():
    _, key, _ = bwd_keys(ARCH, "bfloat16", 128, False)
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="persistent must be 0 or a CTA count"):
            dataclasses.replace(key, persistent=bad)
    for change in (dict(deterministic=True), dict(kv_accum=True),
                   dict(varlen_q=True, varlen_k=True)):
        with pytest.raises(ValueError, match="persistent loops over the key blocks"):
            dataclasses.replace(key, persistent=132, **change)
