"""score_mod, mask_mod and sinks inside a graph torch.compile traces (`api.graph_mods`), on the
CPU: fullgraph=True traces forward, sdpa and forward_varlen with mods to `cute_fa::fwd_mods`
and their backward to `cute_fa::bwd_mods`, the captured tensors (a global, a closure's, a
module's parameter read through a closure) the graph's inputs; the ops' bodies (given a
CPU kernel here, the compiler and the launch stood in) launch exactly what the eager call
launches; a tensor out of the graph's reach runs eagerly behind a graph break; an operation
outside the vocabulary raises at compile time. Functions dynamo cannot hold as constants (a
bound method, one defined inside the compiled region) cost a graph break."""

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402
from launch_recording import cpu_ops, launches  # noqa: E402,F401  (fixtures)
from launch_recording import named_arguments  # noqa: E402

from cute_fa.api import graph_mods  # noqa: E402

SLOPES = torch.rand(2)


class _Heads(torch.nn.Module):
    """A module whose score_mod is a bound method reading its own parameter."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.rand(2))

    def score(self, s, b, h, q, kv):
        return s + self.bias[h]


def _mods(seqlen=96):
    docs = torch.randint(0, 3, (1, seqlen), dtype=torch.int32)
    scale = torch.rand(2, requires_grad=True)

    def score(s, b, h, q, kv):
        return s * scale[h] + SLOPES[h] * (kv - q)

    def mask(b, h, q, kv):
        return docs[b, q] == docs[b, kv]

    return score, mask, scale, docs


def _qkv(seqlen=96):
    return tuple(torch.randn(1, seqlen, 2, 64, dtype=torch.float16).requires_grad_()
                 for _ in range(3))


class _Traced(Exception):
    pass


def _record(graphs):
    from torch._dynamo.backends.common import aot_autograd

    def record(gm, example_inputs):
        graphs.append(gm)

        def run(*args):
            raise _Traced
        return run
    return aot_autograd(fw_compiler=record, bw_compiler=record)


def _calls(gm, name):
    return [n for n in gm.graph.nodes if str(n.target) == f"cute_fa.{name}.default"]


def test_mods_trace_into_the_graph():
    """forward (score_mod, mask_mod, sinks), sdpa (score_mod) and forward_varlen (mask_mod)
    trace with fullgraph=True to three `fwd_mods` calls reading the captured tensors and the
    sinks as placeholders, and their backward to three `bwd_mods` calls; the score_mod's
    table that requires grad is the one gradient slot, the sinks get theirs."""
    score, mask, scale, docs = _mods()
    sinks = torch.zeros(2, requires_grad=True)

    def attention(q, k, v, cu):
        o = cute_fa.forward(q, k, v, score_mod=score, mask_mod=mask, sinks=sinks)
        o = o + cute_fa.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                             score_mod=score).transpose(1, 2)
        ragged = cute_fa.forward_varlen(q[0], k[0], v[0], cu, cu, q.shape[1], q.shape[1],
                                        mask_mod=mask)
        return o + ragged[None]

    graphs = []
    torch._dynamo.reset()
    compiled = torch.compile(attention, backend=_record(graphs), fullgraph=True, dynamic=True)
    with pytest.raises(_Traced):
        compiled(*_qkv(), torch.tensor([0, 96], dtype=torch.int32))
    forward, backward = graphs
    calls = _calls(forward, "fwd_mods")
    assert len(calls) == 3 and not _calls(forward, "fwd")
    placeholders = {n for n in forward.graph.nodes if n.op == "placeholder"}
    for call, count in zip(calls, (3, 2, 1)):
        captured = call.args[3]
        assert len(captured) == count and all(c in placeholders for c in captured)
    assert calls[0].args[4] in placeholders and calls[1].args[4] is None  # the sinks
    assert calls[2].args[5] is not None  # cu_seqlens_q: the ragged call
    slots = sorted(n.args[-1] for n in _calls(backward, "bwd_mods"))
    assert slots == [[], [0], [0]]  # scale (slot 0) requires grad, SLOPES and docs do not


def test_the_graph_runs_what_the_eager_call_runs(launches, cpu_ops):
    """The compiled call (aot_eager, fullgraph) and its backward launch the kernels of the
    eager call, with captured tensors of the same values; the score_mod's table and the
    sinks get gradients."""
    recorded, _ = launches
    score, mask, scale, _ = _mods()
    sinks = torch.zeros(2, requires_grad=True)

    def step(q, k, v):
        return cute_fa.forward(q, k, v, score_mod=score, mask_mod=mask, sinks=sinks).sum()

    step(*_qkv()).backward()
    eager = list(recorded)
    recorded.clear()
    scale.grad = sinks.grad = None
    torch._dynamo.reset()
    torch.compile(step, backend="aot_eager", fullgraph=True)(*_qkv()).backward()
    assert [key for key, _ in recorded] == [key for key, _ in eager]
    for (key, args), (_, eager_args) in zip(recorded, eager):
        got = named_arguments(key, args).get("score_tensors") or ()
        want = named_arguments(key, eager_args).get("score_tensors") or ()
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert any(key.backend.startswith("bwd_sm") and key.capture_grads == (0,)
               for key, _ in recorded)
    assert scale.grad is not None and scale.grad.shape == scale.shape
    assert sinks.grad is not None


def test_a_modules_parameter_through_a_closure():
    """A score_mod made outside the compiled region that reads a module's parameter through
    its closure (`self.bias`): the parameter is a graph input and gets the one gradient
    slot."""
    heads = _Heads()

    def made(module):
        def score(s, b, h, q, kv):
            return s + module.bias[h]
        return score

    score = made(heads)
    graphs = []
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: cute_fa.forward(q, k, v, score_mod=score),
                             backend=_record(graphs), fullgraph=True, dynamic=True)
    with pytest.raises(_Traced):
        compiled(*_qkv())
    (call,) = _calls(graphs[0], "fwd_mods")
    assert call.args[3][0].op == "placeholder"
    assert [n.args[-1] for n in _calls(graphs[1], "bwd_mods")] == [[0]]


@pytest.mark.parametrize("where", ["bound method", "defined inside"])
def test_functions_dynamo_cannot_hold_break_the_graph(launches, cpu_ops, where):
    """A bound method, or a function defined inside the compiled region, is not a constant
    dynamo can hand `graph_mods.spec`: fullgraph=True refuses the call; without it dynamo
    runs `spec` at a graph break and the op still launches the eager call's kernel, reading
    the module's parameter."""
    heads = _Heads()
    recorded, _ = launches

    def attention(q, k, v):
        if where == "bound method":
            return cute_fa.forward(q, k, v, score_mod=heads.score)
        bias = heads.bias

        def score(s, b, h, q_idx, kv):
            return s + bias[h]
        return cute_fa.forward(q, k, v, score_mod=score)

    torch._dynamo.reset()
    with pytest.raises(Exception, match="constant|Observed exception"):
        torch.compile(attention, backend="eager", fullgraph=True)(*_qkv())
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(attention, backend="eager")(*_qkv())
        attention(*_qkv())
    (key, args), (eager_key, _) = recorded
    assert key == eager_key and key.score_mod is not None
    assert torch.equal(named_arguments(key, args)["score_tensors"][0], heads.bias)


