"""precompile(varlen=True, windows=True, softcap=True) compiles the kernels that calls with a
ragged batch, a sliding window or a softcap then use: the keys `forward` and `forward_varlen`
ask the compiler for (recorded instead of compiled; the GPU's arch, SM count and the launch
stood in) are all among precompile's, and without the flags they are not."""

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402
from launch_recording import kernels_asked as recorded  # noqa: E402,F401  (a fixture)
from launch_recording import launches  # noqa: E402,F401  (a fixture)


def _calls():
    bf16 = torch.bfloat16
    q = torch.randn(2, 300, 32, 128, dtype=bf16)
    k = torch.randn(2, 300, 8, 128, dtype=bf16)
    cute_fa.forward(q, k, k, causal=True, window_size=(255, 0))
    cute_fa.forward(q, k, k, causal=True, softcap=30.0, window_size=(255, 0))
    cute_fa.forward(q[:, :1], k, k, causal=True, window_size=(63, 0), softcap=30.0)  # decode
    lens = torch.tensor([0, 100, 200], dtype=torch.int32)
    cute_fa.forward_varlen(q[0], k[0], k[0], lens, lens, 100, 100, causal=True)
    cute_fa.forward_varlen(q[0], k[0], k[0], lens, lens, 100, 100, causal=True,
                           window_size=(31, 0), softcap=5.0)
    cute_fa.forward_varlen(q[0], k[0], k[0], lens, lens, 100, 100, causal=True,
                           seqused_k=torch.tensor([0, 50], dtype=torch.int32))
    pages = torch.randn(8, 64, 8, 128, dtype=bf16)
    cute_fa.forward_varlen(q[0], pages, pages, lens, lens, 100, 256, causal=True,
                           page_table=torch.zeros(2, 4, dtype=torch.int32))
    cute_fa.forward_varlen(q[0], pages, pages, lens, None, 100, 256, causal=True,
                           page_table=torch.zeros(2, 4, dtype=torch.int32),
                           seqused_k=torch.tensor([50, 256], dtype=torch.int32))


def test_feature_calls_use_only_precompiled_kernels(recorded):
    keys = set(cute_fa.precompile(head_dims=128, dtypes="bfloat16", causal=True, arch="sm_90a",
                                  decode_groups=4, page_sizes=64, varlen=True, windows=True,
                                  softcap=True))
    recorded.clear()
    _calls()
    asked = set(recorded)
    assert any(k.local and k.softcap for k in asked) and any(k.varlen_q for k in asked)
    assert asked <= keys, asked - keys


def test_without_the_flags_they_are_not_compiled(recorded):
    keys = set(cute_fa.precompile(head_dims=128, dtypes="bfloat16", causal=True, arch="sm_90a",
                                  decode_groups=4, page_sizes=64))
    assert not any(k.local or k.softcap or k.varlen_q for k in keys if hasattr(k, "tile"))
    recorded.clear()
    _calls()
    assert not set(recorded) <= keys


def test_flags_must_be_bools():
    with pytest.raises(TypeError, match="windows must be a bool"):
        cute_fa.precompile(head_dims=128, arch="sm_90a", windows=1)


def test_short_and_long_causal_calls_use_precompiled_kernels(recorded):
    """At head_dim 64 on sm_90a 'auto' runs causal calls on the wgmma kernel's two-warpgroup
    tile up to 2047 queries and on the long calls' three-warpgroup tile from 2048
    (tuning.SM90_LONG_TILES): precompile covers both."""
    keys = set(cute_fa.precompile(head_dims=64, dtypes="bfloat16", causal=True, arch="sm_90a"))
    recorded.clear()
    for batch, seqlen, heads in ((1, 300, 8), (8, 1500, 32), (1, 3000, 8)):
        q = torch.randn(batch, seqlen, heads, 64, dtype=torch.bfloat16)
        cute_fa.forward(q, q, q, causal=True)
    asked = set(recorded)
    assert {k.backend for k in asked} == {"sm90"}
    assert {k.tile.num_threads for k in asked} == {256, 384}
    assert asked <= keys, asked - keys


