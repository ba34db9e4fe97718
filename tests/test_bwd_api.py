"""The training API on the CPU: the custom ops' schemas and fake implementations (what
torch.compile traces), autograd through them traced with fake tensors, and the backward's
argument checks, which run before anything needs a GPU."""

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402
from cute_fa import backward, backward_varlen  # noqa: E402
from cute_fa.api import ops  # noqa: E402,F401  (registers the ops)
from launch_recording import launches  # noqa: E402,F401  (a fixture)


def test_schemas():
    fwd = str(torch.ops.cute_fa.fwd.default._schema)
    assert fwd.startswith("cute_fa::fwd(Tensor q, Tensor k, Tensor v, bool causal, "
                          "float? softmax_scale, SymInt window_left, SymInt window_right, "
                          "float softcap, bool bottom_right, str backend, bool deterministic)")
    assert fwd.endswith("-> (Tensor, Tensor)")
    bwd = str(torch.ops.cute_fa.bwd.default._schema)
    assert bwd.startswith("cute_fa::bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
                          "Tensor lse, ")
    assert bwd.endswith("-> (Tensor, Tensor, Tensor)")
    for name in ("fwd_varlen", "bwd_varlen"):
        assert hasattr(torch.ops.cute_fa, name)
    # nothing is mutated in place: the ops are functional, as torch.compile wants them
    for op in (torch.ops.cute_fa.fwd, torch.ops.cute_fa.bwd, torch.ops.cute_fa.fwd_varlen,
               torch.ops.cute_fa.bwd_varlen):
        assert not any(a.alias_info for a in op.default._schema.arguments)


def test_fake_implementations():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 100, 4, 64, device="cuda", dtype=torch.bfloat16)
        k = torch.empty(2, 120, 2, 64, device="cuda", dtype=torch.bfloat16)
        o, lse = torch.ops.cute_fa.fwd(q, k, k, True, None, -1, -1, 0.0, True, "auto", False)
        assert o.shape == q.shape and o.dtype == q.dtype and o.device == q.device
        assert lse.shape == (2, 4, 100) and lse.dtype == torch.float32
        dq, dk, dv = torch.ops.cute_fa.bwd(o, q, k, k, o, lse, True, None, -1, -1, 0.0, True,
                                           False)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)
        qv = torch.empty(300, 4, 64, device="cuda", dtype=torch.float16)
        kv = torch.empty(250, 2, 64, device="cuda", dtype=torch.float16)
        cu = torch.empty(4, device="cuda", dtype=torch.int32)
        o, lse = torch.ops.cute_fa.fwd_varlen(qv, kv, kv, cu, cu, 100, 100, False, 0.1, -1, -1,
                                              0.0, "auto", False)
        assert o.shape == qv.shape and lse.shape == (4, 300)


