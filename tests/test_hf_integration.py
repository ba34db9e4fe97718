"""The HF transformers backend (cute_fa.integrations.transformers), on the CPU.

cute_fa.forward / forward_varlen are replaced by fakes that check the layout rules of the
kernels, record their arguments and compute the attention with a float32 reference, so
that tiny models running attn_implementation="cute_fa" can be compared with "eager",
whose masks (causality, sliding windows, padding, packing) are the authority.
"""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import cute_fa  # noqa: E402
from cute_fa.integrations import transformers as hf  # noqa: E402

BF16 = torch.bfloat16


def reference(q, k, v, causal, scale, window, softcap, sinks=None):
    """One sequence: q (seqlen_q, heads_q, d), k/v (seqlen_k, heads_kv, d), float32 math;
    causal and window bottom-right aligned as in flash-attn; query head h reads kv head
    h // (heads_q // heads_kv); a query that sees no key gets zeros; sinks (heads_q,): one
    more logit per head, of a key with value 0."""
    seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv, _ = k.shape
    k = k.float().repeat_interleave(heads_q // heads_kv, dim=1)
    v = v.float().repeat_interleave(heads_q // heads_kv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k)
    scores = scores * (scale if scale is not None else head_dim ** -0.5)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    i = torch.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q
    j = torch.arange(seqlen_k)[None, :]
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if causal:
        visible &= j <= i
    if window[0] >= 0:
        visible &= j >= i - window[0]
    if window[1] >= 0:
        visible &= j <= i + window[1]
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        column = sinks.float()[:, None, None].expand(heads_q, seqlen_q, 1)
        probs = torch.softmax(torch.cat([scores, column], -1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", probs, v)


def batched_reference(q, k, v, causal, scale=None, window=(-1, -1), softcap=0.0, sinks=None):
    """`reference` of every batch entry of (batch, seqlen, heads, d) tensors, stacked."""
    return torch.stack([reference(q[b], k[b], v[b], causal, scale, window, softcap, sinks)
                        for b in range(q.shape[0])])


def check_kernel_layout(*tensors):
    for t in tensors:
        assert t.dtype in (torch.float16, BF16)
        *outer, last = t.stride()
        assert last == 1 and all(s % 8 == 0 for s in outer), t.stride()
        assert t.data_ptr() % 16 == 0


class FakeKernels:
    """cute_fa.forward and cute_fa.forward_varlen on the CPU, recording every call."""

    def __init__(self):
        self.calls = []

    def forward(self, q, k, v, causal=False, softmax_scale=None, return_lse=False, out=None,
                backend="auto", *, window_size=(-1, -1), softcap=0.0, seqused_k=None,
                page_table=None, num_splits=None, sinks=None):
        check_kernel_layout(q, k, v)
        assert q.dim() == 4 and k.shape == v.shape and q.shape[2] % k.shape[2] == 0
        self.calls.append(dict(fn="forward", q=q, k=k, causal=causal, scale=softmax_scale,
                               window=window_size, softcap=softcap, sinks=sinks))
        return batched_reference(q, k, v, causal, softmax_scale, window_size,
                                 softcap, sinks).to(q.dtype)

    def forward_varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                       causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                       return_lse=False, out=None, backend="auto"):
        check_kernel_layout(q, k, v)
        assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
        assert isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int)
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        assert cq[-1] == q.shape[0] and ck[-1] == k.shape[0]
        assert max_seqlen_q == max(b - a for a, b in zip(cq, cq[1:]))
        assert max_seqlen_k == max(b - a for a, b in zip(ck, ck[1:]))
        self.calls.append(dict(fn="forward_varlen", q=q, k=k, cu_q=cq, cu_k=ck,
                               max_q=max_seqlen_q, max_k=max_seqlen_k, causal=causal,
                               scale=softmax_scale, window=window_size, softcap=softcap))
        parts = [reference(q[a:b], k[c:d], v[c:d], causal, softmax_scale, window_size, softcap)
                 for a, b, c, d in zip(cq, cq[1:], ck, ck[1:])]
        return torch.cat(parts).to(q.dtype)

    def fns(self):
        return {c["fn"] for c in self.calls}


@pytest.fixture
def kernels(monkeypatch):
    fake = FakeKernels()
    monkeypatch.setattr(cute_fa, "forward", fake.forward, raising=False)
    monkeypatch.setattr(cute_fa, "forward_varlen", fake.forward_varlen, raising=False)
    return fake


SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SMALL, head_dim=16),
    # layer 0 slides over 8 keys, layer 1 sees them all
    "qwen2": lambda: transformers.Qwen2Config(
        **SMALL, use_sliding_window=True, sliding_window=8, max_window_layers=0,
        layer_types=["sliding_attention", "full_attention"]),
    # softcap 1.0 binds on scores of this size; layers alternate sliding (8) and full
    "gemma2": lambda: transformers.Gemma2Config(
        **SMALL, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
        attn_logit_softcapping=1.0, final_logit_softcapping=None),
}
# gpt-oss: attention sinks (s_aux), sliding (8) and full layers, a small mixture of experts
# that routes every token to all of them (a top-k choice would flip on bf16 rounding)
GPT_OSS = lambda: transformers.GptOssConfig(  # noqa: E731
    **dict(SMALL, intermediate_size=64), head_dim=16, num_local_experts=4,
    num_experts_per_tok=4, sliding_window=8, layer_types=["sliding_attention",
                                                          "full_attention"])


