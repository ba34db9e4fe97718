"""cute_fa.forward with score_mod / mask_mod on a GPU, each backend: against the float64
reference that evaluates the same Python functions densely (`cute_fa.mods.reference`), next to
torch's FlexAttention run eagerly on the same inputs. For each case max|err| <= 2 *
max|err_flex| + 1e-3, rows that see no key get o = 0 and lse = -inf, the LSE within 1e-3 of
the reference's; outputs start poisoned (NaN). Then the compile cache across new captured
values, the decode and ragged paths, sdpa's entry, and a mod equivalent to a built-in feature
(causal, softcap) against that feature."""

import itertools
import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import cute_fa  # noqa: E402
from cute_fa.mods.reference import attention as reference  # noqa: E402

BACKENDS = ["sm80", "tma", "sm90"]
# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype)
SHAPES = [(2, 300, 300, 4, 2, 64, torch.bfloat16), (1, 257, 513, 4, 4, 128, torch.bfloat16),
          (1, 1000, 1000, 8, 2, 128, torch.float16), (1, 513, 200, 2, 1, 64, torch.float16)]


def mods(batch: int, heads: int, seqlen_q: int, seqlen_k: int) -> dict:
    """name -> (score_mod, mask_mod): the attention-gym's examples, their tensors on the GPU."""
    gen = torch.Generator().manual_seed(3)
    n = max(seqlen_q, seqlen_k)
    docs = torch.sort(torch.randint(0, 5, (batch, n), generator=gen), dim=1).values
    docs = docs.to(torch.int32).cuda()
    slopes = (torch.rand(heads, generator=gen) * 0.5).cuda()
    rel = torch.randn(heads, seqlen_q + seqlen_k - 1, generator=gen).to(torch.bfloat16).cuda()
    prefix = torch.randint(1, seqlen_k, (batch,), generator=gen).cuda()  # int64
    blocks = (torch.rand(batch, heads, n // 64 + 1, n // 64 + 1, generator=gen) < 0.5).cuda()

    def alibi(s, b, h, q, kv):
        return s + slopes[h] * (kv - q)

    def document(b, h, q, kv):
        return (docs[b, q] == docs[b, kv]) & (q >= kv)

    return {
        "causal": (None, lambda b, h, q, kv: q >= kv),
        "sliding_window": (None, lambda b, h, q, kv: (q >= kv) & (q - kv <= 100)),
        "prefix_lm": (None, lambda b, h, q, kv: (kv < prefix[b]) | (q >= kv)),
        "document": (None, document),
        "random_blocks": (None, lambda b, h, q, kv: blocks[b, h, q // 64, kv // 64]),
        "alibi": (alibi, None),
        "softcap": (lambda s, b, h, q, kv: torch.tanh(s / 20.0) * 20.0, None),
        "relative_bias": (lambda s, b, h, q, kv: s + rel[h, q - kv + seqlen_k - 1], None),
        "alibi_document": (alibi, document),
    }


NAMES = ["causal", "sliding_window", "prefix_lm", "document", "random_blocks", "alibi",
         "softcap", "relative_bias", "alibi_document"]


def _rand(*shape, dtype, gen):
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)


def flex_output(q, k, v, score_mod, mask_mod):
    """torch's FlexAttention, eager (its unfused path), on the same inputs."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, q.shape[0], q.shape[2], q.shape[1],
                                       k.shape[1], device="cuda")
    o = flex_attention(qt, kt, vt, score_mod=score_mod, block_mask=block_mask,
                       enable_gqa=q.shape[2] != k.shape[2])
    return o.transpose(1, 2)


def check(o, lse, q, k, v, score_mod, mask_mod, flex=True):
    o_ref, lse_ref = reference(q, k, v, score_mod=score_mod, mask_mod=mask_mod)
    empty = torch.isneginf(lse_ref)
    assert not torch.isnan(o).any(), "NaN in the output (an unwritten, poisoned element)"
    assert (o.transpose(1, 2)[empty] == 0).all(), "rows that see no key must be 0"
    assert torch.isneginf(lse[empty]).all(), "rows that see no key must have LSE -inf"
    err = (o.double() - o_ref).abs().max().item()
    tol = 1e-2
    if flex:
        o_flex = flex_output(q, k, v, score_mod, mask_mod)
        o_flex = torch.where(empty.transpose(1, 2)[..., None], 0, o_flex.double())
        tol = 2 * (o_flex - o_ref).abs().max().item() + 1e-3
    assert err <= tol, f"max err {err:.3g}, allowed {tol:.3g}"
    seen = ~empty
    if seen.any():
        lse_err = (lse.double() - lse_ref)[seen].abs().max().item()
        assert lse_err <= 1e-3 * max(1.0, lse_ref[seen].abs().max().item()), lse_err


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:6])))
@pytest.mark.parametrize("name", NAMES)
def test_mods_against_reference_and_flex(name, shape, backend):
    b, sq, sk, hq, hk, d, dtype = shape
    gen = torch.Generator(device="cuda").manual_seed(sq * 7 + d)
    q, k, v = _rand(b, sq, hq, d, dtype=dtype, gen=gen), _rand(b, sk, hk, d, dtype=dtype,
                                                                  gen=gen), \
        _rand(b, sk, hk, d, dtype=dtype, gen=gen)
    score_mod, mask_mod = mods(b, hq, sq, sk)[name]
    out = torch.full_like(q, math.nan)
    o, lse = cute_fa.forward(q, k, v, return_lse=True, out=out, backend=backend,
                             score_mod=score_mod, mask_mod=mask_mod)
    assert o.data_ptr() == out.data_ptr()
    check(o, lse, q, k, v, score_mod, mask_mod)
    again = cute_fa.forward(q, k, v, backend=backend, score_mod=score_mod, mask_mod=mask_mod)
    assert torch.equal(again, o), "repeat runs must be bitwise identical"


def test_new_captured_values_reuse_the_kernel():
    """A new slopes tensor (same dtype and rank): the same compiled kernel, the new values."""
    from cute_fa.compile import cache

    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (_rand(1, 200, 4, 64, dtype=torch.bfloat16, gen=gen) for _ in range(3))
    outs = []
    for i in range(3):
        slopes = torch.rand(4, device="cuda", generator=gen) * (i + 1)
        score_mod = lambda s, b, h, qi, kv, slopes=slopes: s + slopes[h] * (kv - qi)  # noqa
        before = len(cache.compiled_kernels)
        outs.append(cute_fa.forward(q, k, v, return_lse=True, score_mod=score_mod))
        if i:
            assert len(cache.compiled_kernels) == before, "new captured values recompiled"
        check(*outs[-1], q, k, v, score_mod, None, flex=False)
    assert not torch.equal(outs[0][0], outs[1][0])


@pytest.mark.parametrize("paged", [False, True])
def test_decode_with_mods(paged):
    """Few queries against a long cache (the decode kernel, its GQA packing: rows of several
    heads in one tile), dense and paged: ALiBi and a random block-sparse mask."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    b, sq, sk, hq, hk, d = 2, 3, 1500, 8, 2, 128
    q = _rand(b, sq, hq, d, dtype=torch.bfloat16, gen=gen)
    k, v = (_rand(b, sk, hk, d, dtype=torch.bfloat16, gen=gen) for _ in range(2))
    table_mods = mods(b, hq, sq, sk)
    score_mod, mask_mod = table_mods["alibi"][0], table_mods["random_blocks"][1]
    kwargs = {}
    kc, vc = k, v
    if paged:
        page = 64
        pages = sk // page + 1
        perm = torch.randperm(b * pages, device="cuda", generator=gen)
        kc = torch.randn(b * pages, page, hk, d, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        table = perm.view(b, pages).to(torch.int32)
        for i in range(b):
            for p in range(pages):
                rows = slice(p * page, min((p + 1) * page, sk))
                n = rows.stop - rows.start
                if n > 0:
                    kc[table[i, p], :n] = k[i, rows]
                    vc[table[i, p], :n] = v[i, rows]
        kwargs = dict(page_table=table,
                      seqused_k=torch.full((b,), sk, device="cuda", dtype=torch.int32))
    o, lse = cute_fa.forward(q, kc, vc, return_lse=True, score_mod=score_mod,
                             mask_mod=mask_mod, **kwargs)
    check(o, lse, q, k, v, score_mod, mask_mod, flex=False)


def test_varlen_with_mods():
    """A ragged batch: b is the sequence, q_idx and kv_idx positions in it; each sequence
    against the reference of its own dense call (b = its index in the batch)."""
    gen = torch.Generator(device="cuda").manual_seed(13)
    lens_q, lens_k, h, d = [37, 300, 1], [50, 300, 129], 4, 64
    slopes = torch.rand(h, device="cuda", generator=gen)
    offset = torch.tensor([0.0, 5.0, 11.0], device="cuda")
    score_mod = lambda s, b, hh, qi, kv: s + slopes[hh] * (kv - qi) + offset[b]  # noqa: E731
    mask_mod = lambda b, hh, qi, kv: (kv <= qi + 40) & (kv % 7 != b)  # noqa: E731
    q = _rand(sum(lens_q), h, d, dtype=torch.float16, gen=gen)
    k, v = (_rand(sum(lens_k), h, d, dtype=torch.float16, gen=gen) for _ in range(2))
    cu = [torch.tensor([0, *itertools.accumulate(n)], device="cuda", dtype=torch.int32)
          for n in (lens_q, lens_k)]
    o, lse = cute_fa.forward_varlen(q, k, v, cu[0], cu[1], max(lens_q), max(lens_k),
                                    return_lse=True, score_mod=score_mod, mask_mod=mask_mod)
    for i in range(3):
        rq = slice(sum(lens_q[:i]), sum(lens_q[:i + 1]))
        rk = slice(sum(lens_k[:i]), sum(lens_k[:i + 1]))
        # the sequence's own dense call, with b its index in the batch (a traced constant)
        entry = lambda fn, i=i: (lambda *a: fn(*a[:-4], i, *a[-3:]))  # noqa: E731
        check(o[rq][None], lse[:, rq][None], q[rq][None], k[rk][None], v[rk][None],
              entry(score_mod), entry(mask_mod), flex=False)


def test_sdpa_with_mods():
    gen = torch.Generator(device="cuda").manual_seed(17)
    q, k, v = (_rand(2, 4, 333, 64, dtype=torch.bfloat16, gen=gen) for _ in range(3))
    score_mod, mask_mod = mods(2, 4, 333, 333)["alibi_document"]
    o = cute_fa.sdpa(q, k, v, score_mod=score_mod, mask_mod=mask_mod)
    o_ref, _ = reference(*(t.transpose(1, 2) for t in (q, k, v)), score_mod=score_mod,
                         mask_mod=mask_mod)
    assert (o.transpose(1, 2).double() - o_ref).abs().max().item() < 2e-2


@pytest.mark.parametrize("backend", BACKENDS)
def test_mods_equal_to_builtins(backend):
    """A causal mask_mod (with Sq = Sk) and a softcap score_mod give the built-in features'
    outputs up to rounding (the mod computes tanh in full precision, the softcap fast)."""
    gen = torch.Generator(device="cuda").manual_seed(19)
    q, k, v = (_rand(1, 700, 4, 128, dtype=torch.bfloat16, gen=gen) for _ in range(3))
    causal = cute_fa.forward(q, k, v, causal=True, backend=backend)
    as_mod = cute_fa.forward(q, k, v, backend=backend, mask_mod=lambda b, h, qi, kv: qi >= kv)
    assert (causal.float() - as_mod.float()).abs().max().item() < 1e-2
    capped = cute_fa.forward(q, k, v, softcap=20.0, backend=backend)
    as_mod = cute_fa.forward(q, k, v, backend=backend,
                             score_mod=lambda s, b, h, qi, kv: torch.tanh(s / 20.0) * 20.0)
    assert (capped.float() - as_mod.float()).abs().max().item() < 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES[:3] + [(1, 1000, 17, 8, 8, 128, torch.bfloat16)],
                         ids=lambda s: "x".join(map(str, s[:6])))
def test_sinks(shape, backend):
    """Attention sinks (a logit per query head, gpt-oss's), alone, with causal and with a
    mod; rows that see no key (Sq > Sk, causal) get o = 0 and lse = the sink's logit."""
    b, sq, sk, hq, hk, d, dtype = shape
    gen = torch.Generator(device="cuda").manual_seed(sq + d)
    q = _rand(b, sq, hq, d, dtype=dtype, gen=gen)
    k, v = (_rand(b, sk, hk, d, dtype=dtype, gen=gen) for _ in range(2))
    sinks = torch.randn(hq, device="cuda", generator=gen) * 3
    for kwargs in (dict(), dict(causal=True), dict(score_mod=mods(b, hq, sq, sk)["alibi"][0])):
        out = torch.full_like(q, math.nan)
        o, lse = cute_fa.forward(q, k, v, return_lse=True, out=out, backend=backend,
                                 sinks=sinks, **kwargs)
        causal = kwargs.get("causal", False)
        mask = (lambda bb, h, qi, kv: kv <= qi + (sk - sq)) if causal else None
        o_ref, lse_ref = reference(q, k, v, score_mod=kwargs.get("score_mod"), mask_mod=mask,
                                   sinks=sinks)
        assert not torch.isnan(o).any()
        assert (o.double() - o_ref).abs().max().item() < 2e-2, kwargs
        assert (lse.double() - lse_ref).abs().max().item() < 1e-3 * max(
            1.0, lse_ref.abs().max().item()), kwargs


@pytest.mark.parametrize("paged", [False, True])
def test_sinks_in_decode(paged):
    """The decode kernel (GQA packed, split-KV: only the first split counts the sink)."""
    gen = torch.Generator(device="cuda").manual_seed(23)
    b, sq, sk, hq, hk, d = 3, 1, 3000, 16, 2, 128
    q = _rand(b, sq, hq, d, dtype=torch.bfloat16, gen=gen)
    k, v = (_rand(b, sk, hk, d, dtype=torch.bfloat16, gen=gen) for _ in range(2))
    sinks = torch.randn(hq, device="cuda", generator=gen) * 3
    kwargs = {}
    kc, vc = k, v
    if paged:
        page = 128
        pages = sk // page + 1
        kc = torch.zeros(b * pages, page, hk, d, device="cuda", dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        table = torch.randperm(b * pages, device="cuda", generator=gen).view(b, pages)
        for i in range(b):
            for p in range(pages):
                n = min(page, sk - p * page)
                if n > 0:
                    kc[table[i, p], :n] = k[i, p * page:p * page + n]
                    vc[table[i, p], :n] = v[i, p * page:p * page + n]
        kwargs = dict(page_table=table.to(torch.int32),
                      seqused_k=torch.full((b,), sk, device="cuda", dtype=torch.int32))
    for splits in (1, 4):
        o, lse = cute_fa.forward(q, kc, vc, causal=True, return_lse=True, sinks=sinks,
                                 num_splits=splits, **kwargs)
        o_ref, lse_ref = reference(q, k, v, sinks=sinks)
        assert (o.double() - o_ref).abs().max().item() < 2e-2, splits
        assert (lse.double() - lse_ref).abs().max().item() < 1e-3 * max(
            1.0, lse_ref.abs().max().item()), splits


BLOCK_SPARSE_BACKENDS = ["sm80", "tma", "sm90"]


@pytest.mark.parametrize("backend", BLOCK_SPARSE_BACKENDS)
@pytest.mark.parametrize("torch_mask", [False, True])
@pytest.mark.parametrize("name", ["document", "sliding_window", "random_blocks", "prefix_lm"])
def test_block_mask(name, torch_mask, backend):
    """block_mask (cute_fa's create_block_mask, or torch's): only the listed key tiles are
    visited, the mask's mask_mod evaluated on them; against the reference of the mask_mod
    and eager FlexAttention with the same block mask. Sq != Sk, GQA."""
    b, sq, sk, hq, hk, d = 2, 1000, 700, 4, 2, 128
    gen = torch.Generator(device="cuda").manual_seed(29)
    q = _rand(b, sq, hq, d, dtype=torch.bfloat16, gen=gen)
    k, v = (_rand(b, sk, hk, d, dtype=torch.bfloat16, gen=gen) for _ in range(2))
    mask_mod = mods(b, hq, sq, sk)[name][1]
    if torch_mask:
        from torch.nn.attention.flex_attention import create_block_mask
    else:
        from cute_fa.mods.block_mask import create_block_mask
    bm = create_block_mask(mask_mod, b, hq, sq, sk, device="cuda")
    out = torch.full_like(q, math.nan)
    o, lse = cute_fa.forward(q, k, v, return_lse=True, out=out, backend=backend, block_mask=bm)
    check(o, lse, q, k, v, None, mask_mod)


@pytest.mark.parametrize("backend, head_dim", [("sm90", 64), ("sm90", 128), ("sm90", 192),
                                               ("sm90", 256), ("sm80", 128)])
@pytest.mark.parametrize("block", [128, 64, 32])
@pytest.mark.parametrize("with_mask_mod", [True, False])
def test_block_mask_lists_decide(backend, head_dim, block, with_mask_mod):
    """torch's BlockMask made from lists (from_kv_blocks: partial and full blocks anywhere)
    with a causal mask_mod the lists do not follow, or none: a full block's scores are all
    kept, a partial block's where the mask_mod keeps them, an unlisted block's none, as
    FlexAttention's kernels do, on tiles that fit the blocks and on those that straddle them
    (blocks of 32: `api.mods.exact_blocks`). Against the reference of that mask, by hand."""
    from test_block_mask_api import hand_built
    from torch.nn.attention.flex_attention import BlockMask as TorchBlockMask

    torch_mask, seen = hand_built(block=block, heads=4)
    if not with_mask_mod:
        torch_mask = TorchBlockMask.from_kv_blocks(
            torch_mask.kv_num_blocks, torch_mask.kv_indices, torch_mask.full_kv_num_blocks,
            torch_mask.full_kv_indices, BLOCK_SIZE=block, seq_lengths=(1000, 1000))
        _, seen = hand_built(block=block, heads=4, mask_mod=False)
    torch_mask = torch_mask.to("cuda")
    seen = seen.cuda()
    gen = torch.Generator(device="cuda").manual_seed(41)
    q = _rand(1, 1000, 4, head_dim, dtype=torch.bfloat16, gen=gen)
    k, v = (_rand(1, 1000, 2, head_dim, dtype=torch.bfloat16, gen=gen) for _ in range(2))
    out = torch.full_like(q, math.nan)
    o, lse = cute_fa.forward(q, k, v, return_lse=True, out=out, backend=backend,
                             block_mask=torch_mask)
    check(o, lse, q, k, v, None, lambda b, h, qi, kv: seen[b, h, qi, kv], flex=False)


def test_flex_attention_drop_in():
    """cute_fa.flex_attention with torch's BlockMask and a score_mod, (B, H, S, D) layout,
    GQA, return_lse: against torch's flex_attention (eager) and the reference."""
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as torch_flex

    b, s, hq, hk, d = 2, 777, 8, 2, 64
    gen = torch.Generator(device="cuda").manual_seed(31)
    q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(b, hk, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    score_mod, mask_mod = mods(b, hq, s, s)["alibi_document"]
    bm = create_block_mask(mask_mod, b, None, s, s, device="cuda")
    o, lse = cute_fa.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm,
                                    enable_gqa=True, return_lse=True)
    assert o.shape == q.shape and lse.shape == (b, hq, s)
    o_ref, lse_ref = reference(*(t.transpose(1, 2) for t in (q, k, v)), score_mod=score_mod,
                               mask_mod=mask_mod)
    o_torch = torch_flex(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=True)
    err = (o.transpose(1, 2).double() - o_ref).abs().max().item()
    err_torch = (o_torch.transpose(1, 2).double() - o_ref).abs().max().item()
    assert err <= 2 * err_torch + 1e-3, (err, err_torch)
    assert (lse.double() - lse_ref).abs().max().item() < 1e-2


@pytest.mark.parametrize("causal", [False, True])
def test_sinks_gradients(causal):
    """dq, dk, dv and the sinks' gradient against float64 autograd of attention with a sink
    column (the kernels' backward and `_SinkAttention`'s formula), GQA, Sq != Sk."""
    gen = torch.Generator(device="cuda").manual_seed(37)
    b, sq, sk, hq, hk, d = 2, 300, 400, 8, 2, 64
    q = _rand(b, sq, hq, d, dtype=torch.bfloat16, gen=gen).requires_grad_()
    k, v = (_rand(b, sk, hk, d, dtype=torch.bfloat16, gen=gen).requires_grad_()
            for _ in range(2))
    sinks = (torch.randn(hq, device="cuda", generator=gen) * 2).requires_grad_()
    dout = _rand(b, sq, hq, d, dtype=torch.bfloat16, gen=gen)
    cute_fa.forward(q, k, v, causal=causal, sinks=sinks).backward(dout)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    qd, kd, vd, sd = leaves
    group = hq // hk
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kd.repeat_interleave(group, 2)) * d ** -0.5
    if causal:
        keep = torch.arange(sk, device="cuda")[None, :] <= \
            torch.arange(sq, device="cuda")[:, None] + (sk - sq)
        s = s.masked_fill(~keep, -math.inf)
    s = torch.cat([s, sd[None, :, None, None].expand(b, hq, sq, 1)], -1)
    p = torch.softmax(s, -1)[..., :-1]
    o = torch.einsum("bhqk,bkhd->bqhd", p, vd.repeat_interleave(group, 2))
    o.backward(dout.double())
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), (q.grad, k.grad, v.grad,
                                                              sinks.grad), leaves):
        err = (got.double() - want.grad).abs().max().item()
        assert err <= 2e-2 * max(1.0, want.grad.abs().max().item()), (name, err)


def _float64_backward(q, k, v, dout, logits, tables=(), output=False):
    """Float64 copies of q, k, v (batch, seqlen, heads, d; GQA) and of `tables`, requiring
    grad, through attention whose logits logits(s, index, table copies) makes of the scaled
    scores s (batch, heads_q, seqlen_q, seqlen_k) and the broadcast (b, h, q_idx, kv_idx)
    index tensors, backpropagated from dout: the copies, their .grad set (and with output
    the float64 output, detached)."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v) + tuple(tables)]
    qd, kd, vd = leaves[:3]
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kd.repeat_interleave(hq // hk, 2)) * d ** -0.5
    index = (torch.arange(b, device="cuda")[:, None, None, None],
             torch.arange(hq, device="cuda")[None, :, None, None],
             torch.arange(sq, device="cuda")[None, None, :, None],
             torch.arange(sk, device="cuda")[None, None, None, :])
    p = torch.softmax(logits(s, index, leaves[3:]), -1).nan_to_num(0.0)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vd.repeat_interleave(hq // hk, 2))
    o.backward(dout.double())
    return (leaves, o.detach()) if output else leaves


@pytest.fixture(params=["sm80", "sm90"])
def mods_backward(request, monkeypatch):
    """The backward that runs the mods: the mma.sync one, or the wgmma one
    (`tuning_bwd.SM90_MODS`, on sm90 GPUs)."""
    from cute_fa import tuning_bwd

    if request.param == "sm90" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wgmma backward runs on sm90 GPUs only")
    monkeypatch.setattr(tuning_bwd, "SM90_MODS", request.param == "sm90")
    return request.param


@pytest.mark.parametrize("name", ["alibi", "softcap", "relative_bias", "document",
                                  "alibi_document", "sliding_window"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_mod_gradients(name, head_dim, mods_backward):
    """dq, dk, dv through a score_mod / mask_mod (the backward of `mods_backward` runs the mods
    and the score_mod's derivative) against float64 autograd of the same Python functions applied
    to broadcast index tensors, as FlexAttention's eager path does; GQA, Sq != Sk."""
    b, sq, sk, hq, hk, d = 2, 300, 257, 4, 2, head_dim
    gen = torch.Generator(device="cuda").manual_seed(41)
    q = _rand(b, sq, hq, d, dtype=torch.bfloat16, gen=gen).requires_grad_()
    k, v = (_rand(b, sk, hk, d, dtype=torch.bfloat16, gen=gen).requires_grad_()
            for _ in range(2))
    dout = _rand(b, sq, hq, d, dtype=torch.bfloat16, gen=gen)
    score_mod, mask_mod = mods(b, hq, sq, sk)[name]
    cute_fa.forward(q, k, v, score_mod=score_mod, mask_mod=mask_mod).backward(dout)

    def logits(s, index, _):
        if score_mod is not None:
            s = score_mod(s, *index).to(torch.float64)
        if mask_mod is not None:
            s = s.masked_fill(~mask_mod(*index), -math.inf)
        return s
    leaves = _float64_backward(q, k, v, dout, logits)
    for label, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), leaves):
        err = (got.double() - want.grad).abs().max().item()
        assert err <= 2e-2 * max(1.0, want.grad.abs().max().item()), (label, err)