def test_a_tensor_out_of_reach_runs_eagerly(launches):
    """A score_mod reading a tensor held in a list: no path the graph can read it by, so
    the call runs eagerly behind a graph break (fullgraph=True refuses that)."""
    held = [torch.rand(2)]

    def score(s, b, h, q, kv):
        return s + held[0][h]

    assert graph_mods.spec(score, None) is None
    recorded, _ = launches

    def attention(q, k, v):
        return cute_fa.forward(q, k, v, score_mod=score)

    torch._dynamo.reset()
    with pytest.raises(Exception, match="(?i)graph break|skip|disable"):
        torch.compile(attention, backend="eager", fullgraph=True)(*_qkv())
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(attention, backend="eager")(*_qkv())
    (key, args), = recorded
    assert key.score_mod is not None and named_arguments(key, args)["score_tensors"][0] \
        is held[0]


def test_outside_the_vocabulary_raises_while_compiling():
    """The tracer's TypeError, naming the operation, surfaces from torch.compile before any
    launch."""
    def score(s, b, h, q, kv):
        return torch.sin(s)

    torch._dynamo.reset()
    with pytest.raises(Exception, match="sin"):
        torch.compile(lambda q, k, v: cute_fa.forward(q, k, v, score_mod=score),
                      backend="eager", fullgraph=True)(*_qkv())
