"""The mod probe (`kernels/mod_probe.py`: a traced mod's device code, `kernels/common/mods.py`,
at n elements) compiles on the CPU for each arch, for every mask and score mod of
tests/test_mods_trace.py, reading each leaf and each captured element it uses exactly once
(one global load per distinct leaf or load node of the graph) and writing one result."""

import re

import pytest

pytest.importorskip("torch")

from cute_fa.mods import trace_mask_mod, trace_score_mod  # noqa: E402
from test_mods_trace import MASKS, SCORES, SLOPES  # noqa: E402

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


@pytest.mark.parametrize("arch, backend, head_dim, causal",
                         [("sm_80", "sm80", 64, True), ("sm_90a", "sm80", 128, True),
                          ("sm_90a", "sm90", 64, False), ("sm_90a", "sm90", 128, True),
                          ("sm_90a", "sm90", 192, True), ("sm_90a", "sm90", 256, False)])
def test_backward_compiles_with_mods(arch, backend, head_dim, causal):
    """The mma.sync and wgmma backwards with a score_mod (its derivative too) and a mask_mod
    reading captured tensors compile within tuning.MOD_SPILL_BUDGET, loading the captures; the
    persistent wgmma one refuses a block mask's query tile lists."""
    import dataclasses

    from cute_fa.compile.build import compile_kernel
    from cute_fa.compile.ptxas import ptxas_resources
    from cute_fa.tuning import MOD_SPILL_BUDGET
    from cute_fa.tuning_bwd import bwd_keys

    score = trace_score_mod(SCORES["gate"])[0]
    mask = trace_mask_mod(MASKS["document"])[0]
    plain = bwd_keys(arch, "bfloat16", head_dim, causal, backend=backend)[1]
    key = dataclasses.replace(plain, score_mod=score, mask_mod=mask)
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    res = ptxas_resources(ptx, arch)
    assert res["spill_stores"] <= MOD_SPILL_BUDGET and res["spill_loads"] <= MOD_SPILL_BUDGET, \
        res["log"]
    loads = len(re.findall(r"\bld\.global", ptx)) - len(re.findall(
        r"\bld\.global", compile_kernel(plain, keep_ptx=True).__ptx__))
    assert loads >= len(key.mod_captures), loads
    if backend == "sm90":  # a persistent CTA's tiles would need their own lists
        with pytest.raises(ValueError, match="persistence"):
            dataclasses.replace(key, causal=False, block_sparse=True, persistent=132)


@pytest.mark.parametrize("arch, backend, head_dim", [("sm_80", "sm80", 128),
                                                    ("sm_90a", "sm90", 128),
                                                    ("sm_90a", "sm90", 64),
                                                    ("sm_90a", "sm90", 256),
                                                    ("sm_120a", "tma", 128),
                                                    ("sm_90a", "tma", 64)])
@pytest.mark.parametrize("mods", ["alibi_document", "bool_blocks", "blocks_only",
                                  "exact_document"])