def _capture_mods(b, hq, sq, sk, gen):
    """name -> (tensors, make): float tables that require grad and a score_mod of them, each
    added through another path of the kernel's gradient sums: per warp (indexed by h alone),
    per row (by q_idx), per column (by kv_idx, with the score in the derivative), per score
    (by q_idx - kv_idx) and a 0-d scale."""
    def rand(*shape, dtype=torch.float32):
        return torch.rand(*shape, device="cuda", generator=gen).to(dtype)

    return {
        "alibi_slopes": ((rand(hq),), lambda t: lambda s, b_, h, q, kv: s + t[0][h] * (kv - q)),
        "query_bias": ((rand(b, sq),), lambda t: lambda s, b_, h, q, kv: s + t[0][b_, q]),
        "key_gate": ((rand(sk) + 0.5,), lambda t: lambda s, b_, h, q, kv: s * t[0][kv]),
        "relative_bias": ((rand(hq, sq + sk - 1, dtype=torch.bfloat16),),
                          lambda t: lambda s, b_, h, q, kv: s + t[0][h, q - kv + sk - 1]),
        "temperature": ((rand(()) + 0.5,), lambda t: lambda s, b_, h, q, kv: s * t[0]),
        # two loads of one table; a table that reaches the score only through a comparison
        "two_loads": ((rand(hq), rand(hq) - 0.5), lambda t: lambda s, b_, h, q, kv: (
            s + t[0][h] * (kv - q) + t[0][(h + 1) % hq] + torch.where(t[1][h] > 0, 1.0, 0.0))),
    }