@pytest.mark.parametrize("varlen", [False, True])
def test_autograd_traces_to_fwd_and_bwd_ops(varlen):
    """make_fx over fake tensors records what autograd runs: the forward op, then the
    backward op with the saved out and lse (no other kernel, no zeros for lse's gradient)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(q, k, v, do):
        if varlen:
            cu = torch.tensor([0, 30, 64], dtype=torch.int32)
            o = cute_fa.forward_varlen(q, k, v, cu, cu, 34, 34, causal=True)
        else:
            o = cute_fa.forward(q, k, v, causal=True, window_size=(16, 0), softcap=3.0)
        return torch.autograd.grad(o, (q, k, v), do)

    shape = (64, 2, 64) if varlen else (1, 64, 2, 64)
    with FakeTensorMode():
        args = [torch.empty(*shape, dtype=torch.float16, requires_grad=i < 3) for i in range(4)]
        gm = make_fx(step, tracing_mode="fake")(*args)
    ops_called = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"
                  and "cute_fa" in str(n.target)]
    suffix = "_varlen" if varlen else ""
    assert ops_called == [f"cute_fa.fwd{suffix}.default", f"cute_fa.bwd{suffix}.default"]
    assert "aten.zeros" not in gm.code
    if not varlen:  # the window and softcap reach the backward
        bwd = next(n for n in gm.graph.nodes if str(n.target) == "cute_fa.bwd.default")
        assert bwd.args[8:11] == (16, 0, 3.0)


def _cpu(*shape, dtype=torch.float16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("change,err,match", [
    (dict(dout=_cpu(1, 32, 2, 64)), ValueError, r"dout must have the shape of q"),
    (dict(dout=_cpu(1, 64, 2, 64, dtype=torch.bfloat16)), TypeError,
     r"dout must have dtype torch.float16 like q"),
    (dict(dout="grad"), TypeError, r"dout must be a torch.Tensor"),
    (dict(out=_cpu(1, 64, 2, 32)), ValueError, r"out must have the shape of q"),
    (dict(lse=_cpu(1, 2, 64)), TypeError, r"lse must be float32"),
    (dict(lse=_cpu(1, 64, 2, dtype=torch.float32)), ValueError,
     r"lse must have shape \(batch, heads_q, seqlen_q\) = \(1, 2, 64\)"),
    (dict(q=_cpu(1, 64, 2, 64, dtype=torch.float32)), TypeError, r"q must be float16"),
])
def test_backward_argument_errors(change, err, match):
    """Checked in the order a user fixes them; a shape or dtype error is named before any
    question of where the tensors live (these are CPU tensors)."""
    args = dict(dout=_cpu(1, 64, 2, 64), q=_cpu(1, 64, 2, 64), k=_cpu(1, 80, 1, 64),
                v=_cpu(1, 80, 1, 64), out=_cpu(1, 64, 2, 64),
                lse=_cpu(1, 2, 64, dtype=torch.float32))
    args.update(change)
    with pytest.raises(err, match=match):
        backward(**args)


def test_backward_needs_cuda_tensors():
    args = [_cpu(1, 64, 2, 64), _cpu(1, 64, 2, 64), _cpu(1, 80, 1, 64), _cpu(1, 80, 1, 64),
            _cpu(1, 64, 2, 64), _cpu(1, 2, 64, dtype=torch.float32)]
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        backward(*args)


def test_backward_varlen_argument_errors():
    q, k = _cpu(100, 2, 64), _cpu(90, 1, 64)
    cu = torch.tensor([0, 50, 100], dtype=torch.int32)
    lse = _cpu(2, 100, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"dout must have the shape of q, \(total_q, heads"):
        backward_varlen(_cpu(99, 2, 64), q, k, k, q, lse, cu, cu, 50, 50)
    with pytest.raises(ValueError, match=r"lse must have shape \(heads_q, total_q\)"):
        backward_varlen(q, q, k, k, q, lse[:, :10], cu, cu, 50, 50)
    with pytest.raises(ValueError, match="needs cu_seqlens_k"):
        backward_varlen(q, q, k, k, q, lse, cu, None, 50, 50)


def test_forward_refuses_what_has_no_backward(launches):
    """With inputs that require grad, the arguments autograd cannot honour raise (no silent
    detach): out= and the KV-cache arguments; checked after every argument rule (a GPU is
    stood in: the call gets past the device check) and before any launch."""
    recorded, _ = launches
    q = _cpu(1, 64, 2, 64).requires_grad_()
    k = v = _cpu(1, 64, 2, 64)
    out = torch.full_like(q, 3.0, requires_grad=False)
    with pytest.raises(ValueError, match="out= has no backward"):
        cute_fa.forward(q, k, v, out=out)
    with pytest.raises(ValueError, match="have no backward"):
        cute_fa.forward(q, k, v, num_splits=2)
    with pytest.raises(ValueError, match="have no backward"):
        cute_fa.forward(q, k, v, seqused_k=torch.full((1,), 64, dtype=torch.int32))
    qv, kv = _cpu(64, 2, 64).requires_grad_(), _cpu(4, 64, 2, 64)
    cu = torch.tensor([0, 64], dtype=torch.int32)
    with pytest.raises(ValueError, match="no backward"):
        cute_fa.forward_varlen(qv, kv, kv, cu, None, 64, 64,
                               page_table=torch.zeros(1, 2, dtype=torch.int32))
    assert recorded == [] and (out == 3.0).all()
    with torch.no_grad():  # without grad the call goes the inference way
        cute_fa.forward(q, k, v, out=out)
    assert len(recorded) == 1


@pytest.mark.parametrize("bad, error, match", [
    (lambda t: t.float(), TypeError, "q must be float16 or bfloat16"),
    (lambda t: t[0], ValueError, "q must be 4-D"),
    (lambda t: torch.randn(1, 64, 2, 300, dtype=torch.float16), ValueError, "head_dim"),
    (lambda t: t, ValueError, "q must be on a CUDA device"),
])
@pytest.mark.parametrize("grad", [False, True])
def test_bad_input_raises_the_same_error_with_and_without_grad(bad, error, match, grad):
    """The argument rules run before autograd is involved: with inputs that require grad a
    bad input gets the same named error (not torch's dispatcher dump)."""
    q = bad(_cpu(1, 64, 2, 64)).detach().requires_grad_(grad)
    k = v = _cpu(1, 64, 2, q.shape[-1] if q.dim() == 4 else 64).requires_grad_(grad)
    with pytest.raises(error, match=match):
        cute_fa.forward(q, k, v, causal=True)
    with pytest.raises(error, match=match):
        cute_fa.sdpa(q.transpose(1, 2) if q.dim() == 4 else q, k.transpose(1, 2),
                     v.transpose(1, 2))


@pytest.mark.parametrize("grad", [False, True])
def test_bad_varlen_input_raises_the_same_error_with_and_without_grad(grad):
    q = _cpu(64, 2, 64).requires_grad_(grad)
    k = _cpu(64, 2, 64).requires_grad_(grad)
    cu = torch.tensor([0, 64], dtype=torch.int32)
    with pytest.raises(TypeError, match="cu_seqlens_q must be an int32 tensor"):
        cute_fa.forward_varlen(q, k, k, cu.long(), cu, 64, 64)
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        cute_fa.forward_varlen(q, k, k, cu, cu, 64, 64)
    with pytest.raises(ValueError, match="max_seqlen_k .80. must be at most the number of key"):
        cute_fa.forward_varlen(q, k, k, cu, cu, 64, 80)


def test_torch_compile_traces_without_graph_breaks():
    """torch.compile(fullgraph=True) traces forward, sdpa and forward_varlen (a graph break
    would raise while tracing) and their backward, at two sequence lengths with one dynamic
    graph, each call one cute_fa op. The graphs are recorded, not run: this machine has no GPU
    for the op."""
    from torch._dynamo.backends.common import aot_autograd

    class Traced(Exception):
        pass

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)

        def run(*args):
            raise Traced
        return run

    def attention(q, k, v, cu):
        o = cute_fa.forward(q, k, v, causal=True, window_size=(8, 0))
        o = o + cute_fa.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                             is_causal=True).transpose(1, 2)
        ov = cute_fa.forward_varlen(q[0], k[0], v[0], cu, cu, q.shape[1], q.shape[1])
        return o + ov[None]

    torch._dynamo.reset()
    compiled = torch.compile(attention, backend=aot_autograd(fw_compiler=record),
                             fullgraph=True, dynamic=True)
    for seqlen in (80, 112):  # not head_dim: equal sizes would be specialised together
        q, k, v = (_cpu(1, seqlen, 2, 64).requires_grad_() for _ in range(3))
        cu = torch.tensor([0, seqlen], dtype=torch.int32)
        with pytest.raises(Traced):
            compiled(q, k, v, cu)
    assert len(graphs) == 2  # forward and backward, once: the second length reused them
    called = [[str(n.target) for n in g.graph.nodes if "cute_fa" in str(n.target)]
              for g in graphs]
    assert called[0] == ["cute_fa.fwd.default", "cute_fa.fwd.default",
                         "cute_fa.fwd_varlen.default"]
    assert sorted(called[1]) == ["cute_fa.bwd.default", "cute_fa.bwd.default",
                                 "cute_fa.bwd_varlen.default"]


