"""Training through cute_fa on a GPU: gradients of `forward`, `forward_varlen` and `sdpa` by
autograd against a float64 reference (plain torch ops differentiated by torch.autograd,
tests/grad_reference.py), with flash-attn's criterion: cute_fa's error at most twice torch's own
error at the input dtype (the same reference ops run in bf16/fp16) plus 1e-3. Inputs are fresh
random tensors; gradients are checked everywhere, including rows no key is visible to.

Also: deterministic mode is bitwise repeatable, bad dout raises before any launch, the
custom ops pass torch.library.opcheck, torch.compile(fullgraph=True) of a transformer block
(forward and backward) equals eager at dynamic sequence lengths, and a short training run
follows SDPA's loss curve.
"""

import math

import pytest

from grad_reference import check_grads

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import cute_fa  # noqa: E402
from cute_fa import tiles_of  # noqa: E402

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim): odd lengths, Sq != Sk both ways,
# GQA 2 and 4, MQA, every head_dim class and a padded one
GRID = [
    (1, 128, 128, 2, 2, 64),
    (2, 177, 177, 4, 2, 64),
    (2, 200, 333, 4, 1, 128),
    (1, 333, 200, 8, 2, 128),
    (1, 257, 257, 2, 2, 96),
    (1, 190, 190, 4, 4, 192),
    (1, 300, 500, 4, 1, 256),
    (3, 1, 77, 2, 2, 128),
]


def _rand(*shape, dtype, gen, requires_grad=False):
    t = torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)
    return t.requires_grad_(requires_grad)


