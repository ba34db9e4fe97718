"""The TMA variant's layouts and schedule, against the hardware's definitions (CPU only).

TMA's 128-byte swizzle (CUDA driver API, CU_TENSOR_MAP_SWIZZLE_128B): inside each
1024-byte span of 8 rows of 128 bytes, the 16-byte chunk c of row r lands in chunk
c XOR (r mod 8). The 64-byte swizzle: rows of 64 bytes, chunk c of row r lands in
chunk c XOR ((r / 2) mod 4). A tile wider than one box is a column of boxes, each
box (box_cols x rows) contiguous.
"""

import pytest

from cute_fa.explain import FlashLayouts
from cute_fa.layouts import TileConfig
from cute_fa.layouts.ring import RingBarriers, ring_slot
from cute_fa.layouts.tma import tma_box
from cute_fa.tuning import max_kv_stages
from cute_fa.tuning import SMEM_BYTES, kernel_key, resolve_backend


def expected_ring_offset(r, c, stage, *, rows, width, box_cols):
    """Element offset TMA writes (row r, column c) of stage `stage` to, 2-byte elements."""
    chunk, within = divmod(c % box_cols, 8)
    if box_cols == 64:
        chunk ^= r % 8
    else:
        assert box_cols == 32
        chunk ^= (r // 2) % 4
    return stage * rows * width + (c // box_cols) * rows * box_cols + r * box_cols + chunk * 8 + within


@pytest.mark.parametrize("head_dim, box_cols", [(128, 64), (64, 64), (96, 32), (32, 32)])
def test_ring_is_the_tma_swizzle(head_dim, box_cols):
    fl = FlashLayouts(head_dim=head_dim, block_m=128, block_n=64, num_threads=128, dtype="bfloat16")
    width = fl.config.head_dim_padded
    for stage in range(2):
        for r in range(64):
            for c in range(width):
                assert fl.ring_offset("K", r, c, stage) == expected_ring_offset(
                    r, c, stage, rows=64, width=width, box_cols=box_cols), (r, c, stage)


@pytest.mark.parametrize("head_dim", [128, 96])
def test_tma_notation_names_the_same_bytes(head_dim):
    """The layout given to TMA (byte swizzle) and the one ldmatrix reads (element swizzle)
    put every element of both ring stages at the same byte."""
    fl = FlashLayouts(head_dim=head_dim, block_m=128, block_n=64, num_threads=128,
                      dtype="bfloat16")
    for stage in range(2):
        for r in range(64):
            for c in range(fl.config.head_dim_padded):
                assert fl.ring_byte_tma(r, c, stage) == 2 * fl.ring_offset("K", r, c, stage)


def test_tma_box_head_dim_128():
    cfg = TileConfig(head_dim=128, block_m=128, block_n=64, num_threads=128, dtype="bfloat16")
    box = tma_box(cfg, "K")
    # 64 bf16 = 128 bytes per box row; 128 columns = 2 boxes; 64 x 128 x 2 bytes = 16 KiB
    assert (box.rows, box.cols, box.swizzle_bytes, box.boxes_per_tile, box.tile_bytes) == \
        (64, 64, 128, 2, 16384)
    q = tma_box(cfg, "Q")
    assert (q.rows, q.boxes_per_tile, q.tile_bytes) == (128, 2, 32768)


def test_tma_box_head_dim_96_uses_64_byte_swizzle():
    cfg = TileConfig(head_dim=96, block_m=128, block_n=64, num_threads=128, dtype="float16")
    box = tma_box(cfg, "V")
    assert (box.cols, box.swizzle_bytes, box.boxes_per_tile) == (32, 64, 3)


def test_ring_slot_phases():
    # two stages: rounds fill stages 0,1,0,1,...; each stage's barrier completes once per lap
    assert [ring_slot(i, 2) for i in range(6)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 0), (1, 0)]
    assert ring_slot(3, 3) == (0, 1) and ring_slot(7, 3) == (1, 0)
    assert [ring_slot(i, 1) for i in range(3)] == [(0, 0), (0, 1), (0, 0)]


def test_ring_rounds_table():
    rounds = FlashLayouts.ring_rounds(5, 2)
    assert [(r["key_block"], r["stage"], r["wait_phase"], r["refills_with_block"])
            for r in rounds] == [(4, 0, 0, 2), (3, 1, 0, 1), (2, 0, 1, 0), (1, 1, 1, None),
                                 (0, 0, 0, None)]


def test_kv_stages_fit_shared_memory():
    d128 = TileConfig(head_dim=128, block_m=128, block_n=64, num_threads=128, dtype="bfloat16")
    # Q 32 KiB + 32 KiB per K+V stage; two CTAs per SM share 227 KiB: 2 stages
    assert max_kv_stages(d128, 227 * 1024) == 2
    d64 = TileConfig(head_dim=64, block_m=128, block_n=64, num_threads=128, dtype="bfloat16")
    assert max_kv_stages(d64, 227 * 1024) == 4  # 16 + 4 x 16 KiB, capped at 4
    for arch in ("sm_90a", "sm_120a"):
        for head_dim in (32, 64, 128, 192, 256):
            for causal in (False, True):
                key = kernel_key(arch, "bfloat16", head_dim, causal, "tma")
                assert key.backend == "tma" and key.kv_stages >= 1
                assert key.tile.smem_bytes(key.kv_stages) + 1024 <= SMEM_BYTES[arch]
                if key.ctas_per_sm:  # a register cap for n CTAs is moot unless n fit in smem
                    sm_smem = 228 * 1024 if arch == "sm_90a" else 100 * 1024
                    assert key.ctas_per_sm * (key.tile.smem_bytes(key.kv_stages) + 1024) <= sm_smem


def test_backend_choice_and_errors():
    assert resolve_backend("sm_80", "auto", 128, False) == "sm80"
    assert resolve_backend("sm_90a", "auto", 64, True) == "sm90"
    assert resolve_backend("sm_90a", "auto", 256, False) == "sm90"
    assert resolve_backend("sm_90a", "tma", 64, True) == "tma"
    assert resolve_backend("sm_120a", "sm80", 64, True) == "sm80"
    with pytest.raises(ValueError, match="backend must be one of 'sm80', 'tma', 'sm90', 'auto', got 'wgmma'"):
        resolve_backend("sm_90a", "wgmma", 64, False)
    with pytest.raises(ValueError, match="backend='tma' needs an sm90 or newer GPU"):
        resolve_backend("sm_86", "tma", 64, False)


def test_tma_objects_are_in_seqlen_headdim_heads_batch_order():
    fl = FlashLayouts(head_dim=128, block_m=128, block_n=64, num_threads=128, dtype="bfloat16")
    objs = fl.tma_objects()
    # the TMA tensor's mode 0 (seqlen) is TMA coordinate 1, head_dim (128) is coordinate 0
    assert "(?,128,?,?):(1@1,1@0,1@2,1@3)" in objs["tma_tensor"]
    # the ring ldmatrix reads swizzles element offsets; the one TMA is given, byte addresses
    assert objs["smem_ring"].startswith("S<3,3,3>")
    assert objs["smem_ring_tma"].startswith("S<3,4,3>") and "S<3,4,3>" in objs["tKsK"]
    # one box is 64 columns x 64 rows, a tile two boxes 64 columns apart
    assert "(((64,64),2),?):(((1@0,1@1),64@0),64@1)" in objs["tKgK"]


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_ring_barriers_cover_the_array_once(stages):
    # Q's barrier, then K, V and "empty" for each stage: 1 + 3 * stages slots, none shared
    bars = RingBarriers(stages)
    slots = [bars.q] + [base + s for base in (bars.k, bars.v, bars.empty) for s in range(stages)]
    assert sorted(slots) == list(range(1 + 3 * stages)) == list(range(bars.count))
