"""Kernels with a sliding window, a softcap or a ragged batch compile on the CPU without
register spills, for every arch and backend they ship on: every entry of
tuning.FEATURE_TILES (the feature kernels whose plain tile spilled), the backends 'auto' takes
instead (tuning.AUTO_FEATURES), and per arch, backend and head_dim class the kernel with all
three features, in both causalities; and decode kernels with a window and a softcap. The sm80
prefill kernels are spill-free; the TMA and decode feature kernels keep their plain tiles
and spill at most tuning.FEATURE_SPILL_BUDGET bytes. The softcap is a tanh.approx per score;
the window and the ragged batch add no instruction kind."""

import re

import pytest

from cute_fa.compile.build import compile_kernel
from cute_fa.compile.ptxas import ptxas_resources
from cute_fa.tuning import (AUTO_FEATURES, FEATURE_SPILL_BUDGET, FEATURE_TILES, SMEM_BYTES,
                            SPILLING_FEATURE_KERNELS, decode_key, kernel_key)

ARCH_BACKENDS = [("sm_80", "sm80"), ("sm_90a", "sm80"), ("sm_90a", "tma"), ("sm_90a", "sm90"),
                 ("sm_120a", "sm80"), ("sm_120a", "tma")]
ALL = (True, True, True)
CASES = sorted({(arch, backend, hd, causal, ALL) for arch, backend in ARCH_BACKENDS
                for hd in (64, 128, 192, 256) for causal in (True, False)}
               | set(FEATURE_TILES)
               | {(arch, "tma", hd, causal, features)
                  for arch, hd, causal, features in AUTO_FEATURES})


@pytest.mark.parametrize("arch, backend, head_dim, causal, features", CASES, ids=str)
def test_feature_kernel_compiles_without_spills(arch, backend, head_dim, causal, features):
    local, softcap, varlen = features
    for dtype in ("bfloat16", "float16"):
        key = kernel_key(arch, dtype, head_dim, causal, backend, local=local, softcap=softcap,
                         varlen=varlen)
        assert (key.local, key.softcap, key.varlen_q, key.varlen_k) == (local, softcap, varlen,
                                                                        varlen)
        tile = FEATURE_TILES.get((arch, backend, head_dim, causal, features))
        if tile is not None:
            assert (key.tile.block_m, key.tile.block_n, key.tile.num_threads) == tile
        assert key.tile.smem_bytes(getattr(key, "kv_stages", 1) or 1) <= SMEM_BYTES[arch]
        ptx = compile_kernel(key, keep_ptx=True).__ptx__
        assert re.search(rf"^\.target {arch}\b", ptx, re.M)
        assert ("tanh.approx.f32" in ptx) == softcap
        res = ptxas_resources(ptx, arch)
        # the sm80 kernels spill-free but for the one no tile made so (`auto` does not run
        # it); the TMA kernels keep their plain tiles, within a budget (tuning.FEATURE_TILES
        # says why)
        allowed = SPILLING_FEATURE_KERNELS.get((arch, backend, head_dim, causal, features),
                                               FEATURE_SPILL_BUDGET if backend == "tma" else 0)
        assert res["spill_stores"] <= allowed and res["spill_loads"] <= allowed, \
            (dtype, res["log"])


# decode with a sliding window and a softcap (Gemma 2's and Mistral's decode steps): the three
# decode tiles (16 and 32 packed rows, whose warps split the keys, and 64), paged, split
DECODE_CASES = [(arch, hd, seqlen_q, group, split)
                for arch in ("sm_80", "sm_90a", "sm_120a") for hd in (64, 128, 256)
                for seqlen_q, group, split in ((1, 4, True), (4, 8, False), (4, 16, True))]


@pytest.mark.parametrize("arch, head_dim, seqlen_q, group, split", DECODE_CASES, ids=str)
def test_decode_feature_kernel_compiles(arch, head_dim, seqlen_q, group, split):
    key = decode_key(arch, "bfloat16", head_dim, True, seqlen_q=seqlen_q, group=group,
                     page_size=64, seqused_k=True, split_kv=split, local=True, softcap=True)
    assert key.local and key.softcap and key.pack_gqa == group
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    assert "tanh.approx.f32" in ptx
    res = ptxas_resources(ptx, arch)
    assert res["spill_stores"] <= FEATURE_SPILL_BUDGET, res["log"]
    assert res["spill_loads"] <= FEATURE_SPILL_BUDGET, res["log"]
