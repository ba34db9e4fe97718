"""The derivative of each score mod of tests/test_mods_trace.py with respect to its score
(`cute_fa.mods.grad.score_derivative`), evaluated densely, against torch's autograd of the
same Python function on float64 scores; and a derivative that is zero (a score-free mod)."""

import pytest

torch = pytest.importorskip("torch")

from cute_fa.mods import evaluate, trace_score_mod  # noqa: E402
from cute_fa.mods.grad import score_derivative  # noqa: E402
from test_mods_trace import B, H, K, Q, SCORES  # noqa: E402


@pytest.mark.parametrize("name", sorted(SCORES))
def test_derivative_matches_autograd(name):
    fn = SCORES[name]
    graph, captured = trace_score_mod(fn)
    gen = torch.Generator().manual_seed(7)
    score = (torch.randn(B, H, Q, K, dtype=torch.float64, generator=gen) * 4).requires_grad_()
    index = dict(b=torch.arange(B)[:, None, None, None], h=torch.arange(H)[None, :, None, None],
                 q_idx=torch.arange(Q)[None, None, :, None],
                 kv_idx=torch.arange(K)[None, None, None, :])
    value = torch.as_tensor(fn(score, **{"b": index["b"], "h": index["h"], "q": index["q_idx"],
                                         "kv": index["kv_idx"]}))
    if value.requires_grad:
        (want,) = torch.autograd.grad(value.to(torch.float64).sum(), score, allow_unused=True)
        want = torch.zeros_like(score) if want is None else want
    else:  # no path from the score (an integer result)
        want = torch.zeros_like(score)
    got = evaluate(score_derivative(graph), captured, score=score.detach(), **index)
    got = got.expand(B, H, Q, K)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    # "gate": torch's float16 sigmoid in float16 against the graph's float64
    assert torch.allclose(got[finite], want[finite], rtol=1e-6 if name != "gate" else 2e-3,
                          atol=1e-9)


def test_derivative_graph_keeps_the_captures():
    slopes = torch.rand(4)
    graph, _ = trace_score_mod(lambda s, b, h, q, kv: torch.tanh(s * slopes[h]) + slopes[h])
    d = score_derivative(graph)
    assert d.role == "score_mod" and d.captures == graph.captures
    assert d.signature() != graph.signature()


def test_mask_mods_have_no_score_derivative():
    from cute_fa.mods import trace_mask_mod

    with pytest.raises(ValueError, match="needs a score_mod"):
        score_derivative(trace_mask_mod(lambda b, h, q, kv: q >= kv)[0])