@pytest.mark.parametrize("name", ["alibi_slopes", "query_bias", "key_gate", "relative_bias",
                                  "temperature", "two_loads"])
def test_captured_tensor_gradients(name, mods_backward):
    """The gradients of float tensors a score_mod captures (a learnable bias table, slopes, a
    temperature), and dq, dk, dv with them, under a causal mask_mod, against float64 autograd
    of the same functions on float64 copies of the tensors; GQA, Sq != Sk."""
    b, sq, sk, hq, hk, d = 2, 300, 257, 4, 2, 64
    gen = torch.Generator(device="cuda").manual_seed(43)
    q = _rand(b, sq, hq, d, dtype=torch.bfloat16, gen=gen).requires_grad_()
    k, v = (_rand(b, sk, hk, d, dtype=torch.bfloat16, gen=gen).requires_grad_()
            for _ in range(2))
    dout = _rand(b, sq, hq, d, dtype=torch.bfloat16, gen=gen)
    tensors, make = _capture_mods(b, hq, sq, sk, gen)[name]
    tensors = tuple(t.requires_grad_() for t in tensors)

    def causal(b_, h, qi, kv):
        return qi >= kv

    cute_fa.forward(q, k, v, score_mod=make(tensors), mask_mod=causal).backward(dout)
    leaves, o = _float64_backward(q, k, v, dout, lambda s, index, tables: make(tables)(
        s, *index).masked_fill(~causal(*index), -math.inf), tensors, output=True)
    # The backward's D = rowsum(dO * O) reads the output rounded to bf16 (as flash-attn's and
    # FlexAttention's backwards do). That moves each dS of a row by -P * (the rounding's share
    # of D), which a table sums over the row where the score's derivative is 1: all of it for
    # query_bias (whose exact gradient is 0: a bias on a whole row cancels in the softmax).
    # Its size per (b, q), summed over the heads, from the reference's output rounded:
    rounding = (dout.double() * (o.to(q.dtype).double() - o)).sum(-1).abs().sum(-1).max().item()
    got = (q.grad, k.grad, v.grad) + tuple(t.grad for t in tensors)
    for i, (g, want) in enumerate(zip(got, leaves)):
        assert g is not None and g.shape == want.shape and g.dtype == (
            (q, k, v) + tensors)[i].dtype, i
        expected = want.grad if want.grad is not None else torch.zeros_like(want)
        err = (g.double() - expected).abs().max().item()
        slack = 2 * rounding if i >= 3 else 0.0  # the kernel's own output rounds alike
        assert err <= 2e-2 * max(1.0, expected.abs().max().item()) + slack, (i, err, rounding)


