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


@pytest.mark.parametrize("name", ["alibi", "relative_bias", "gate", "scalar_capture"])
def test_capture_derivatives_match_autograd(name, monkeypatch):
    """dL/dtensor of each float tensor a score mod captures, for L = sum(w * score_mod) with
    random weights w: each (load, derivative) pair of `capture_derivatives` evaluated densely,
    times w, summed by hand into the element its load's indices name, against torch's
    autograd of the same function on float64 copies of the tensors (the module globals it
    reads, swapped)."""
    import test_mods_trace

    from cute_fa.mods.graph import ModGraph
    from cute_fa.mods.grad import capture_derivatives

    fn = SCORES[name]
    graph, captured = trace_score_mod(fn)
    slots = tuple(i for i, t in enumerate(captured) if t.is_floating_point())
    gen = torch.Generator().manual_seed(11)
    score = torch.randn(B, H, Q, K, dtype=torch.float64, generator=gen) * 4
    weights = torch.randn(B, H, Q, K, dtype=torch.float64, generator=gen)
    index = dict(b=torch.arange(B)[:, None, None, None], h=torch.arange(H)[None, :, None, None],
                 q_idx=torch.arange(Q)[None, None, :, None],
                 kv_idx=torch.arange(K)[None, None, None, :])
    leaves = []
    for slot in slots:
        global_name, = [n for n, t in vars(test_mods_trace).items() if t is captured[slot]]
        leaves.append(captured[slot].double().requires_grad_())
        monkeypatch.setattr(test_mods_trace, global_name, leaves[-1])
    value = fn(score, index["b"], index["h"], index["q_idx"], index["kv_idx"])
    want = torch.autograd.grad((value * weights).sum(), leaves)
    pairs = capture_derivatives(graph, slots)
    assert {load.value.slot for load, _ in pairs} == set(slots)
    for slot, expected in zip(slots, want):
        got = torch.zeros(captured[slot].shape, dtype=torch.float64).reshape(-1)
        for load, derivative in pairs:
            if load.value.slot != slot:
                continue
            d = evaluate(derivative, captured, score=score, **index).expand(B, H, Q, K)
            flat = torch.zeros((), dtype=torch.int64)
            for dim, arg in enumerate(load.args):  # row-major offset of the load's element
                at = evaluate(ModGraph("mask_mod", arg, graph.captures), captured, **index)
                flat = flat * captured[slot].shape[dim] + at.to(torch.int64)
            got.index_add_(0, flat.expand(B, H, Q, K).reshape(-1), (d * weights).reshape(-1))
        # the derivative graphs read the tensors in their own dtype (gate's float16 sigmoid)
        assert torch.allclose(got.reshape(captured[slot].shape), expected,
                              rtol=2e-3 if name == "gate" else 1e-9, atol=1e-9), (name, slot)


def test_capture_indexed_through_the_score_is_refused():
    from cute_fa.mods.grad import capture_derivatives

    table = torch.rand(2)
    graph, _ = trace_score_mod(lambda s, b, h, q, kv: s + table[torch.where(s > 0, 1, 0)])
    with pytest.raises(ValueError, match="indexed through the score"):
        capture_derivatives(graph, (0,))
    assert capture_derivatives(graph, ()) == ()


def test_chain_rule_constants_are_folded():
    """softcap * tanh(score / softcap)'s derivative is the built-in softcap's 1 - t^2 itself:
    the chain rule's constants (softcap, 1 / softcap) folded into one and dropped, not two
    multiplies a score; a mod scaling the score keeps its one factor."""
    from cute_fa.mods.graph import Node

    graph, _ = trace_score_mod(lambda s, b, h, q, kv: torch.tanh(s / 20.0) * 20.0)
    tanh = Node("tanh", "float", (Node("div", "float", (Node("score", "float"),
                                                         Node("const", "float", value=20.0))),))
    one = Node("const", "float", value=1.0)
    assert score_derivative(graph).root == Node("sub", "float", (one, Node("mul", "float",
                                                                           (tanh, tanh))))
    graph, _ = trace_score_mod(lambda s, b, h, q, kv: 30.0 * torch.tanh(s * 0.5 / 30.0))
    root = score_derivative(graph).root
    assert root.op == "mul" and root.args[0] == Node("const", "float", value=0.5)


@pytest.mark.parametrize("name", sorted(SCORES))
def test_scaled_score_is_the_same_mod(name):
    """`graph.scaled_score`: a mod and its derivative whose every use of the score is score *
    c (or / c), rewritten to read the score in its place, give at score s * c what the
    originals give at s; any other mod is left as it is (factor 1)."""
    from cute_fa.mods.graph import scaled_score

    graph, captured = trace_score_mod(SCORES[name])
    derivative = score_derivative(graph)
    factor, (mod2, derivative2) = scaled_score((graph, derivative))
    gen = torch.Generator().manual_seed(9)
    score = torch.randn(B, H, Q, K, dtype=torch.float64, generator=gen) * 4
    index = dict(b=torch.arange(B)[:, None, None, None], h=torch.arange(H)[None, :, None, None],
                 q_idx=torch.arange(Q)[None, None, :, None],
                 kv_idx=torch.arange(K)[None, None, None, :])
    if factor == 1.0:
        assert (mod2, derivative2) == (graph, derivative)
    for before, after in ((graph, mod2), (derivative, derivative2)):
        want = evaluate(before, captured, score=score, **index)
        got = evaluate(after, captured, score=score * factor, **index)
        assert torch.allclose(torch.as_tensor(got, dtype=torch.float64),
                              torch.as_tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_softcap_mod_reads_a_scaled_score():
    from cute_fa.mods.graph import scaled_score

    graph, _ = trace_score_mod(lambda s, b, h, q, kv: torch.tanh(s / 20.0) * 20.0)
    factor, (mod, derivative) = scaled_score((graph, score_derivative(graph)))
    assert factor == 1.0 / 20.0
    assert all(n.op != "div" for n in mod.nodes() + derivative.nodes())


@pytest.mark.parametrize("name", sorted(SCORES))
def test_kernel_logits_are_the_mods(name):
    """What a kernel computes of a score_mod: the result without its positive constant
    factor (`graph.root_factor`, which the softmax scale takes: `kernels.common.mods.
    logit_factor`), from the score scaled by the constant it is only ever multiplied by
    (`scaled_score`): their product is the mod's value, at every score."""
    from cute_fa.mods.graph import root_factor, scaled_score

    graph, captured = trace_score_mod(SCORES[name])
    c, logit = root_factor(graph)
    factor, (logit,) = scaled_score((logit,))
    assert c > 0
    gen = torch.Generator().manual_seed(11)
    score = torch.randn(B, H, Q, K, dtype=torch.float64, generator=gen) * 4
    index = dict(b=torch.arange(B)[:, None, None, None], h=torch.arange(H)[None, :, None, None],
                 q_idx=torch.arange(Q)[None, None, :, None],
                 kv_idx=torch.arange(K)[None, None, None, :])
    want = torch.as_tensor(evaluate(graph, captured, score=score, **index), dtype=torch.float64)
    got = c * torch.as_tensor(evaluate(logit, captured, score=score * factor, **index),
                              dtype=torch.float64)
    assert torch.allclose(got.expand_as(want), want, rtol=1e-12, atol=1e-12)
    if name == "softcap":
        assert c == 30.0 and factor == 1.0 / 30.0 and logit.root.op == "tanh"
