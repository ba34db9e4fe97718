"""The sinks' gradient (`api.autograd._SinkAttention`), on the CPU: the forward and the kernels'
backward stood in by float64 attention computed here (what the kernels compute, up to
rounding), so that the sink gradient's formula, dL/dsink_h = -sum of exp(sink_h - LSE) * D over
h's rows, is checked against torch's autograd of attention with a sink column; dense and
ragged, and a call where only the sinks require grad."""

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402
from cute_fa.api import autograd  # noqa: E402
from launch_recording import launches  # noqa: E402,F401  (a fixture)


def sink_attention(q, k, v, sinks, scale):
    """float64 (o, lse) of q (B, S, Hq, D), k, v (B, S, Hk, D), a sink column per head."""
    group = q.shape[2] // k.shape[2]
    qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
    kd, vd = kd.repeat_interleave(group, 1), vd.repeat_interleave(group, 1)
    s = torch.einsum("bhqd,bhkd->bhqk", qd, kd) * scale
    s = torch.cat([s, sinks.double()[None, :, None, None].expand(*s.shape[:3], 1)], -1)
    p = torch.softmax(s, -1)[..., :-1]
    return torch.einsum("bhqk,bhkd->bhqd", p, vd).transpose(1, 2), torch.logsumexp(s, -1)


@pytest.fixture
def reference_kernels(launches, monkeypatch):
    """run_forward / run_backward as float64 attention (the backward's dq, dk, dv by autograd
    of the same function)."""
    def run_forward(call, plan, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None,
                    return_lse=True, score_tensors=None, block_mask=None):  # noqa: ARG001
        sinks = score_tensors[-1]
        if cu_seqlens_q is not None:
            o, lse = sink_attention(q[None], k[None], v[None], sinks, call.softmax_scale)
            return o[0].to(q.dtype), lse[0].float()
        o, lse = sink_attention(q, k, v, sinks, call.softmax_scale)
        return o.to(q.dtype), lse.float()

    def run_backward(call, plan, dout, q, k, v, o, lse, cu_seqlens_q=None, cu_seqlens_k=None,
                     score_tensors=None):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    monkeypatch.setattr(autograd, "run_forward", run_forward)
    monkeypatch.setattr(autograd, "run_backward", run_backward)


@pytest.mark.parametrize("q_grad", [True, False])
def test_dense_sink_gradient(reference_kernels, q_grad):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 50, 4, 16, generator=gen).to(torch.bfloat16).requires_grad_(q_grad)
    k, v = (torch.randn(2, 60, 2, 16, generator=gen).to(torch.bfloat16) for _ in range(2))
    sinks = torch.randn(4, generator=gen, requires_grad=True)
    dout = torch.randn(2, 50, 4, 16, generator=gen).to(torch.bfloat16)
    o = cute_fa.forward(q, k, v, sinks=sinks)
    assert o.requires_grad
    o.backward(dout)
    ref_sinks = sinks.detach().double().requires_grad_()
    o_ref, _ = sink_attention(q.detach(), k, v, ref_sinks, 16 ** -0.5)
    o_ref.backward(dout.double())
    assert torch.allclose(sinks.grad.double(), ref_sinks.grad, rtol=2e-2, atol=1e-3)


def test_ragged_sink_gradient(reference_kernels):
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(30, 4, 16, generator=gen).to(torch.bfloat16).requires_grad_()
    k, v = (torch.randn(30, 4, 16, generator=gen).to(torch.bfloat16) for _ in range(2))
    sinks = torch.randn(4, generator=gen, requires_grad=True)
    cu = torch.tensor([0, 30], dtype=torch.int32)  # one sequence: the dense reference's
    dout = torch.randn(30, 4, 16, generator=gen).to(torch.bfloat16)
    cute_fa.forward_varlen(q, k, v, cu, cu, 30, 30, sinks=sinks).backward(dout)
    ref_sinks = sinks.detach().double().requires_grad_()
    o_ref, _ = sink_attention(q.detach()[None], k[None], v[None], ref_sinks, 16 ** -0.5)
    o_ref.backward(dout.double()[None])
    assert torch.allclose(sinks.grad.double(), ref_sinks.grad, rtol=2e-2, atol=1e-3)