@pytest.mark.parametrize("backend", BLOCK_SPARSE_BACKENDS)
@pytest.mark.parametrize("block", [128, 64])
@pytest.mark.parametrize("sparse, whole", [(False, False), (True, False), (True, True)])
def test_block_mask_gradients(backend, block, sparse, whole, monkeypatch, mods_backward):
    """dq, dk, dv through a block mask (hand-made lists with a causal mask_mod they do not
    follow: the forward walks the lists, the backward masks by the blocks' kinds every query
    block, or with `block_mask.SPARSE_BACKWARD` the listed ones, and with
    `WHOLE_TILES_BACKWARD` none of those inside full blocks) against float64 autograd of
    attention under that mask, by hand; GQA."""
    from test_block_mask_api import hand_built

    from cute_fa.mods import block_mask

    monkeypatch.setattr(block_mask, "SPARSE_BACKWARD", sparse)
    monkeypatch.setattr(block_mask, "WHOLE_TILES_BACKWARD", whole)

    torch_mask, seen = hand_built(block=block, heads=4)
    torch_mask, seen = torch_mask.to("cuda"), seen.cuda()
    b, s, hq, hk, d = 1, 1000, 4, 2, 64
    gen = torch.Generator(device="cuda").manual_seed(47)
    q = _rand(b, s, hq, d, dtype=torch.bfloat16, gen=gen).requires_grad_()
    k, v = (_rand(b, s, hk, d, dtype=torch.bfloat16, gen=gen).requires_grad_()
            for _ in range(2))
    dout = _rand(b, s, hq, d, dtype=torch.bfloat16, gen=gen)
    cute_fa.forward(q, k, v, block_mask=torch_mask, backend=backend).backward(dout)
    leaves = _float64_backward(q, k, v, dout,
                               lambda logits, index, _: logits.masked_fill(~seen, -math.inf))
    for label, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), leaves):
        err = (got.double() - want.grad).abs().max().item()
        assert err <= 2e-2 * max(1.0, want.grad.abs().max().item()), (label, err)


