"""The mod probe (`kernels/mod_probe.py`: a traced mod's device code, `kernels/common/mods.py`,
at n elements) compiles on the CPU for each arch, for every mask and score mod of
tests/test_mods_trace.py, reading each leaf and each captured element it uses exactly once
(one global load per distinct leaf or load node of the graph) and writing one result."""

import re

import pytest

pytest.importorskip("torch")

from cute_fa.mods import trace_mask_mod, trace_score_mod  # noqa: E402
from test_mods_trace import MASKS, SCORES  # noqa: E402

ARCHS = ["sm_80", "sm_90a", "sm_120a"]
CASES = [(trace_mask_mod, name, MASKS[name]) for name in sorted(MASKS)] + \
        [(trace_score_mod, name, SCORES[name]) for name in sorted(SCORES)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tracer, name, fn", CASES, ids=[c[1] for c in CASES])
def test_mod_probe_compiles(arch, tracer, name, fn):
    from cute_fa.kernels.mod_probe import compile_probe

    graph, _ = tracer(fn)
    ptx = compile_probe(graph, arch).__ptx__
    assert re.search(rf"^\.target {arch}\b", ptx, re.M)
    reads = sum(n.op in ("score", "b", "h", "q_idx", "kv_idx", "load") for n in graph.nodes())
    assert len(re.findall(r"\bld\.global", ptx)) == reads
    assert len(re.findall(r"\bst\.global", ptx)) == 1


# (arch, backend): each forward kernel on an arch it ships for, sm_120a's TMA kernel too
KERNEL_ARCHS = [("sm_80", "sm80"), ("sm_90a", "tma"), ("sm_90a", "sm90"), ("sm_120a", "tma")]
# a score_mod and a mask_mod reading captured tensors (float32 per head, int32 per position),
# and a mask reading a bool table by block: what the kernels' mod hook must carry
KERNEL_MODS = {"alibi_document": (SCORES["alibi"], MASKS["document"]),
               "relative_bias": (SCORES["relative_bias"], None),
               "bool_blocks": (None, lambda b, h, q, kv: BLOCKS[b, h, q // 64, kv // 64])}
BLOCKS = __import__("torch").rand(2, 4, 8, 8) < 0.5


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("arch, backend", KERNEL_ARCHS)
@pytest.mark.parametrize("mods", sorted(KERNEL_MODS))
def test_attention_kernels_compile_with_mods(mods, arch, backend, causal):
    """Each forward kernel with the mods in its key compiles on the CPU with at most
    tuning.MOD_SPILL_BUDGET bytes of spills, loads each captured tensor (a global load a
    kernel without mods lacks) and takes its captures as one argument per tensor."""
    import dataclasses

    from cute_fa.compile.build import compile_kernel
    from cute_fa.compile.ptxas import ptxas_resources
    from cute_fa.tuning import MOD_SPILL_BUDGET, kernel_key

    score_fn, mask_fn = KERNEL_MODS[mods]
    score = trace_score_mod(score_fn)[0] if score_fn else None
    mask = trace_mask_mod(mask_fn)[0] if mask_fn else None
    plain = kernel_key(arch, "bfloat16", 128, causal, backend)
    key = dataclasses.replace(plain, score_mod=score, mask_mod=mask)
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    res = ptxas_resources(ptx, arch)
    assert res["spill_stores"] <= MOD_SPILL_BUDGET and res["spill_loads"] <= MOD_SPILL_BUDGET, \
        res["log"]
    captures = sum(len(g.captures) for g in (score, mask) if g is not None)
    plain_ptx = compile_kernel(plain, keep_ptx=True).__ptx__
    params = len(re.findall(r"\.param\b", ptx)) - len(re.findall(r"\.param\b", plain_ptx))
    assert params >= captures  # at least a pointer per captured tensor
    loads = len(re.findall(r"\bld\.global", ptx)) - len(re.findall(r"\bld\.global", plain_ptx))
    assert loads > 0


@pytest.mark.parametrize("arch, head_dim", [("sm_80", 64), ("sm_90a", 128)])
def test_backward_compiles_with_mods(arch, head_dim):
    """The mma.sync backward with a score_mod (its derivative too) and a mask_mod reading
    captured tensors compiles within tuning.MOD_SPILL_BUDGET; the wgmma backward takes none."""
    import dataclasses

    from cute_fa.compile.build import compile_kernel
    from cute_fa.compile.ptxas import ptxas_resources
    from cute_fa.tuning import MOD_SPILL_BUDGET
    from cute_fa.tuning_bwd import bwd_keys

    score = trace_score_mod(SCORES["gate"])[0]
    mask = trace_mask_mod(MASKS["document"])[0]
    key = dataclasses.replace(bwd_keys(arch, "bfloat16", head_dim, True, backend="sm80")[1],
                              score_mod=score, mask_mod=mask)
    res = ptxas_resources(compile_kernel(key, keep_ptx=True).__ptx__, arch)
    assert res["spill_stores"] <= MOD_SPILL_BUDGET and res["spill_loads"] <= MOD_SPILL_BUDGET, \
        res["log"]
    wgmma = bwd_keys("sm_90a", "bfloat16", head_dim, True, backend="sm90")[1]
    with pytest.raises(ValueError, match="takes no score_mod"):
        dataclasses.replace(wgmma, mask_mod=mask)


@pytest.mark.parametrize("arch, backend", [("sm_80", "sm80"), ("sm_90a", "sm90")])
@pytest.mark.parametrize("mods", ["alibi_document", "bool_blocks"])
def test_block_sparse_kernels_compile(mods, arch, backend):
    """The block-sparse kernels (a block mask's key tile lists, `Sm80Key`/`Sm90Key.block_sparse`)
    compile within tuning.MOD_SPILL_BUDGET with a mask_mod, which runs on the tiles the list
    does not mark whole, beside a score_mod that runs on every tile."""
    import dataclasses

    from cute_fa.compile.build import compile_kernel
    from cute_fa.compile.ptxas import ptxas_resources
    from cute_fa.tuning import MOD_SPILL_BUDGET, kernel_key

    score_fn, mask_fn = KERNEL_MODS[mods]
    key = dataclasses.replace(
        kernel_key(arch, "bfloat16", 128, False, backend), block_sparse=True,
        score_mod=trace_score_mod(score_fn)[0] if score_fn else None,
        mask_mod=trace_mask_mod(mask_fn)[0])
    res = ptxas_resources(compile_kernel(key, keep_ptx=True).__ptx__, arch)
    assert res["spill_stores"] <= MOD_SPILL_BUDGET and res["spill_loads"] <= MOD_SPILL_BUDGET, \
        res["log"]


def test_softcap_mod_runs_the_builtins_tanh(monkeypatch):
    """With `kernels.common.mods.FASTMATH`, a softcap written as a score_mod (tanh(s / c) * c)
    compiles to the built-in softcap's tanh.approx and a multiply by 1 / c: no IEEE division,
    no exact tanh's exponentials."""
    import dataclasses

    import cute_fa.kernels.common.mods as kernel_mods
    from cute_fa.compile.build import compile_kernel
    from cute_fa.tuning import kernel_key

    monkeypatch.setattr(kernel_mods, "FASTMATH", True)

    def softcap(s, b, h, q, kv):
        return __import__("torch").tanh(s / 20.0) * 20.0

    plain = kernel_key("sm_90a", "bfloat16", 128, False, "sm90")
    ptx = compile_kernel(dataclasses.replace(plain, score_mod=trace_score_mod(softcap)[0]),
                         keep_ptx=True).__ptx__
    plain_ptx = compile_kernel(plain, keep_ptx=True).__ptx__
    assert "tanh.approx.f32" in ptx
    for op in (r"\bdiv\.rn\.f32", r"\bex2\.approx"):
        assert len(re.findall(op, ptx)) == len(re.findall(op, plain_ptx)), op
