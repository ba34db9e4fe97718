"""The mod probe on a GPU: every mask and score mod of tests/test_mods_trace.py evaluated by its
device code (`kernels/common/mods.py`) at random (b, h, q_idx, kv_idx, score) elements, against
the float64 evaluation of the same graph (`cute_fa.mods.evaluate`): masks exactly, scores in
float32 to 1e-5 relative (plus 1e-5 absolute for values near zero)."""

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
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5, equal_nan=True)
