"""The mod probe on a GPU: every mask and score mod of tests/test_mods_trace.py evaluated by its
device code (`kernels/common/mods.py`) at random (b, h, q_idx, kv_idx, score) elements, against
the float64 evaluation of the same graph (`cute_fa.mods.evaluate`): masks exactly, scores in
float32 to 1e-5 relative (plus 1e-5 absolute for values near zero); with the kernels'
`FASTMATH`, a graph with a tanh (tanh.approx.f32) to the approximation's error."""

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

from cute_fa.mods import evaluate, trace_mask_mod, trace_score_mod  # noqa: E402
from test_mods_trace import B, H, K, MASKS, Q, SCORES  # noqa: E402

N = 5000
CASES = [(trace_mask_mod, name, MASKS[name]) for name in sorted(MASKS)] + \
        [(trace_score_mod, name, SCORES[name]) for name in sorted(SCORES)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("tracer, name, fn", CASES, ids=[c[1] for c in CASES])
def test_mod_probe_matches_the_reference(tracer, name, fn):
    import cutlass.cute as cute
    from cuda.bindings import driver
    from cutlass.cute.runtime import from_dlpack

    from cute_fa.kernels.common import mods as device_mods
    from cute_fa.kernels.mod_probe import ModProbe

    graph, captured = tracer(fn)
    gen = torch.Generator().manual_seed(len(name))
    index = {k: torch.randint(0, n, (N,), generator=gen, dtype=torch.int32)
             for k, n in (("b", B), ("h", H), ("q_idx", Q), ("kv_idx", K))}
    score = torch.randn(N, generator=gen) * 6
    out = torch.full((N,), float("nan"), device="cuda")
    caps = tuple(from_dlpack((c.reshape(1) if c.ndim == 0 else c).cuda().contiguous())
                 for c in captured) or None
    args = (*(from_dlpack(t.cuda()) for t in (score, *index.values())), from_dlpack(out), caps,
            driver.CUstream(torch.cuda.current_stream().cuda_stream))
    cute.compile(ModProbe(graph), *args)(*args)
    torch.cuda.synchronize()
    expected = evaluate(graph, captured, score=score.double(),
                        **{k: v.long() for k, v in index.items()})
    got = out.cpu().double()
    if graph.role == "mask_mod":
        assert torch.equal(got, expected.double())
    else:
        rtol = atol = 1e-5
        if device_mods.FASTMATH and any(node.op == "tanh" for node in graph.nodes()):
            # tanh.approx.f32: relative error about 2^-11 (PTX ISA), |tanh| <= 1; these graphs
            # scale it at most by the softcap's constant (relative) or by the exp of it
            # (e * 2^-11 < 2e-3 absolute). ex2.approx's 2^-22 stays within 1e-5.
            rtol, atol = 1e-3, 2e-3
        assert torch.allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)