def test_block_sparse_kernels_compile(mods, arch, backend, head_dim):
    """The block-sparse kernels (a block mask's key tile lists, `block_sparse` of the cp.async,
    wgmma and TMA kernels' keys)
    compile within tuning.MOD_SPILL_BUDGET with a mask_mod, which runs on the tiles the list
    does not mark whole, beside a score_mod that runs on every tile; with no mask_mod (a mask
    of blocks alone); and with the mask_mod a tile that straddles the mask's blocks runs
    (`block_mask.exact_mask_mod`: the blocks' kinds read per score; the wgmma kernel's 192 x
    128 tile at head_dim 64 against blocks of 128)."""
    import dataclasses

    from cute_fa.compile.build import compile_kernel
    from cute_fa.compile.ptxas import ptxas_resources
    from cute_fa.mods.block_mask import exact_mask_mod
    from cute_fa.tuning import EXACT_BLOCKS_SPILL_BUDGET, MOD_SPILL_BUDGET, kernel_key, mods_tile

    score_fn, mask_fn = {"blocks_only": (None, None),
                         "exact_document": (None, MASKS["document"])}.get(mods) \
        or KERNEL_MODS[mods]
    mask = trace_mask_mod(mask_fn)[0] if mask_fn else None
    budget = MOD_SPILL_BUDGET
    if mods == "exact_document":  # blocks of 32 no tile fits
        mask, budget = exact_mask_mod(mask, (32, 32)), EXACT_BLOCKS_SPILL_BUDGET
    key = kernel_key(arch, "bfloat16", head_dim, False, backend)
    key = dataclasses.replace(key, tile=mods_tile(key, (128, 128)), block_sparse=True,
                              score_mod=trace_score_mod(score_fn)[0] if score_fn else None,
                              mask_mod=mask)
    res = ptxas_resources(compile_kernel(key, keep_ptx=True).__ptx__, arch)
    assert res["spill_stores"] <= budget and res["spill_loads"] <= budget, res["log"]


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


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_softcap_mod_multiplies_as_the_builtin(direction):
    """A softcap written as a score_mod multiplies as often as the built-in softcap (the wgmma
    kernels, sm_90a): its derivative's constants folded (`mods.grad`), the score's 1 / c in
    the pre-scale and its result's c in the softmax scale (`mods.graph.scaled_score`,
    `root_factor`): at most one float32 multiply more in the PTX (pre_scale * 1 / c), where
    four a score more were issued before."""
    import dataclasses

    from cute_fa.compile.build import compile_kernel
    from cute_fa.tuning import kernel_key
    from cute_fa.tuning_bwd import bwd_keys

    def softcap(s, b, h, q, kv):
        return __import__("torch").tanh(s / 20.0) * 20.0

    mod = trace_score_mod(softcap)[0]
    if direction == "forward":
        builtin = kernel_key("sm_90a", "bfloat16", 128, True, "sm90", softcap=True)
        plain = kernel_key("sm_90a", "bfloat16", 128, True, "sm90")
    else:
        builtin = bwd_keys("sm_90a", "bfloat16", 128, False, backend="sm90", softcap=True)[1]
        plain = bwd_keys("sm_90a", "bfloat16", 128, False, backend="sm90")[1]
    ptx = compile_kernel(dataclasses.replace(plain, score_mod=mod), keep_ptx=True).__ptx__
    builtin_ptx = compile_kernel(builtin, keep_ptx=True).__ptx__

    def multiplies(text):
        return len(re.findall(r"^\s+mul(?:\.rn)?(?:\.ftz)?\.f32\b", text, re.M))
    assert multiplies(builtin_ptx) <= multiplies(ptx) <= multiplies(builtin_ptx) + 2
    assert ptx.count("tanh.approx.f32") == builtin_ptx.count("tanh.approx.f32")


CAPTURE_GRAD_MODS = {  # name -> (score_mod, float32 reductions a thread adds per tile)
    "per_head": (SCORES["alibi"], 1),
    "per_query": (lambda s, b, h, q, kv: s + QUERY_BIAS[q], None),
    "per_key": (lambda s, b, h, q, kv: s * KEY_GATE[kv], None),
    "per_score": (lambda s, b, h, q, kv: s + RELATIVE[h, q - kv + 999], None),
    "scalar": (SCORES["scalar_capture"], 1),
    # two loads of one table (one gradient, a sum per warp each) beside a table that requires
    # grad but reaches the result only through a comparison (no sums at all)
    "two_loads": (lambda s, b, h, q, kv: s + SLOPES[h] * (kv - q) + SLOPES[(h + 1) % 4]
                  + __import__("torch").where(GATE_F32[h] > 0, 1.0, 0.0), 2),
}
QUERY_BIAS, KEY_GATE = __import__("torch").rand(1000), __import__("torch").rand(1000)
GATE_F32 = __import__("torch").randn(4)
RELATIVE = __import__("torch").rand(4, 2000)