def test_mods_under_torch_compile():
    """torch.compile (inductor, fullgraph=True) around a call with a score_mod and a mask_mod
    made outside it, and its backward: the call is the graph's `cute_fa::fwd_mods` op
    (`api.graph_mods`), its gradients bitwise those of the eager call (the loss's sum may be
    ordered otherwise by inductor)."""
    b, s, hq, hk, d = 2, 300, 4, 2, 64
    gen = torch.Generator(device="cuda").manual_seed(53)
    q = _rand(b, s, hq, d, dtype=torch.bfloat16, gen=gen)
    k, v = (_rand(b, s, hk, d, dtype=torch.bfloat16, gen=gen) for _ in range(2))
    score_mod, mask_mod = mods(b, hq, s, s)["alibi_document"]

    def step(q, k, v):
        return (cute_fa.forward(q * 2, k, v, score_mod=score_mod, mask_mod=mask_mod) + 1).sum()

    grads = []
    torch._dynamo.reset()
    for fn in (step, torch.compile(step, fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        loss = fn(*leaves)
        loss.backward()
        grads.append([loss.detach()] + [t.grad for t in leaves])
    assert torch.allclose(grads[0][0], grads[1][0], rtol=1e-3)
    for eager, compiled in zip(grads[0][1:], grads[1][1:]):
        assert torch.equal(eager, compiled)
