"""The wgmma kernel (backend 'sm90') compiles for sm_90a in every shipped configuration: no
spills (ptxas), shared memory within the arch's, wgmma and setmaxnreg in the PTX; and its key
and tile rules refuse what it cannot run, before any tracing."""

import dataclasses
import re

import pytest

from cute_fa.compile.keys import Sm90Key
from cute_fa.compile.registry import REGISTRY
from cute_fa.compile.build import compile_kernel
from cute_fa.compile.ptxas import ptxas_resources
from cute_fa.layouts import TileConfig, wgmma
from cute_fa.tuning import (SM90_LONG_TILES, SM90_PACKED_P, SM90_TILES, SMEM_BYTES,
                             kernel_key)

# every head_dim class, both dtypes, causal or not; and the features on top
PLAIN = [(hd, dtype, causal) for hd in (64, 128, 192, 256) for dtype in ("bfloat16", "float16")
         for causal in (False, True)]


def _check(key):
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    assert re.search(r"^\.target sm_90a\b", ptx, re.M)
    # both GEMMs are warpgroup MMAs: S = Q K^T reads both operands through smem descriptors,
    # O += P V reads P from registers (its A operand is a register list, not a descriptor)
    wgmmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.(?:bf16|f16)"
                        r"\.(?:bf16|f16)\s+\{[^}]*\},\s*(\{|%rd)", ptx)
    ns = {int(n) for n, _ in wgmmas}
    assert key.tile.block_n in ns and key.tile.head_dim_padded in ns, ns
    assert any(a == "{" for _, a in wgmmas), "no register-A (RS) wgmma for P V"
    assert "setmaxnreg.dec.sync.aligned.u32" in ptx and "setmaxnreg.inc.sync.aligned.u32" in ptx
    assert "mma.sync" not in ptx
    # packed_p: P leaves S two values per conversion (`convert.pack_pairs`), as O always does
    # (without it LLVM decides, and in the overlapped loop converts a value at a time)
    if key.packed_p:
        assert not re.search(r"cvt\.rn\.(?:bf16|f16)\.f32", ptx), "a value converted alone"
    # O leaves by one TMA store from stmatrix-written smem, but in ragged batches
    stored_by_tma = key.tma_store and not key.varlen_q
    assert bool(re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)) == stored_by_tma
    assert ("stmatrix" in ptx) == stored_by_tma
    res = ptxas_resources(ptx, "sm_90a")
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0, res["log"]
    stages = key.kv_stages
    assert key.tile.smem_bytes(stages) + 1024 <= SMEM_BYTES["sm_90a"]


@pytest.mark.parametrize("head_dim, dtype, causal", PLAIN, ids=str)
def test_shipped_kernel_compiles(head_dim, dtype, causal):
    key = kernel_key("sm_90a", dtype, head_dim, causal, "sm90")
    assert isinstance(key, Sm90Key) and key.tile.wgmma and key.lpt == causal
    assert (key.tile.block_m, key.tile.block_n, key.tile.num_threads) == \
        SM90_TILES[head_dim, causal]
    _check(key)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("cls, causal", sorted(SM90_LONG_TILES), ids=str)
def test_long_tiles(cls, causal, dtype):
    """SM90_LONG_TILES: plain calls of at least its query count take its tile, and compile
    spill-free, persistent too; shorter calls, and calls with a window, a softcap or a
    ragged batch (not measured on it), keep SM90_TILES'."""
    start, tile = SM90_LONG_TILES[cls, causal]

    def shape(key):
        return key.tile.block_m, key.tile.block_n, key.tile.num_threads

    long = kernel_key("sm_90a", dtype, cls, causal, "auto", seqlen_q=start)
    assert long.backend == "sm90" and shape(long) == tile != SM90_TILES[cls, causal]
    _check(long)
    _check(dataclasses.replace(long, persistent=132))
    for key in (kernel_key("sm_90a", dtype, cls, causal, "auto", seqlen_q=start - 1),
                kernel_key("sm_90a", dtype, cls, causal, "auto"),
                kernel_key("sm_90a", dtype, cls, causal, "sm90", seqlen_q=start, local=True),
                kernel_key("sm_90a", dtype, cls, causal, "sm90", seqlen_q=start, softcap=True),
                kernel_key("sm_90a", dtype, cls, causal, "sm90", seqlen_q=start, varlen=True)):
        assert shape(key) == SM90_TILES[cls, causal], key