@pytest.mark.parametrize("arch, name, backend",
                         [("sm_80", n, "sm80") for n in sorted(CAPTURE_GRAD_MODS)]
                         + [("sm_90a", "per_score", "sm80"), ("sm_120a", "per_head", "sm80"),
                            ("sm_90a", "per_head", "sm90"), ("sm_90a", "per_query", "sm90"),
                            ("sm_90a", "per_score", "sm90")])
def test_backward_with_capture_grads_compiles(arch, name, backend):
    """The mma.sync and wgmma backwards adding a score_mod's captured tensor's gradient
    (`BwdKey.capture_grads`, `kernels.common.mods.add_capture_grads`) compiles within
    tuning.CAPTURE_GRAD_SPILL_BUDGET and issues float32 reductions beyond dQ's: one per warp for a
    table read by head (or a 0-d one), one per row, column or score of the thread's tile
    otherwise."""
    import dataclasses

    from cute_fa.compile.build import compile_kernel
    from cute_fa.compile.ptxas import ptxas_resources
    from cute_fa.tuning import CAPTURE_GRAD_SPILL_BUDGET as BUDGET
    from cute_fa.tuning_bwd import bwd_keys

    fn, per_warp = CAPTURE_GRAD_MODS[name]
    plain = dataclasses.replace(bwd_keys(arch, "bfloat16", 128, True, backend=backend)[1],
                                score_mod=trace_score_mod(fn)[0])
    floats = [c.slot for c in plain.score_mod.captures if c.dtype.startswith("float")]
    key = dataclasses.replace(plain, capture_grads=tuple(floats))
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    res = ptxas_resources(ptx, arch)
    assert res["spill_stores"] <= BUDGET and res["spill_loads"] <= BUDGET, res["log"]

    def reductions(text):
        return len(re.findall(r"\bred\.[a-z.:]*add\.f32", text))
    added = reductions(ptx) - reductions(compile_kernel(plain, keep_ptx=True).__ptx__)
    assert added == per_warp if per_warp else added > 1, added
    with pytest.raises(ValueError, match="capture_grads must be ascending slots"):
        dataclasses.replace(plain, capture_grads=(len(plain.score_mod.captures),))


@pytest.mark.parametrize("arch, backend", [("sm_80", "sm80"), ("sm_90a", "sm80"),
                                           ("sm_90a", "sm90")])
@pytest.mark.parametrize("sparse", [False, True])
def test_backward_with_a_block_mask_compiles(arch, backend, sparse):
    """The mma.sync and wgmma backwards of a block-sparse call: the mask as a mask_mod over the
    blocks' kinds (`block_mask.exact_mask_mod`, one int32 load per score beside the document
    mask's own), visiting every query block or (sparse, `block_sparse`) the listed ones,
    within tuning.MOD_SPILL_BUDGET; sparse with a captured tensor's gradient too, whose
    buffer follows the lists (one more reduction per warp)."""
    import dataclasses

    from cute_fa.compile.build import compile_kernel
    from cute_fa.compile.ptxas import ptxas_resources
    from cute_fa.mods.block_mask import exact_mask_mod
    from cute_fa.tuning import MOD_SPILL_BUDGET
    from cute_fa.tuning_bwd import bwd_keys

    mask = exact_mask_mod(trace_mask_mod(MASKS["document"])[0], (128, 128))
    key = dataclasses.replace(bwd_keys(arch, "bfloat16", 128, False, backend=backend)[1],
                              mask_mod=mask, block_sparse=sparse)
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    res = ptxas_resources(ptx, arch)
    assert res["spill_stores"] <= MOD_SPILL_BUDGET and res["spill_loads"] <= MOD_SPILL_BUDGET, \
        res["log"]
    if sparse:
        graded = dataclasses.replace(key, score_mod=trace_score_mod(SCORES["alibi"])[0],
                                     capture_grads=(0,))
        graded_ptx = compile_kernel(graded, keep_ptx=True).__ptx__

        def reductions(text):
            return len(re.findall(r"\bred\.[a-z.:]*add\.f32", text))
        assert reductions(graded_ptx) == reductions(ptx) + 1