def test_backward_calls_use_only_precompiled_kernels(recorded):
    """precompile(backward=True): the kernels a backward call asks for (dense, with a window
    and softcap, ragged) are precompile's; without the flag none of them is."""
    common = dict(head_dims=128, dtypes="bfloat16", causal=True, arch="sm_90a", varlen=True,
                  windows=True, softcap=True)
    without = set(cute_fa.precompile(**common))
    keys = set(cute_fa.precompile(**common, backward=True))
    recorded.clear()
    bf16 = torch.bfloat16
    q, out, dout = (torch.randn(2, 300, 32, 128, dtype=bf16) for _ in range(3))
    k = torch.randn(2, 300, 8, 128, dtype=bf16)
    lse = torch.randn(2, 32, 300)
    cute_fa.backward(dout, q, k, k, out, lse, True)
    cute_fa.backward(dout, q, k, k, out, lse, True, window_size=(255, 0), softcap=30.0)
    lens = torch.tensor([0, 100, 200], dtype=torch.int32)
    cute_fa.backward_varlen(dout[0], q[0], k[0], k[0], out[0], lse[0], lens, lens, 100, 100,
                             True)
    asked = set(recorded)
    # head_dim 128 on sm90: the wgmma backward (tests/test_compile_bwd_sm90.py); these small
    # GQA grids split their groups over CTAs, so dK and dV have their postprocess too
    # (tests/test_bwd_head_splits.py)
    assert {type(k).__name__ for k in asked} == {"BwdPrepKey", "BwdSm90Key", "BwdPostKey",
                                                 "BwdKvPostKey"}
    assert any(getattr(k, "kv_accum", False) for k in asked)
    assert any(getattr(k, "varlen_q", False) for k in asked)
    assert asked <= keys, asked - keys
    assert not asked & without


def test_every_backward_key_has_a_progress_line():
    """`precompile --backward` reports each kernel as it compiles (`describe`): the row kernels'
    tiles (D = rowsum(dO * O), dQ's conversion) have rows but no key block."""
    from cute_fa.api.precompile import describe
    from cute_fa.tuning_bwd import bwd_keys

    prep, main, post = bwd_keys("sm_90a", "bfloat16", 128, True)
    assert describe(prep) == f"bwd_pre sm_90a bfloat16 head_dim 128 {prep.tile.block_m} rows"
    assert f"{main.tile.block_m}x{main.tile.block_n}" in describe(main)
    assert "bwd_sm90" in describe(main) and describe(post)


def test_deterministic_backward_calls_use_only_precompiled_kernels(recorded):
    """precompile(backward=True, deterministic=True): the kernels of a deterministic backward
    call (its main kernel is another than the default's) are precompile's; with backward
    alone they are not all there; deterministic without backward is refused."""
    common = dict(head_dims=128, dtypes="bfloat16", causal=True, arch="sm_90a", backward=True)
    default = set(cute_fa.precompile(**common))
    keys = set(cute_fa.precompile(**common, deterministic=True))
    recorded.clear()
    bf16 = torch.bfloat16
    q, out, dout = (torch.randn(2, 300, 32, 128, dtype=bf16) for _ in range(3))
    k = torch.randn(2, 300, 8, 128, dtype=bf16)
    cute_fa.backward(dout, q, k, k, out, torch.randn(2, 32, 300), True, deterministic=True)
    asked = set(recorded)
    assert any(getattr(key, "deterministic", False) for key in asked)
    assert asked <= keys, asked - keys
    assert not asked <= default
    with pytest.raises(ValueError, match="deterministic needs backward=True"):
        cute_fa.precompile(head_dims=128, arch="sm_90a", deterministic=True)