# tiles whose S and P need the registers the packed conversion frees: with P converted a value
# at a time, ptxas spilled 212-232 bytes at 128 x 176 (head_dim 128). None of them measured
# faster than SM90_TILES' (docs/perf/2026-12-06-h100-sm90-tiles); they stay compiled here as
# the packed conversion's check on 11 and 12 k-steps of P
WIDE_TILES = [(128, False, 176), (128, True, 176), (128, False, 192), (128, True, 192),
              (64, False, 192), (64, True, 192)]


@pytest.mark.parametrize("head_dim, causal, block_n", WIDE_TILES, ids=str)
def test_wide_key_blocks_compile(head_dim, causal, block_n):
    key = kernel_key("sm_90a", "bfloat16", head_dim, causal, "sm90")
    _check(dataclasses.replace(key, packed_p=True, tile=TileConfig(
        head_dim=head_dim, block_m=128, block_n=block_n, num_threads=256, dtype="bfloat16",
        wgmma=True)))


def test_packed_p_follows_the_table():
    for cls in (64, 128, 192, 256):
        for causal in (False, True):
            key = kernel_key("sm_90a", "float16", cls, causal, "sm90", seqlen_q=4096)
            assert key.packed_p == ((cls, causal) in SM90_PACKED_P)


@pytest.mark.parametrize("head_dim", [32, 96, 160, 200])
def test_padded_head_dims_compile(head_dim):
    _check(kernel_key("sm_90a", "bfloat16", head_dim, True, "sm90"))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_feature_kernels_compile(head_dim):
    _check(kernel_key("sm_90a", "bfloat16", head_dim, True, "sm90", local=True, softcap=True,
                      varlen=True))


@pytest.mark.parametrize("changes", [dict(pingpong=False), dict(intra_wg_overlap=False),
                                     dict(pingpong=False, intra_wg_overlap=False),
                                     dict(tma_store=False)], ids=str)
def test_schedule_variants_compile(changes):
    """The A/B variants of docs/perf (each step of the schedule off)."""
    _check(dataclasses.replace(kernel_key("sm_90a", "bfloat16", 128, False, "sm90"), **changes))


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_120a"])
def test_sm90_is_hopper_only(arch):
    assert not REGISTRY["sm90"].supports(arch)
    with pytest.raises(ValueError, match=r"backend='sm90' needs an sm90 GPU \(Hopper\)"):
        kernel_key(arch, "bfloat16", 128, False, "sm90")


def test_tile_rules():
    with pytest.raises(ValueError, match="block_m must be 64 per consumer warpgroup = 128"):
        wgmma.check_tile(TileConfig(head_dim=64, block_m=256, block_n=64, num_threads=256,
                                    wgmma=True))
    with pytest.raises(ValueError, match="num_threads must be 128, 256 or 384"):
        wgmma.check_tile(TileConfig(head_dim=64, block_m=256, block_n=64, num_threads=512,
                                    wgmma=True))
    with pytest.raises(ValueError, match="kv_stages must be at least 2"):
        REGISTRY["sm90"].build(dataclasses.replace(
            kernel_key("sm_90a", "bfloat16", 64, False, "sm90"), kv_stages=1))
    # K/V arrive by TMA: block_n need not divide into the copy passes of 256 threads
    TileConfig(head_dim=256, block_m=128, block_n=80, num_threads=256, wgmma=True)
    with pytest.raises(ValueError, match="block_n must be a multiple of 32"):
        TileConfig(head_dim=256, block_m=128, block_n=80, num_threads=256)


def test_auto_choice_on_hopper():
    """'auto' on sm_90a: the wgmma kernel for every head_dim, causal or not, short or long,
    with or without features; the sm80 kernel elsewhere."""
    def backend(hd, causal, seqlen_q=None, **kw):
        return kernel_key("sm_90a", "bfloat16", hd, causal, "auto", seqlen_q=seqlen_q,
                          **kw).backend

    assert backend(64, True, 2048) == "sm90" and backend(48, True, 1) == "sm90"
    assert backend(64, True, 2049) == "sm90" and backend(64, False, 1024) == "sm90"
    assert backend(128, True, 512) == "sm90" and backend(256, True, 100) == "sm90"
    assert kernel_key("sm_80", "bfloat16", 64, True, "auto", seqlen_q=100).backend == "sm80"
    assert kernel_key("sm_120a", "bfloat16", 128, True, "auto").backend == "sm80"
    assert backend(64, True, None) == "sm90"
    assert backend(64, True, 1024, varlen=True, local=True) == "sm90"


