"""The decode kernels (GQA packing, split-KV partials, paged and seqused_k caches) and the merge
kernel compile on the CPU for sm_80, sm_90a and sm_120a, without register spills, with the
instructions they are made of; the keys `forward` builds for decode calls are these."""

import dataclasses
import re

import pytest

from cute_fa.compile.keys import MergeKey
from cute_fa.compile.build import compile_kernel
from cute_fa.compile.ptxas import ptxas_resources
from cute_fa.tuning import SMEM_BYTES, decode_key

ARCHS = ["sm_80", "sm_90a", "sm_120a"]

# (head_dim, causal, seqlen_q, group, page_size, seqused_k, split_kv): a decode step of a
# GQA model split over CTAs; a paged, growing cache with an odd page size; MQA with every
# feature; a longer query (chunked prefill) against a paged cache, which keeps the prefill tile
FEATURES = [
    (64, True, 1, 4, 0, False, True),
    (128, True, 1, 4, 0, False, True),
    (128, False, 4, 8, 48, True, False),
    (128, True, 16, 8, 256, True, True),
    (256, True, 1, 8, 64, True, True),
    (96, False, 2, 1, 16, False, True),
    (192, False, 1, 4, 0, False, False),
    (64, True, 4, 8, 64, True, True),
    (192, True, 8, 4, 0, True, False),
    (128, True, 128, 4, 64, True, False),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("features", FEATURES, ids=lambda f: "-".join(map(str, f)))
def test_decode_kernel_compiles_without_spills(arch, features):
    head_dim, causal, seqlen_q, group, page_size, seqused_k, split_kv = features
    key = decode_key(arch, "bfloat16", head_dim, causal, seqlen_q=seqlen_q, group=group,
                     page_size=page_size, seqused_k=seqused_k, split_kv=split_kv)
    assert key.pack_gqa == (group if seqlen_q <= 16 else 1)
    # up to 32 packed rows: a tile whose warps split the keys (not at head_dim 96, whose 32-wide
    # swizzle atom makes a copy pass of 128 threads 32 rows)
    assert key.tile.warps_split_keys == (seqlen_q * group <= 32 and head_dim != 96)
    if key.tile.warps_split_keys:
        assert key.tile.block_m == (16 if seqlen_q * group <= 16 else 32)
    assert key.tile.smem_bytes() <= SMEM_BYTES[arch]
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    assert re.search(rf"^\.target {arch}\b", ptx, re.M)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    # K/V (paged: shifted per row) still move with 16-byte cp.async
    assert re.search(r"cp\.async\.cg\.shared\.global(\.L2::128B)? \[[^\]]+\], \[[^\]]+\], 16",
                     ptx)
    if key.tile.warps_split_keys:  # the warps' partial O combined in smem, 16-byte stores out
        assert "ex2.approx" in ptx and re.search(r"st\.global\.(v4\.b32|v2\.b64)", ptx)
    elif split_kv:  # float32 partials leave as 32-bit stores, not through smem as 16-bit O
        assert "st.global.b32" in ptx or "st.global.f32" in ptx
    res = ptxas_resources(ptx, arch)
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0, res["log"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("features", [f for f in FEATURES if f[-1]][:4],
                         ids=lambda f: "-".join(map(str, f)))
def test_one_launch_split_kernel_compiles_without_spills(arch, features):
    """Split-KV in one launch (`Sm80Key.fused_merge`): the split kernel counts its CTAs in on a
    per-block counter (an acquire-release atomic, behind GPU-scope fences), and its last CTA
    merges (exp2 weights, the merged LSE's log) and puts the counter back; spill-free."""
    head_dim, causal, seqlen_q, group, page_size, seqused_k, _ = features
    key = dataclasses.replace(decode_key(arch, "bfloat16", head_dim, causal, seqlen_q=seqlen_q,
                                         group=group, page_size=page_size, seqused_k=seqused_k,
                                         split_kv=True), fused_merge=True)
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    assert re.search(r"^\s*atom\.global\.acq_rel(\.gpu)?\.add\.u32", ptx, re.M)
    assert "fence.acq_rel.gpu" in ptx and "st.relaxed.gpu.global.b32" in ptx
    assert "lg2.approx" in ptx
    res = ptxas_resources(ptx, arch)
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0, res["log"]


def _page_lookups(ptx: str) -> int:
    """32-bit global loads in a kernel's PTX (page-table entries, key counts, offsets)."""
    return len(re.findall(r"ld\.global(\.nc)?\.[bsu]32\b", ptx))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("features", [f for f in FEATURES if f[4] and f[2] <= 16],
                         ids=lambda f: "-".join(map(str, f)))
def test_page_prefetch_compiles_without_spills(arch, features):
    """A paged ring reading its next block's pages a round ahead (`Sm80Key.page_prefetch`)
    compiles spill-free; where a page holds whole key blocks it reads one page-table entry
    per block instead of one per copied row, so it has fewer 32-bit global loads than the
    kernel that looks each row's page up as its load is issued."""
    head_dim, causal, seqlen_q, group, page_size, seqused_k, split_kv = features
    key = decode_key(arch, "bfloat16", head_dim, causal, seqlen_q=seqlen_q, group=group,
                     page_size=page_size, seqused_k=seqused_k, split_kv=split_kv)
    if not key.kv_stages:
        with pytest.raises(ValueError, match="page_prefetch"):
            dataclasses.replace(key, page_prefetch=True)
        return
    at_issue = compile_kernel(dataclasses.replace(key, page_prefetch=False),
                              keep_ptx=True).__ptx__
    ahead = compile_kernel(dataclasses.replace(key, page_prefetch=True), keep_ptx=True).__ptx__
    assert ahead != at_issue
    if page_size % key.tile.block_n == 0:
        assert _page_lookups(ahead) < _page_lookups(at_issue)
    res = ptxas_resources(ahead, arch)
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0, res["log"]


def test_page_prefetch_needs_a_paged_ring():
    key = decode_key("sm_90a", "bfloat16", 128, True, seqlen_q=1, group=4, page_size=64,
                     seqused_k=False, split_kv=True)
    assert key.kv_stages >= 2
    for fields in (dict(page_size=0), dict(kv_stages=0)):
        with pytest.raises(ValueError, match="page_prefetch .* needs page_size > 0 and "
                                             "kv_stages >= 2"):
            dataclasses.replace(key, page_prefetch=True, **fields)


def test_decode_key_takes_page_prefetch_as_tuning_says(monkeypatch):
    """`tuning.DECODE_PAGE_PREFETCH` decides for paged rings only."""
    from cute_fa import tuning

    def key(page_size, head_dim=128):
        return decode_key("sm_90a", "bfloat16", head_dim, True, seqlen_q=1, group=4,
                          page_size=page_size, seqused_k=False, split_kv=True)

    for shipped in (False, True):
        monkeypatch.setattr(tuning, "DECODE_PAGE_PREFETCH", shipped)
        assert key(64).page_prefetch == shipped and key(256).page_prefetch == shipped
        assert not key(0).page_prefetch
        assert key(64, head_dim=256).kv_stages == 0 and not key(64, head_dim=256).page_prefetch


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("head_dim, in_dtype, out_dtype", [
    (128, "float32", "bfloat16"), (64, "float32", "float16"), (256, "bfloat16", "bfloat16"),
    (96, "float32", "float32")])
def test_merge_kernel_compiles(arch, head_dim, in_dtype, out_dtype):
    ptx = compile_kernel(MergeKey(arch, head_dim, in_dtype, out_dtype), keep_ptx=True).__ptx__
    assert re.search(rf"^\.target {arch}\b", ptx, re.M)
    assert "ex2.approx" in ptx and "lg2.approx" in ptx  # the weights and the merged LSE
    res = ptxas_resources(ptx, arch)
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0, res["log"]


def test_merge_rejects_a_head_dim_it_cannot_vectorise():
    from cute_fa.kernels.fwd.merge import MergeAttention

    with pytest.raises(ValueError, match="head_dim must be a multiple of 4"):
        MergeAttention(MergeKey("sm_90a", 6, "float32", "bfloat16"))