def test_deterministic_must_be_a_bool():
    q = _cpu(1, 64, 2, 64)
    for call in (lambda: cute_fa.forward(q, q, q, deterministic="yes"),
                 lambda: cute_fa.sdpa(q, q, q, deterministic=1)):
        with pytest.raises(TypeError, match="deterministic must be a bool"):
            call()


@pytest.mark.parametrize("bad_out, error, match", [
    (lambda q: torch.empty(q.shape, dtype=torch.float32), TypeError,
     "out must be float16 or bfloat16"),
    (lambda q: torch.empty(q.shape, dtype=torch.bfloat16), TypeError, "out must have dtype"),
    (lambda q: torch.empty(q.shape[1:], dtype=q.dtype), ValueError, "out must be 4-D"),
    (lambda q: torch.empty(1, 1, 2, 64, dtype=q.dtype), ValueError,  # broadcastable to q
     "out must have the shape of q"),
    (lambda q: torch.empty(1, 64, 2, 68, dtype=q.dtype)[..., :64], ValueError,
     "out strides must be multiples of 8"),
])
def test_out_is_checked_by_the_same_rule_under_torch_compile(bad_out, error, match):
    """out= under torch.compile (traced on the CPU, no GPU needed to raise): the eager rules,
    not an unchecked copy. Eager, the same out raises the same error."""
    torch._dynamo.reset()
    q = _cpu(1, 64, 2, 64)
    out = bad_out(q)

    def attention(q, out):
        return cute_fa.forward(q, q, q, causal=True, out=out)

    with pytest.raises(error, match=match):
        attention(q, out)
    with pytest.raises(error, match=match):
        torch.compile(attention, backend="eager")(q, out)