def build(arch, attn_implementation="cute_fa", dtype=BF16):
    torch.manual_seed(0)
    config = GPT_OSS() if arch == "gpt_oss" else CONFIGS[arch]()
    return transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation, dtype=dtype).eval()


def logits(model, implementation, **inputs):
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        out = model(**inputs)
    return out.logits.float(), out.past_key_values


def assert_close(got, want, where=None):
    """bf16 models: the two paths differ by bf16 rounding (about 2% of the logits' scale);
    a wrong mask, window or softcap moves them by 15% or more."""
    if where is not None:
        got, want = got[where], want[where]
    assert (got - want).abs().max() <= 0.05 * want.abs().max()


def test_registered_in_both_interfaces():
    from transformers.masking_utils import flash_attention_mask

    hf.register()  # idempotent: a second registration changes nothing
    assert transformers.AttentionInterface()["cute_fa"] is hf.cute_fa_attention
    assert transformers.AttentionMaskInterface()["cute_fa"] is flash_attention_mask
    model = build("llama")
    assert model.config._attn_implementation == "cute_fa"


def test_set_attn_implementation(kernels):
    model = build("llama", attn_implementation="eager")
    model.set_attn_implementation("cute_fa")
    assert model.config._attn_implementation == "cute_fa"
    with torch.no_grad():
        model(torch.randint(0, 128, (2, 12)), use_cache=False)
    assert kernels.fns() == {"forward"} and len(kernels.calls) == 2


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_dense_prefill_and_decode_match_eager(kernels, arch):
    model = build(arch)
    ids = torch.randint(0, 128, (2, 20))
    want, cache_e = logits(model, "eager", input_ids=ids)
    got, cache_c = logits(model, "cute_fa", input_ids=ids)
    assert_close(got, want)
    assert kernels.fns() == {"forward"}
    assert all(c["causal"] for c in kernels.calls)
    windows = {c["window"] for c in kernels.calls}
    softcaps = {c["softcap"] for c in kernels.calls}
    if arch == "llama":
        assert windows == {(-1, -1)} and softcaps == {0.0}
    else:  # flash_attention_2's mapping of sliding_window=8 over 20 keys
        assert windows == {(7, 7), (-1, -1)}
    assert softcaps == ({1.0} if arch == "gemma2" else {0.0})
    if arch == "gemma2":
        assert {c["scale"] for c in kernels.calls} == {16 ** -0.5}

    # a 3-token step after the cache (bottom-right causal), then a 1-token decode step
    kernels.calls.clear()
    for step in (torch.randint(0, 128, (2, 3)), torch.randint(0, 128, (2, 1))):
        want, cache_e = logits(model, "eager", input_ids=step, past_key_values=cache_e)
        got, cache_c = logits(model, "cute_fa", input_ids=step, past_key_values=cache_c)
        assert_close(got, want)
    assert {tuple(c["q"].shape[:2]) for c in kernels.calls} == {(2, 3), (2, 1)}


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_left_padded_batch_goes_through_varlen(kernels, arch, monkeypatch):
    masks_seen = []
    attention = hf.cute_fa_attention

    def spy(module, query, key, value, attention_mask, **kwargs):
        masks_seen.append(attention_mask)
        return attention(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, "cute_fa", spy)
    model = build(arch)
    lengths = [7, 12, 3, 10]
    mask = torch.tensor([[0] * (12 - n) + [1] * n for n in lengths])
    ids = torch.randint(0, 128, (4, 12))
    valid = mask.bool()
    want, cache_e = logits(model, "eager", input_ids=ids, attention_mask=mask)
    got, cache_c = logits(model, "cute_fa", input_ids=ids, attention_mask=mask)
    assert_close(got, want, valid)
    assert kernels.fns() == {"forward_varlen"}
    for call in kernels.calls:  # 7, 12, 3, 10 valid tokens
        assert call["cu_q"] == call["cu_k"] == [0, 7, 19, 22, 32]
        assert call["max_q"] == call["max_k"] == 12
    # transformers hands the function the 2-D bool padding mask, never a 4-D one
    assert all(m is not None and m.dtype == torch.bool and m.shape == (4, 12)
               for m in masks_seen)

    # a 2-token step (queries: the last 2 mask positions), then a 1-token decode step;
    # layer 1 attends to every key in all three models: 7, 12, 3 and 10 plus the new ones
    expected = {2: ([0, 2, 4, 6, 8], [0, 9, 23, 28, 40]),
                1: ([0, 1, 2, 3, 4], [0, 10, 25, 31, 44])}
    for width in (2, 1):
        step = torch.randint(0, 128, (4, width))
        mask = torch.cat([mask, torch.ones(4, width, dtype=mask.dtype)], dim=1)
        want, cache_e = logits(model, "eager", input_ids=step, attention_mask=mask,
                               past_key_values=cache_e)
        kernels.calls.clear()
        got, cache_c = logits(model, "cute_fa", input_ids=step, attention_mask=mask,
                              past_key_values=cache_c)
        assert_close(got, want)
        layer1 = kernels.calls[1]
        assert (layer1["cu_q"], layer1["cu_k"]) == expected[width]


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_generate_with_static_cache_matches_eager(kernels, arch):
    """generate() builds position_ids and the mask itself; a static cache has key slots
    beyond the mask, which must not be attended to."""
    model = build(arch)
    mask = torch.tensor([[0] * (12 - n) + [1] * n for n in (7, 12, 3, 10)])
    ids = torch.randint(0, 128, (4, 12))
    runs = {}
    for implementation in ("eager", "cute_fa"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            runs[implementation] = model.generate(
                ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                cache_implementation="static", output_logits=True, return_dict_in_generate=True)
    assert torch.equal(runs["cute_fa"].sequences, runs["eager"].sequences)
    for got, want in zip(runs["cute_fa"].logits, runs["eager"].logits):
        assert_close(got.float(), want.float())
    assert kernels.fns() == {"forward_varlen"}


def test_packed_sequences_by_position_ids(kernels):
    model = build("llama")
    lengths = [5, 7, 3]
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    ids = torch.randint(0, 128, (1, 15))
    want, _ = logits(model, "eager", input_ids=ids, position_ids=position_ids, use_cache=False)
    unpacked, _ = logits(model, "eager", input_ids=ids, use_cache=False)
    assert not torch.allclose(want, unpacked, atol=0.1)  # packing changes the result
    got, _ = logits(model, "cute_fa", input_ids=ids, position_ids=position_ids, use_cache=False)
    assert_close(got, want)
    assert kernels.fns() == {"forward_varlen"}
    assert all(c["cu_q"] == c["cu_k"] == [0, 5, 12, 15] and c["max_q"] == 7
               for c in kernels.calls)

    # the same packing given as cu_seq_lens kwargs (int64, as a collator makes them)
    kernels.calls.clear()
    cu = torch.tensor([0, 5, 12, 15])
    got, _ = logits(model, "cute_fa", input_ids=ids, position_ids=position_ids, use_cache=False,
                    cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=7, max_length_k=7)
    assert_close(got, want)
    assert all(c["fn"] == "forward_varlen" and c["cu_q"] == [0, 5, 12, 15]
               for c in kernels.calls)

    # positions counting up without a restart are one sequence: the dense path
    kernels.calls.clear()
    logits(model, "cute_fa", input_ids=ids, position_ids=torch.arange(15)[None], use_cache=False)
    assert kernels.fns() == {"forward"}


MODULE = SimpleNamespace(is_causal=True, config=SimpleNamespace(output_attentions=False))


def qkv(batch=2, seqlen=10, heads=4, heads_kv=2, head_dim=16, dtype=BF16):
    """(batch, heads, seqlen, d) transposes of dense (batch, seqlen, heads, d) tensors, as
    the models' projections make them."""
    bases = [torch.randn(batch, seqlen, h, head_dim, dtype=dtype) for h in (heads, heads_kv,
                                                                              heads_kv)]
    return bases, [t.transpose(1, 2) for t in bases]


def test_views_reach_the_kernel_uncopied(kernels):
    (q_base, k_base, _), (q, k, v) = qkv()
    out, weights = hf.cute_fa_attention(MODULE, q, k, v, None, scaling=0.3)
    call = kernels.calls[0]
    assert call["q"].data_ptr() == q_base.data_ptr() and call["k"].data_ptr() == k_base.data_ptr()
    assert call["scale"] == 0.3 and call["causal"] is True and weights is None
    assert out.shape == (2, 10, 4, 16)
    # a cache-style (batch, heads, seqlen, d) dense key is passed as its view too
    cache_k = k.contiguous()
    hf.cute_fa_attention(MODULE, q, cache_k, v, None)
    assert kernels.calls[1]["k"].data_ptr() == cache_k.data_ptr()


def test_strides_the_kernels_refuse_are_copied(kernels):
    wide = torch.randn(2, 10, 4, 20, dtype=BF16)
    q = wide[..., :16].transpose(1, 2)  # a row stride of 20 elements
    _, (_, k, v) = qkv()
    out, _ = hf.cute_fa_attention(MODULE, q, k, v, None, is_causal=False)
    assert kernels.calls[0]["causal"] is False
    want = batched_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), False)
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-2)