@pytest.mark.parametrize("head_dim, causal", [(64, False), (64, True), (128, False),
                                              (128, True)])
def test_persistent_kernel_compiles(head_dim, causal):
    """persistent (`PersistentTileScheduler`): the same checks, and its own barrier (q_empty)
    and O tile (sO) within shared memory."""
    from cute_fa.layouts.ring import PipelineBarriers

    key = dataclasses.replace(kernel_key("sm_90a", "bfloat16", head_dim, causal, "sm90"),
                              persistent=132)
    _check(key)
    bars = PipelineBarriers(key.kv_stages, q_empty=True)
    assert bars.count == PipelineBarriers(key.kv_stages).count + 1 == bars.q_released + 1
    cfg = key.tile
    assert cfg.smem_bytes(key.kv_stages) + cfg.block_m * cfg.head_dim_padded * \
        cfg.elem_bytes + 1024 <= SMEM_BYTES["sm_90a"]


def test_persistent_refusals():
    key = kernel_key("sm_90a", "bfloat16", 128, True, "sm90")
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="persistent must be 0 or a CTA count"):
            dataclasses.replace(key, persistent=bad)
    for change in (dict(varlen_q=True, varlen_k=True), dict(tma_store=False)):
        with pytest.raises(ValueError, match="dense call"):
            dataclasses.replace(key, persistent=132, **change)
    from cute_fa.layouts.ring import PipelineBarriers
    with pytest.raises(ValueError, match="no q_empty"):
        PipelineBarriers(2).q_released
    # head_dim 256: two K/V stages and Q fill the 227 KB, O has no room of its own
    from cute_fa.kernels.fwd.sm90 import FlashFwdSm90
    big = dataclasses.replace(kernel_key("sm_90a", "bfloat16", 256, True, "sm90"),
                              persistent=132)
    with pytest.raises(ValueError, match="stages O in its own tile"):
        FlashFwdSm90(big)


# (head_dim, causal, group, long tile): GQA packing (`Sm90Key.pack_gqa`) at every head_dim
# class, a group of 16 and the three-warpgroup tile (192 rows: 8 | 192)
PACKED = [(64, True, 4, False), (64, False, 8, False), (64, True, 8, True), (128, True, 8, False),
          (128, False, 4, False), (192, True, 4, False), (256, False, 2, False),
          (128, True, 16, False)]


@pytest.mark.parametrize("head_dim, causal, group, long", PACKED, ids=str)
def test_packed_gqa_compiles(head_dim, causal, group, long):
    """Q and O of a packed tile move as 5-D tensor maps (head_dim, group, seqlen, K/V head,
    batch): one box of whole groups, no other copy path; spill-free like the unpacked kernel."""
    key = kernel_key("sm_90a", "bfloat16", head_dim, causal, "sm90",
                     seqlen_q=4096 if long else None)
    assert key.tile.block_m == (192 if long or (head_dim, causal) == (64, False) else 128)
    key = dataclasses.replace(key, pack_gqa=group)
    _check(key)
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    assert re.search(r"cp\.async\.bulk\.tensor\.5d\.shared::cta\.global", ptx)  # Q
    assert re.search(r"cp\.async\.bulk\.tensor\.5d\.global\.shared::cta", ptx)  # O
    assert re.search(r"cp\.async\.bulk\.tensor\.4d\.shared::cta\.global", ptx)  # K, V


def test_pack_gqa_key_rules():
    key = kernel_key("sm_90a", "bfloat16", 128, True, "sm90")
    assert key.pack_gqa == 1
    for bad in (0, -2, True, 2.0, "4"):
        with pytest.raises(ValueError, match="pack_gqa must be a query head count"):
            dataclasses.replace(key, pack_gqa=bad)
    with pytest.raises(ValueError, match=r"pack_gqa=3 must divide block_m=128"):
        dataclasses.replace(key, pack_gqa=3)
    with pytest.raises(ValueError, match="not with a ragged Q, persistent or tma_store=False"):
        dataclasses.replace(key, pack_gqa=4, varlen_q=True, varlen_k=True)
    with pytest.raises(ValueError, match="not with a ragged Q, persistent or tma_store=False"):
        dataclasses.replace(key, pack_gqa=4, persistent=132)
    with pytest.raises(ValueError, match="not with a ragged Q, persistent or tma_store=False"):
        dataclasses.replace(key, pack_gqa=4, tma_store=False)
    assert dataclasses.replace(key, pack_gqa=8, local=True, softcap=True).pack_gqa == 8