def _autograd(fn, q, k, v, dout):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    assert out.grad_fn is not None
    out.backward(dout)
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("shape", GRID, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gradients_grid(shape, causal, dtype):
    b, sq, sk, hq, hk, d = shape
    dtype = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(sq * 131 + sk + d + causal)
    q, k, v = (_rand(b, s, h, d, dtype=dtype, gen=gen)
               for s, h in ((sq, hq), (sk, hk), (sk, hk)))
    dout = _rand(b, sq, hq, d, dtype=dtype, gen=gen)
    got = _autograd(lambda q, k, v: cute_fa.forward(q, k, v, causal=causal), q, k, v, dout)
    check_grads(got, q, k, v, dout, causal=causal)


@pytest.mark.parametrize("tile_arch", ["sm_86", "sm_120a"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gradients_other_arch_tiles(tile_arch, head_dim):
    """The ~100 KB archs' backward tiles, run on this GPU."""
    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    q, k, v, dout = (_rand(2, 211, 4, head_dim, dtype=torch.bfloat16, gen=gen)
                     for _ in range(4))
    with tiles_of(tile_arch):
        got = _autograd(lambda q, k, v: cute_fa.forward(q, k, v, causal=True), q, k, v, dout)
    check_grads(got, q, k, v, dout, causal=True)


def test_strided_inputs():
    """q, k, v as views of one packed qkv tensor, dout transposed in memory: the kernels read
    the strides as they are."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    qkv = _rand(2, 150, 3, 4, 64, dtype=torch.bfloat16, gen=gen)
    q, k, v = qkv.unbind(2)
    dout = _rand(2, 4, 150, 64, dtype=torch.bfloat16, gen=gen).transpose(1, 2)
    qkv_leaf = qkv.detach().requires_grad_()
    out = cute_fa.forward(*qkv_leaf.unbind(2), causal=True)
    out.backward(dout)
    got = qkv_leaf.grad.unbind(2)
    check_grads(got, q, k, v, dout, causal=True)


@pytest.mark.parametrize("kw", [dict(window_size=(40, 0)), dict(window_size=(64, 16)),
                                dict(softcap=20.0), dict(window_size=(30, 30), softcap=5.0)],
                         ids=["window_causal", "window", "softcap", "window_softcap"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_window_softcap(kw, causal):
    gen = torch.Generator(device="cuda").manual_seed(11)
    q = _rand(2, 300, 4, 128, dtype=torch.bfloat16, gen=gen)
    k, v = (_rand(2, 260, 2, 128, dtype=torch.bfloat16, gen=gen) for _ in range(2))
    dout = _rand(2, 300, 4, 128, dtype=torch.bfloat16, gen=gen)
    got = _autograd(lambda q, k, v: cute_fa.forward(q, k, v, causal=causal, **kw), q, k, v, dout)
    check_grads(got, q, k, v, dout, causal=causal, **kw)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_gradients(causal):
    """sdpa: (batch, heads, seqlen, head_dim), top-left causal, GQA via fewer K/V heads."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = _rand(2, 4, 190, 64, dtype=torch.float16, gen=gen)
    k, v = (_rand(2, 2, 250, 64, dtype=torch.float16, gen=gen) for _ in range(2))
    dout = _rand(2, 4, 190, 64, dtype=torch.float16, gen=gen)
    got = _autograd(lambda q, k, v: cute_fa.sdpa(q, k, v, is_causal=causal), q, k, v, dout)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    check_grads([t(g) for g in got], t(q), t(k), t(v), t(dout), causal=causal,
                 causal_offset=0)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (70, 0)])
def test_varlen_gradients(deterministic, window):
    """A ragged batch with empty and one-row sequences, keys longer than queries, GQA; rows of q
    past the last sequence get zero gradients."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    lens_q, lens_k = [100, 1, 0, 333, 64], [150, 40, 17, 333, 64]
    cu_q = torch.tensor([0] + [sum(lens_q[:i + 1]) for i in range(5)], device="cuda",
                        dtype=torch.int32)
    cu_k = torch.tensor([0] + [sum(lens_k[:i + 1]) for i in range(5)], device="cuda",
                        dtype=torch.int32)
    q = _rand(sum(lens_q) + 5, 4, 128, dtype=torch.bfloat16, gen=gen)
    k, v = (_rand(sum(lens_k), 2, 128, dtype=torch.bfloat16, gen=gen) for _ in range(2))
    dout = _rand(*q.shape, dtype=torch.bfloat16, gen=gen)
    got = _autograd(lambda q, k, v: cute_fa.forward_varlen(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, window_size=window,
        deterministic=deterministic), q, k, v, dout)
    assert (got[0][sum(lens_q):] == 0).all()
    for b in range(5):
        sq, sk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if lens_q[b] == 0:
            assert (got[1][sk] == 0).all() and (got[2][sk] == 0).all()
            continue
        check_grads([got[0][sq][None], got[1][sk][None], got[2][sk][None]], q[sq][None],
                     k[sk][None], v[sk][None], dout[sq][None], causal=True, window_size=window)


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_is_bitwise_repeatable(causal):
    gen = torch.Generator(device="cuda").manual_seed(9)
    q, k, v, dout = (_rand(2, 1000, 8, 128, dtype=torch.bfloat16, gen=gen) for _ in range(4))
    runs = [_autograd(lambda q, k, v: cute_fa.forward(q, k, v, causal=causal,
                                                      deterministic=True), q, k, v, dout)
            for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
    torch.use_deterministic_algorithms(True)  # deterministic=None follows torch's switch
    try:
        again = _autograd(lambda q, k, v: cute_fa.forward(q, k, v, causal=causal), q, k, v,
                          dout)
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(runs[0], again))
    check_grads(runs[0], q, k, v, dout, causal=causal)


def test_bad_dout_raises_before_launch():
    from cute_fa import backward

    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (_rand(1, 64, 2, 64, dtype=torch.float16, gen=gen) for _ in range(3))
    out, lse = cute_fa.forward(q, k, v, return_lse=True)
    dq = torch.full_like(q, 7.0)
    good = _rand(1, 64, 2, 64, dtype=torch.float16, gen=gen)
    bad = [(good[:, :32], ValueError, "dout must have the shape of q"),
           (good.to(torch.bfloat16), TypeError, "dout must have dtype torch.float16"),
           (torch.randn(1, 64, 2, 128, device="cuda", dtype=torch.float16)[..., ::2],
            ValueError, "dout must have a contiguous last dimension"),
           (good.cpu(), ValueError, "dout must be on a CUDA device")]
    for dout, err, match in bad:
        with pytest.raises(err, match=match):
            backward(dout, q, k, v, out, lse, dq=dq)
    with pytest.raises(ValueError, match="lse must have shape"):
        backward(good, q, k, v, out, lse[:, :1], dq=dq)
    torch.cuda.synchronize()
    assert (dq == 7.0).all()
    with pytest.raises(ValueError, match="out= has no backward"):
        cute_fa.forward(q.requires_grad_(), k, v, out=torch.empty_like(q))
    with pytest.raises(ValueError, match="have no backward"):
        cute_fa.forward(q, k, v, seqused_k=torch.full((1,), 64, device="cuda",
                                                      dtype=torch.int32))


def test_opcheck():
    from cute_fa.api import ops  # noqa: F401  (registers the custom ops)

    gen = torch.Generator(device="cuda").manual_seed(2)
    q = _rand(1, 100, 4, 64, dtype=torch.bfloat16, gen=gen, requires_grad=True)
    k, v = (_rand(1, 120, 2, 64, dtype=torch.bfloat16, gen=gen, requires_grad=True)
            for _ in range(2))
    args = (q, k, v, True, None, -1, -1, 0.0, True, "auto", False)
    torch.library.opcheck(torch.ops.cute_fa.fwd.default, args)
    out, lse = torch.ops.cute_fa.fwd(*args)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.cute_fa.bwd.default,
                          (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, True,
                           None, -1, -1, 0.0, True, False))


class Block(torch.nn.Module):
    """A pre-norm transformer block whose attention is cute_fa.forward (GQA, causal)."""

    def __init__(self, dim=256, heads=4, kv_heads=2, attention=None):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.hd)
        self.proj = torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))
        self.attention = attention or (lambda q, k, v: cute_fa.forward(q, k, v, causal=True))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], dim=-1)
        o = self.attention(q.view(b, s, self.heads, self.hd),
                           k.view(b, s, self.kv_heads, self.hd),
                           v.view(b, s, self.kv_heads, self.hd))
        x = x + self.proj(o.reshape(b, s, -1))
        return x + self.mlp(self.norm2(x))


def test_torch_compile_fullgraph_matches_eager():
    """fullgraph=True: a graph break raises. Forward and backward of the compiled block equal
    eager's, at two sequence lengths (dynamic shapes: no recompile for the second)."""
    import torch._dynamo

    torch.manual_seed(0)
    block = Block().cuda().to(torch.bfloat16)
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for seqlen in (96, 211):
        x = torch.randn(2, seqlen, 256, device="cuda", dtype=torch.bfloat16)
        outs, grads_ = [], []
        for model in (block, compiled):
            block.zero_grad(set_to_none=True)
            xi = x.detach().requires_grad_()
            y = model(xi)
            y.float().square().mean().backward()
            outs.append(y.detach())
            grads_.append([xi.grad] + [p.grad for p in block.parameters()])
        assert torch.allclose(outs[0].float(), outs[1].float(), atol=2e-2, rtol=2e-2)
        for a, b in zip(*grads_):
            assert torch.allclose(a.float(), b.float(), atol=3e-2, rtol=5e-2)
    explain = torch._dynamo.explain(block)(torch.randn(1, 50, 256, device="cuda",
                                                       dtype=torch.bfloat16))
    assert explain.graph_break_count == 0


def test_training_run_follows_sdpa():
    """A tiny causal language model trained with cute_fa's attention and with SDPA's, from the
    same initial weights on the same batches (float32 weights, bf16 autocast): the loss curves
    agree within noise, and both learn the task."""
    def sdpa_attention(q, k, v):
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            enable_gqa=True)
        return o.transpose(1, 2)

    vocab, dim, steps = 64, 256, 100

    def make(attention):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(vocab, dim)
        blocks = [Block(dim, attention=attention) for _ in range(2)]
        head = torch.nn.Linear(dim, vocab)
        return torch.nn.Sequential(emb, *blocks, head).cuda()

    perm = torch.randperm(vocab, device="cuda", generator=torch.Generator(
        device="cuda").manual_seed(2))
    curves = []
    for attention in (None, sdpa_attention):
        model = make(attention)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        gen = torch.Generator(device="cuda").manual_seed(1)
        losses = []
        for _ in range(steps):
            # learnable: a token is followed by its image under a fixed permutation 90% of the
            # time, or by the token 3 back
            base = torch.randint(0, vocab, (8, 131), device="cuda", generator=gen)
            for t in range(1, 131):
                base[:, t] = torch.where(torch.rand(8, device="cuda", generator=gen) < 0.9,
                                         perm[base[:, t - 1]], base[:, max(t - 3, 0)])
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(base[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                                     base[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(torch.tensor(losses))
    smooth = [torch.nn.functional.avg_pool1d(c[None], 10, 1)[0] for c in curves]
    mine, theirs = smooth
    assert mine[-1] < curves[0][0] - 1.0, (curves[0][0], mine[-1])  # it learns
    assert (mine - theirs).abs().max() < 0.15, (mine - theirs).abs().max()


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_with_more_key_blocks_than_sms(causal):
    """One head whose key blocks outnumber the SMs (35k keys: 274 CTAs of 128 keys): CTAs wait
    for their turns only on CTAs the grid started earlier, so this finishes (a wrong order
    deadlocks: every resident CTA waiting for one that cannot start)."""
    gen = torch.Generator(device="cuda").manual_seed(4)
    q, k, v, dout = (_rand(1, 35000, 1, 64, dtype=torch.bfloat16, gen=gen) for _ in range(4))
    runs = [_autograd(lambda q, k, v: cute_fa.forward(q, k, v, causal=causal,
                                                      deterministic=True), q, k, v, dout)
            for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    fast = _autograd(lambda q, k, v: cute_fa.forward(q, k, v, causal=causal), q, k, v, dout)
    for a, b in zip(runs[0], fast):  # the same sums in another order
        assert (a.float() - b.float()).abs().max().item() <= 2e-2 * b.float().abs().max().item()


def test_hf_model_trains_through_cute_fa():
    """A tiny HF Llama (GQA) with attn_implementation="cute_fa": one training step's loss and
    gradients, for a dense and a left-padded batch (the padded one runs forward_varlen and its
    backward), against the same bf16 model on "sdpa": measured from a float32 copy of the
    model on "sdpa", cute_fa's gradient error is at most about sdpa's own."""
    transformers = pytest.importorskip("transformers")
    import cute_fa.integrations.transformers  # noqa: F401  registers "cute_fa"

    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=2,
                                   vocab_size=1000, max_position_embeddings=4096)
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(cfg).to(device="cuda").train()
    model = transformers.LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).train()
    model.load_state_dict(reference.state_dict())
    reference.set_attn_implementation("sdpa")
    ids = torch.randint(0, 1000, (2, 150), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :37] = 0  # left padding
    for attention_mask in (None, mask):
        labels = ids if attention_mask is None else ids.masked_fill(mask == 0, -100)
        results = []
        for net, impl in ((reference, "sdpa"), (model, "sdpa"), (model, "cute_fa")):
            net.set_attn_implementation(impl)
            net.zero_grad(set_to_none=True)
            loss = net(input_ids=ids, attention_mask=attention_mask, labels=labels).loss
            loss.backward()
            results.append((loss.item(), [p.grad.float() for p in net.parameters()]))
        (l_ref, g_ref), (l_sdpa, g_sdpa), (l_cute, g_cute) = results
        assert abs(l_cute - l_ref) <= 2 * abs(l_sdpa - l_ref) + 1e-2
        for r, a, b in zip(g_ref, g_sdpa, g_cute):
            assert (b - r).norm() <= 2 * (a - r).norm() + 1e-3 * r.norm() + 1e-6


def test_eager_autograd_and_the_custom_ops_agree():
    """The eager route (a plain autograd.Function) and the traced route (the custom ops, here
    called directly) run one implementation: bitwise equal outputs and gradients, both
    deterministic (the default sums dK, dV and dQ in the order their CTAs arrive, and this
    small GQA grid splits its groups over CTAs)."""
    from cute_fa.api import ops  # noqa: F401

    gen = torch.Generator(device="cuda").manual_seed(7)
    q = _rand(2, 190, 8, 128, dtype=torch.bfloat16, gen=gen, requires_grad=True)
    k, v = (_rand(2, 230, 2, 128, dtype=torch.bfloat16, gen=gen, requires_grad=True)
            for _ in range(2))
    dout = torch.randn(2, 190, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    o = cute_fa.forward(q, k, v, causal=True, window_size=(100, 0), softcap=10.0,
                        deterministic=True)
    assert type(o.grad_fn).__name__.startswith("_Attention")  # no dispatcher on this route
    eager = (o,) + torch.autograd.grad(o, (q, k, v), dout)
    o2, _ = torch.ops.cute_fa.fwd(q, k, v, True, None, 100, 0, 10.0, True, "auto", True)
    traced = (o2,) + torch.autograd.grad(o2, (q, k, v), dout)
    for a, b in zip(eager, traced):
        assert torch.equal(a, b)


def test_out_under_torch_compile():
    """out= under torch.compile: filled (through the op and a copy), and a bad one refused by
    the eager rules before anything runs."""
    torch._dynamo.reset()
    gen = torch.Generator(device="cuda").manual_seed(8)
    q, k, v = (_rand(1, 300, 4, 64, dtype=torch.float16, gen=gen) for _ in range(3))
    compiled = torch.compile(lambda q, k, v, out: cute_fa.forward(q, k, v, causal=True,
                                                                  out=out), fullgraph=True)
    out = torch.full_like(q, float("nan"))
    result = compiled(q, k, v, out)
    assert result.data_ptr() == out.data_ptr()
    assert torch.equal(out, cute_fa.forward(q, k, v, causal=True))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, out: cute_fa.forward(q, k, v, causal=True,
                                                                  out=out))
    bad = torch.full(q.shape, 3.0, device="cuda", dtype=torch.float32)
    with pytest.raises(TypeError, match="out must be float16 or bfloat16"):
        compiled(q, k, v, bad)
    assert (bad == 3.0).all()


@pytest.mark.parametrize("grad", [False, True])
def test_max_seqlen_checked_under_check_indices(monkeypatch, grad):
    """CUTE_FA_CHECK_INDICES=1: a max_seqlen_q or max_seqlen_k below the longest sequence is
    refused by forward_varlen and backward_varlen (it would leave rows unwritten or keys
    without a gradient); without it the free check still refuses one past the rows."""
    gen = torch.Generator(device="cuda").manual_seed(9)
    lens = [100, 300, 7]
    cu = torch.tensor([0, 100, 400, 407], device="cuda", dtype=torch.int32)
    q, k, v = (_rand(407, 4, 64, dtype=torch.bfloat16, gen=gen, requires_grad=grad)
               for _ in range(3))
    with pytest.raises(ValueError, match="must be at most the number of key rows"):
        cute_fa.forward_varlen(q, k, v, cu, cu, 300, 408, causal=True)
    monkeypatch.setenv("CUTE_FA_CHECK_INDICES", "1")
    with pytest.raises(ValueError, match=r"max_seqlen_k \(299\) is less than the longest key"):
        cute_fa.forward_varlen(q, k, v, cu, cu, max(lens), 299, causal=True)
    with pytest.raises(ValueError, match=r"max_seqlen_q \(299\) is less than the longest query"):
        cute_fa.forward_varlen(q, k, v, cu, cu, 299, max(lens), causal=True)
    o, lse = cute_fa.forward_varlen(q, k, v, cu, cu, 300, 300, causal=True, return_lse=True)
    with pytest.raises(ValueError, match=r"max_seqlen_k \(299\) is less than the longest key"):
        cute_fa.backward_varlen(torch.ones_like(o), q.detach(), k.detach(), v.detach(),
                                o.detach(), lse, cu, cu, 300, 299, causal=True)