def test_smaller_value_head_dim_is_padded_and_cropped(kernels):
    _, (q, k, _) = qkv()
    v = torch.randn(2, 2, 10, 8, dtype=BF16)  # MLA-style: value head_dim 8 < 16
    out, _ = hf.cute_fa_attention(MODULE, q, k, v, None)
    assert out.shape == (2, 10, 4, 8)
    want = batched_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True)
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-2)


def test_gpt_oss_sinks_match_eager(kernels):
    """gpt-oss (random init, sinks set large enough to matter) through cute_fa: its s_aux
    reaches the kernels as sinks and the logits match eager's; without the sinks they would
    not (the test can fail)."""
    model = build("gpt_oss")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(torch.linspace(-1.0, 3.0, 4))
    ids = torch.randint(0, 128, (2, 20))
    want, _ = logits(model, "eager", input_ids=ids)
    got, _ = logits(model, "cute_fa", input_ids=ids)
    assert_close(got, want)
    assert all(c["sinks"] is not None for c in kernels.calls) and len(kernels.calls) == 2
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-1e4)  # sinks that weigh nothing
    without, _ = logits(model, "eager", input_ids=ids)
    assert (without - want).abs().max() > 0.05 * want.abs().max()


def test_s_aux_becomes_sinks(kernels):
    """gpt-oss's attention sinks (`s_aux`, a logit per query head) reach cute_fa as sinks."""
    _, (q, k, v) = qkv()
    sinks = torch.randn(4)
    hf.cute_fa_attention(MODULE, q, k, v, None, s_aux=sinks)
    assert kernels.calls[-1]["sinks"] is sinks
    hf.cute_fa_attention(MODULE, q, k, v, None)
    assert kernels.calls[-1]["sinks"] is None


