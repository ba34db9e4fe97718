"""precompile(decode_groups=..., page_sizes=...) compiles exactly the kernels decode calls then
use: the keys `forward`'s decode planning asks the compiler for (recorded here instead of
compiled, with the GPU's arch and SM count stood in) are all among precompile's."""

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402
from launch_recording import kernels_asked as recorded  # noqa: E402,F401  (a fixture)
from launch_recording import launches  # noqa: E402,F401  (a fixture)


def _plan(batch, seqlen_q, heads_q, heads_kv, head_dim, dtype, causal, *, page_size=0,
          seqused=False, num_splits=None):
    """A decode call, planned as `forward` plans it (the compiler and launch stood in)."""
    q = torch.empty(batch, seqlen_q, heads_q, head_dim, dtype=dtype)
    if page_size:
        k = torch.empty(50, page_size, heads_kv, head_dim, dtype=dtype)
        table = torch.zeros(batch, 8, dtype=torch.int32)
    else:
        k, table = torch.empty(batch, 4096, heads_kv, head_dim, dtype=dtype), None
    lens = torch.zeros(batch, dtype=torch.int32) if seqused else None
    cute_fa.forward(q, k, k, causal=causal, seqused_k=lens, page_table=table,
                    num_splits=num_splits)


def test_decode_calls_use_only_precompiled_kernels(recorded):
    keys = set(cute_fa.precompile(head_dims=(64, 128), dtypes="bfloat16", causal=True,
                                  arch="sm_90a", decode_groups=(4, 8), page_sizes=(64, 256)))
    recorded.clear()
    bf16 = torch.bfloat16
    for batch, seqlen_q, heads_q, heads_kv, head_dim, page_size, seqused, splits in [
            (1, 1, 32, 8, 128, 0, False, None),    # batch 1: split-KV
            (64, 1, 32, 8, 128, 0, False, None),   # a full grid: no split
            (8, 4, 64, 8, 64, 256, True, None),    # speculative decode on a paged cache
            (2, 16, 32, 8, 128, 64, True, 1),      # forced: no split
            (2, 1, 64, 8, 64, 0, True, 7)]:        # forced split, growing dense cache
        _plan(batch, seqlen_q, heads_q, heads_kv, head_dim, bf16, True, page_size=page_size,
              seqused=seqused, num_splits=splits)
    asked = set(recorded)
    assert any(getattr(k, "split_kv", False) for k in asked)  # both kinds were exercised
    assert any(not getattr(k, "split_kv", True) for k in asked)
    assert asked <= keys, asked - keys


def test_a_group_not_precompiled_is_not_among_the_keys(recorded):
    keys = set(cute_fa.precompile(head_dims=128, dtypes="bfloat16", causal=True,
                                  arch="sm_90a", decode_groups=4))
    recorded.clear()
    _plan(1, 1, 64, 8, 128, torch.bfloat16, True)  # group 8
    assert not set(recorded) <= keys


@pytest.mark.parametrize("kwargs, message", [
    (dict(decode_groups=0), "decode_groups must hold positive ints"),
    (dict(decode_groups=(4, True)), "decode_groups must hold positive ints"),
    (dict(decode_groups=4, page_sizes=24), "page_sizes must hold multiples of 16"),
    (dict(page_sizes=64), "page_sizes needs decode_groups"),
    (dict(decode_groups=4, backend="tma"), "decode_groups needs backend='auto' or 'sm80'"),
])
def test_bad_decode_arguments(kwargs, message, recorded):
    with pytest.raises(ValueError, match=message):
        cute_fa.precompile(head_dims=128, arch="sm_90a", **kwargs)
    assert recorded == []  # checked before anything compiles


def test_packed_prefill_calls_use_only_precompiled_kernels(recorded, monkeypatch):
    """Where 'auto' packs a GQA group into the wgmma prefill tiles (`tuning.
    SM90_PACK_GQA_SEQLEN`, set here: causal head_dim 128 from 100 to 3000 queries),
    precompile(decode_groups=...) compiles the packed kernels too: GQA prefill calls on both
    sides of the range's ends ask for nothing else."""
    from cute_fa import tuning

    monkeypatch.setattr(tuning, "SM90_PACK_GQA_SEQLEN", {(128, True): (100, 3000)})
    keys = set(cute_fa.precompile(head_dims=128, dtypes="bfloat16", causal=True,
                                  arch="sm_90a", decode_groups=(4, 8)))
    assert {k.pack_gqa for k in keys if k.backend == "sm90"} == {1, 4, 8}
    recorded.clear()
    for batch, seqlen_q, heads_q in [(1, 99, 32), (2, 100, 32), (1, 2000, 64), (4, 3000, 32),
                                     (1, 3001, 64), (1, 9000, 32)]:
        q = torch.empty(batch, seqlen_q, heads_q, 128, dtype=torch.bfloat16)
        k = torch.empty(batch, seqlen_q, 8, 128, dtype=torch.bfloat16)
        cute_fa.forward(q, k, k, causal=True)
    asked = set(recorded)
    assert {k.pack_gqa for k in asked} == {1, 4, 8}
    assert asked <= keys, asked - keys