def test_a_good_out_under_torch_compile_is_filled_by_the_op():
    """A valid out= traces to the op and a copy into out (the graph recorded, not run)."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    q = _cpu(1, 64, 2, 64)
    compiled = torch.compile(lambda q, out: cute_fa.forward(q, q, q, out=out),
                             backend=aot_autograd(fw_compiler=record), fullgraph=True)
    with pytest.raises(NotImplementedError):  # the graph runs: the op has no CPU kernel
        compiled(q, torch.empty_like(q))
    targets = [str(n.target) for n in graphs[0].graph.nodes]
    assert "cute_fa.fwd.default" in targets
    assert any(t.startswith("aten.copy") for t in targets), targets


@pytest.mark.parametrize("head_dim,backend,expected", [
    (128, "auto", "bwd_sm90"), (64, "sm90", "bwd_sm90"), (128, "sm80", "bwd_sm80"),
    (192, "auto", "bwd_sm90"), (256, "sm80", "bwd_sm80")])
def test_backend_picks_the_main_kernel(launches, head_dim, backend, expected):
    """On an sm90 GPU (stood in), auto takes the wgmma backward at every head_dim; the
    launches pass the registered arguments, and dq's float32 sums are sized by the main
    kernel's tile (the wgmma one pads head_dim to 64, past 128 to 128). This grid's 3 key blocks x 2 K/V heads
    x 2 entries are few CTAs: the wgmma backward splits its groups of 2 query heads, and a
    fourth launch converts dK and dV (tests/test_bwd_head_splits.py)."""
    from launch_recording import named_arguments

    recorded, _ = launches
    bf16 = torch.bfloat16
    q, out, dout = (torch.randn(2, 300, 4, head_dim, dtype=bf16) for _ in range(3))
    k = torch.randn(2, 300, 2, head_dim, dtype=bf16)
    lse = torch.randn(2, 4, 300)
    backward(dout, q, k, k, out, lse, True, backend=backend)
    keys = [key for key, _ in recorded]
    split = ["bwd_post_kv"] if expected == "bwd_sm90" else []
    assert [key.backend for key in keys] == ["bwd_pre", expected, "bwd_post"] + split
    main, args = recorded[1]
    named = named_arguments(main, args)
    tile = main.tile
    blocks = -(-300 // tile.block_m)
    assert named["dq_accum"].shape == (2, 4, blocks * tile.block_m * tile.head_dim_padded)
    assert keys[2].tile == tile


@pytest.mark.parametrize("arch,head_dim,match", [
    ("sm_80", 64, "runs on sm90 only"),
    ("sm_120a", 64, "runs on sm90 only")])
def test_sm90_backend_refused_before_any_launch(launches, monkeypatch, arch, head_dim, match):
    from cute_fa.runtime import device

    recorded, _ = launches
    monkeypatch.setitem(device.DEVICES, -1, device.stand_in(arch, 132))
    bf16 = torch.bfloat16
    q, out, dout = (torch.randn(1, 64, 2, head_dim, dtype=bf16) for _ in range(3))
    lse = torch.randn(1, 2, 64)
    dq = torch.full_like(q, 7.0)
    with pytest.raises(ValueError, match=match):
        backward(dout, q, q, q, out, lse, dq=dq, backend="sm90")
    assert recorded == [] and (dq == 7.0).all()


def test_backend_must_be_a_known_name():
    args = [_cpu(1, 64, 2, 64), _cpu(1, 64, 2, 64), _cpu(1, 80, 1, 64), _cpu(1, 80, 1, 64),
            _cpu(1, 64, 2, 64), _cpu(1, 2, 64, dtype=torch.float32)]
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'sm80', 'sm90'\) "
                                         r"for the backward, got 'wgmma'"):
        backward(*args, backend="wgmma")
    with pytest.raises(ValueError, match="backend must be one of"):
        backward_varlen(args[0][0], args[1][0], args[2][0], args[3][0], args[4][0],
                        args[5][0], torch.tensor([0, 64], dtype=torch.int32),
                        torch.tensor([0, 80], dtype=torch.int32), 64, 80, backend="wgmma")
