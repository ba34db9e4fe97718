"""Tracing score_mod / mask_mod (`cute_fa.mods`): the masks and biases of the attention-gym's
examples, traced and evaluated densely, against the same Python functions run by torch itself
on broadcast index tensors (what FlexAttention computes in eager mode); the graph's signature
(what a kernel for the mod depends on); and a TypeError naming each operation outside the
vocabulary, at the trace."""

import math

import pytest

torch = pytest.importorskip("torch")

from cute_fa.mods import evaluate, trace_mask_mod, trace_score_mod  # noqa: E402

B, H, Q, K = 2, 4, 37, 53


def _grid(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return dict(b=torch.arange(B)[:, None, None, None], h=torch.arange(H)[None, :, None, None],
                q_idx=torch.arange(Q)[None, None, :, None],
                kv_idx=torch.arange(K)[None, None, None, :],
                score=torch.randn(B, H, Q, K, dtype=torch.float64, generator=gen) * 4)


gen = torch.Generator().manual_seed(1)
DOCS = torch.sort(torch.randint(0, 4, (B, max(Q, K)), generator=gen), dim=1).values.to(torch.int32)
SLOPES = torch.rand(H, generator=gen)
REL_BIAS = torch.randn(H, Q + K - 1, generator=gen).to(torch.bfloat16)
GATE = torch.randn(H, generator=gen, dtype=torch.float16)
SCALE = torch.tensor(0.75)
PREFIX = torch.tensor([5, 20], dtype=torch.int64)

MASKS = {
    "causal": lambda b, h, q, kv: q >= kv,
    "sliding_window": lambda b, h, q, kv: (q >= kv) & (q - kv <= 8),
    "prefix_lm": lambda b, h, q, kv: (kv <= 10) | (q >= kv),
    "prefix_lm_per_entry": lambda b, h, q, kv: (kv < PREFIX[b]) | (q >= kv),
    "document": lambda b, h, q, kv: (DOCS[b, q] == DOCS[b, kv]) & (q >= kv),
    "block_diagonal": lambda b, h, q, kv: q // 16 == kv // 16,
    "strided": lambda b, h, q, kv: (kv % 3 == 0) | ~(q != kv),
    "dilated_where": lambda b, h, q, kv: torch.where(h < 2, q >= kv, (q - kv) % 2 == 0),
    # negative operands: // and % round toward minus infinity, as torch's
    "floor_negative": lambda b, h, q, kv: ((q - kv) // 5 == -1) | ((q - kv) % 5 == 3),
    "logical_fns": lambda b, h, q, kv: torch.logical_or(torch.logical_not(q < kv), kv == 0),
}
SCORES = {
    "identity": lambda s, b, h, q, kv: s,
    "alibi": lambda s, b, h, q, kv: s + SLOPES[h] * (kv - q),
    "softcap": lambda s, b, h, q, kv: torch.tanh(s / 30.0) * 30.0,
    "relative_bias": lambda s, b, h, q, kv: s + REL_BIAS[h, q - kv + K - 1],
    "gate": lambda s, b, h, q, kv: s * torch.sigmoid(GATE[h]) - abs(q - kv) * 0.1,
    "scalar_capture": lambda s, b, h, q, kv: SCALE * s + 1,
    "causal_as_score": lambda s, b, h, q, kv: torch.where(q >= kv, s, -math.inf),
    "clamped": lambda s, b, h, q, kv: torch.clamp(s, min=-2.0, max=8.0) + torch.clamp(q - kv,
                                                                                     min=0),
    "min_max": lambda s, b, h, q, kv: torch.maximum(torch.minimum(s, q * 0.5), -(kv // 7) - 1.5),
    "methods": lambda s, b, h, q, kv: (s / 8).tanh().exp() + s.sigmoid() - (q - kv).abs(),
    "reversed_ops": lambda s, b, h, q, kv: 2 - s / (1 + kv) + 100 // (q + 1) % 7 - (-s),
    "integer_result": lambda s, b, h, q, kv: q - kv,
}


@pytest.mark.parametrize("name", sorted(MASKS))
def test_masks_match_torch(name):
    fn = MASKS[name]
    graph, captured = trace_mask_mod(fn)
    g = _grid()
    expected = fn(g["b"], g["h"], g["q_idx"], g["kv_idx"]).expand(B, H, Q, K)
    got = evaluate(graph, captured, **{k: g[k] for k in ("b", "h", "q_idx", "kv_idx")})
    assert got.dtype == torch.bool and torch.equal(got.expand(B, H, Q, K), expected)
    assert not graph.uses("score")


@pytest.mark.parametrize("name", sorted(SCORES))
def test_score_mods_match_torch(name):
    fn = SCORES[name]
    graph, captured = trace_score_mod(fn)
    g = _grid(1)
    expected = fn(g["score"], g["b"], g["h"], g["q_idx"], g["kv_idx"])
    got = evaluate(graph, captured, **g)
    expected = torch.as_tensor(expected).to(torch.float64).expand(B, H, Q, K)
    # torch runs "gate"'s float16 sigmoid in float16 (relative error 2^-11, scores to ~16),
    # the graph in float64
    atol = 2e-2 if name == "gate" else 1e-6
    assert torch.allclose(got.expand(B, H, Q, K), expected, rtol=1e-6, atol=atol, equal_nan=True)


def test_captures_are_arguments_not_constants():
    """New values in a captured tensor of the same dtype and rank: the same signature (the
    kernel is reused); another dtype, rank, constant or operation: another one."""
    def alibi(slopes, c=1.0):
        return lambda s, b, h, q, kv: s + slopes[h] * (kv - q) * c

    base = trace_score_mod(alibi(torch.rand(4)))[0].signature()
    assert trace_score_mod(alibi(torch.rand(16)))[0].signature() == base
    others = [alibi(torch.rand(4, dtype=torch.float16)), alibi(torch.rand(4, 1)[:, 0:1]),
              alibi(torch.rand(4), c=2.0), lambda s, b, h, q, kv: s + SLOPES[h] * (q - kv)]
    signatures = {base}
    for fn in others:
        try:
            signatures.add(trace_score_mod(fn)[0].signature())
        except TypeError:  # the 2-d capture indexed by one index: refused, not confused
            signatures.add("refused")
    assert len(signatures) == 1 + len(others)


def test_captures_in_first_use_order():
    graph, captured = trace_mask_mod(lambda b, h, q, kv: (DOCS[b, q] == DOCS[b, kv])
                                     & (kv < PREFIX[b]))
    assert captured[0] is DOCS and captured[1] is PREFIX and len(captured) == 2
    assert [(c.slot, c.dtype, c.ndim) for c in graph.captures] == [(0, "int32", 2),
                                                                     (1, "int64", 1)]


def _if_positive(s, b, h, q, kv):
    if s > 0:
        return s
    return -s


REFUSED = {
    "python_if": (trace_score_mod, _if_positive, "Python control flow"),
    "python_and": (trace_mask_mod, lambda b, h, q, kv: q >= kv and kv >= 0, "control flow"),
    "python_min": (trace_score_mod, lambda s, b, h, q, kv: min(s, 3.0), "control flow"),
    "math_exp": (trace_score_mod, lambda s, b, h, q, kv: math.exp(s), "Python number"),
    "torch_sin": (trace_score_mod, lambda s, b, h, q, kv: torch.sin(s), "torch.sin"),
    "method_sin": (trace_score_mod, lambda s, b, h, q, kv: s.sin(), r"\.sin\(\)"),
    "pow": (trace_score_mod, lambda s, b, h, q, kv: s ** 2, r"\*\*"),
    "whole_tensor": (trace_score_mod, lambda s, b, h, q, kv: s + REL_BIAS, "used whole"),
    "tensor_left": (trace_score_mod, lambda s, b, h, q, kv: SLOPES + s, "used whole"),
    "too_few_indices": (trace_score_mod, lambda s, b, h, q, kv: s + REL_BIAS[h], "index every"),
    "slice": (trace_score_mod, lambda s, b, h, q, kv: s + REL_BIAS[h, :][0], "slice"),
    "float_index": (trace_score_mod, lambda s, b, h, q, kv: s + SLOPES[h / 2], "float value"),
    "float64_capture": (trace_score_mod,
                        lambda s, b, h, q, kv: s + SLOPES.double()[h], "torch.float64"),
    "float_modulo": (trace_score_mod, lambda s, b, h, q, kv: s % 2, "integers only"),
    "bool_arithmetic": (trace_score_mod, lambda s, b, h, q, kv: s + (q > kv), "bool value"),
    "mask_of_ints": (trace_mask_mod, lambda b, h, q, kv: (q & kv) == 0, "& of int"),
    "score_returns_bool": (trace_score_mod, lambda s, b, h, q, kv: s > 0, "returning a bool"),
    "mask_returns_number": (trace_mask_mod, lambda b, h, q, kv: q - kv, "returning a int"),
    "huge_constant": (trace_mask_mod, lambda b, h, q, kv: q < 2 ** 40, "outside int32"),
    "where_keyword": (trace_score_mod,
                      lambda s, b, h, q, kv: torch.where(q > kv, s, other=0.0), "torch.where"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_operations_name_themselves(name):
    tracer, fn, named = REFUSED[name]
    role = tracer.__name__.removeprefix("trace_")
    with pytest.raises(TypeError, match=rf"^{role}: .*{named}"):
        tracer(fn)


def _flex_case(name):
    """(score_mod, mask_mod) of a named case, for the reference against FlexAttention."""
    return {"alibi_causal": (SCORES["alibi"], MASKS["causal"]),
            "softcap_window": (SCORES["softcap"], MASKS["sliding_window"]),
            "relative_bias": (SCORES["relative_bias"], None),
            "document_prefix": (None, lambda b, h, q, kv: MASKS["document"](b, h, q, kv)
                                | (kv < PREFIX[b])),
            "empty_rows": (SCORES["alibi"], lambda b, h, q, kv: (q >= kv) & (q > 6))}[name]


@pytest.mark.parametrize("name", ["alibi_causal", "softcap_window", "relative_bias",
                                  "document_prefix", "empty_rows"])
def test_reference_matches_flex_attention(name):
    """`mods.reference.attention` (float64, cute_fa's layout) against torch's own
    FlexAttention on the CPU (float32, its eager path), GQA 4/2, on the same mods."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    from cute_fa.mods.reference import attention

    score_mod, mask_mod = _flex_case(name)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(B, Q, H, 16, generator=gen)
    k, v = (torch.randn(B, K, 2, 16, generator=gen) for _ in range(2))
    o, lse = attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod)
    block_mask = None if mask_mod is None else flex.create_block_mask(
        mask_mod, B, H, Q, K, device="cpu")
    fo, flse = flex.flex_attention(*(t.transpose(1, 2) for t in (q, k, v)), score_mod=score_mod,
                                   block_mask=block_mask, enable_gqa=True, return_lse=True)
    assert torch.allclose(o.float(), fo.transpose(1, 2), atol=2e-5, rtol=1e-4)
    finite = torch.isfinite(lse)
    assert torch.equal(finite, torch.isfinite(flse))
    assert torch.allclose(lse[finite].float(), flse[finite], atol=2e-5, rtol=1e-5)
    if name == "empty_rows":
        assert (~finite).any() and torch.all(o[:, :7] == 0)