def test_refusals(kernels):
    _, (q, k, v) = qkv()
    with pytest.raises(ValueError, match="dropout=0.1"):
        hf.cute_fa_attention(MODULE, q, k, v, None, dropout=0.1)
    with pytest.raises(ValueError, match="attention_mask.*4-D torch.bfloat16"):
        hf.cute_fa_attention(MODULE, q, k, v, torch.zeros(2, 1, 10, 10, dtype=BF16))
    with pytest.raises(ValueError, match="attention_mask.*2-D torch.float32"):
        hf.cute_fa_attention(MODULE, q, k, v, torch.zeros(2, 10))
    with pytest.raises(ValueError, match="output_attentions"):
        hf.cute_fa_attention(MODULE, q, k, v, None, output_attentions=True)
    _, (q12, k12, v12) = qkv(head_dim=12)
    with pytest.raises(ValueError, match="head_dim"):
        hf.cute_fa_attention(MODULE, q12, k12, v12, None)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seq_lens_q/k"):
        hf.cute_fa_attention(MODULE, q, k, v, torch.ones(2, 10, dtype=torch.bool),
                             cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    chunked = SimpleNamespace(is_causal=True, layer_idx=1, config=SimpleNamespace(
        layer_types=["full_attention", "chunked_attention"]))
    with pytest.raises(ValueError, match="chunked"):
        hf.cute_fa_attention(chunked, q, k, v, None)
    _, (q32, k32, v32) = qkv(dtype=torch.float32)
    with pytest.raises(TypeError, match=r"query, got torch.float32.*dtype=torch.bfloat16"):
        hf.cute_fa_attention(MODULE, q32, k32, v32, None)
    assert kernels.calls == []  # every refusal comes before a kernel call


def test_model_level_refusals(kernels):
    ids = torch.randint(0, 128, (1, 8))
    with pytest.raises(TypeError, match="float32"):  # a model left in fp32
        with torch.no_grad():
            build("llama", dtype=torch.float32)(ids)
    model = build("llama")
    with pytest.raises(ValueError, match="output_attentions"):
        with torch.no_grad():
            model(ids, output_attentions=True)
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    model.train()
    with pytest.raises(ValueError, match="dropout"):
        model(ids)
    assert kernels.calls == []
