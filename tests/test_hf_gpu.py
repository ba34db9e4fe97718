"""cute_fa as HF transformers' attention backend, on a GPU: randomly initialised tiny models
(no downloads) give the logits of the `eager` implementation within the deviation that `sdpa`
itself shows from `eager` (max|cute_fa - eager| <= 2 max|sdpa - eager| + 1e-3 max|logits|), for
dense batches, left-padded batches, sliding-window layers, softcapped scores and KV-cache
decoding through generate(); gpt-oss's sinks, forward and a training step's gradients."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.gpu

import cute_fa.integrations.transformers  # noqa: E402,F401  registers "cute_fa"


def llama():
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
                                   max_position_embeddings=4096)
    return cfg, transformers.LlamaForCausalLM


def qwen2():
    cfg = transformers.Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                                   num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
                                   max_position_embeddings=4096, use_sliding_window=True,
                                   sliding_window=48, max_window_layers=1,
                                   layer_types=["full_attention", "sliding_attention",
                                                "sliding_attention"])
    return cfg, transformers.Qwen2ForCausalLM


def gemma2():
    cfg = transformers.Gemma2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                    vocab_size=1000, max_position_embeddings=4096,
                                    sliding_window=48, attn_logit_softcapping=20.0,
                                    final_logit_softcapping=30.0, query_pre_attn_scalar=64)
    return cfg, transformers.Gemma2ForCausalLM


MODELS = {"llama": llama, "qwen2": qwen2, "gemma2": gemma2}


def build(name):
    cfg, cls = MODELS[name]()
    torch.manual_seed(0)
    model = cls(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    model.set_attn_implementation("eager")
    return model


def logits(model, impl, ids, mask=None, positions=None):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask,
                     position_ids=positions).logits.double()


def compare(model, ids, mask=None, rows=None):
    ref = logits(model, "eager", ids, mask)
    dev = {}
    for impl in ("sdpa", "cute_fa"):
        out = logits(model, impl, ids, mask)
        diff = (out - ref).abs()
        if rows is not None:
            diff = diff[rows]
        dev[impl] = diff.max().item()
    peak = ref.abs().max().item()
    assert dev["cute_fa"] <= 2 * dev["sdpa"] + 1e-3 * peak, dev
    return dev


@pytest.mark.parametrize("name", MODELS)
def test_dense_batch(name):
    model = build(name)
    ids = torch.randint(0, 1000, (2, 150), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    compare(model, ids)


def test_from_config_and_set_attn_implementation():
    cfg, _ = llama()
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="cute_fa")
    assert model.config._attn_implementation == "cute_fa"
    model.set_attn_implementation("sdpa")
    model.set_attn_implementation("cute_fa")
    assert model.config._attn_implementation == "cute_fa"


def left_padded(lengths, total, seed=2):
    gen = torch.Generator("cuda").manual_seed(seed)
    ids = torch.randint(0, 1000, (len(lengths), total), device="cuda", generator=gen)
    mask = torch.zeros(len(lengths), total, dtype=torch.long, device="cuda")
    for i, n in enumerate(lengths):
        mask[i, total - n:] = 1
    return ids, mask


@pytest.mark.parametrize("name", MODELS)
def test_left_padded_batch_of_4(name):
    model = build(name)
    ids, mask = left_padded([120, 7, 64, 33], 120)
    compare(model, ids, mask, rows=mask.bool())


@pytest.mark.parametrize("name", MODELS)
def test_packed_sequences_by_position_ids(name):
    """Three prompts packed into one row, positions restarting at 0: attention stays within
    each prompt, as eager computes it with the same position_ids and a block-diagonal mask."""
    model = build(name)
    lengths = [40, 70, 25]
    gen = torch.Generator("cuda").manual_seed(4)
    ids = torch.randint(0, 1000, (1, sum(lengths)), device="cuda", generator=gen)
    positions = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
    with torch.no_grad():
        model.set_attn_implementation("cute_fa")
        packed = model(input_ids=ids, position_ids=positions).logits.double()
        model.set_attn_implementation("eager")
        ref = torch.cat([model(input_ids=part).logits.double()
                         for part in ids.split(lengths, dim=1)], dim=1)
        model.set_attn_implementation("sdpa")
        sdpa = torch.cat([model(input_ids=part).logits.double()
                          for part in ids.split(lengths, dim=1)], dim=1)
    dev_cute = (packed - ref).abs().max().item()
    dev_sdpa = (sdpa - ref).abs().max().item()
    assert dev_cute <= 2 * dev_sdpa + 1e-3 * ref.abs().max().item(), (dev_cute, dev_sdpa)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("padded", [False, True])
def test_generate_with_kv_cache(name, padded):
    """Greedy generate() through the KV cache (decode steps of one query, past the sliding
    window): every step's logits against eager's on the generated sequence, teacher-forced."""
    model = build(name)
    if padded:
        ids, mask = left_padded([60, 20, 45, 9], 60, seed=5)
    else:
        ids = torch.randint(0, 1000, (1, 60), device="cuda",
                            generator=torch.Generator("cuda").manual_seed(5))
        mask = torch.ones_like(ids)
    model.set_attn_implementation("cute_fa")
    with torch.no_grad():
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40,
                             min_new_tokens=40, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    seq = gen.sequences
    steps = torch.stack(gen.logits, dim=1).double()  # (batch, 40, vocab)
    full_mask = torch.cat([mask, torch.ones(mask.shape[0], 40, dtype=mask.dtype,
                                            device="cuda")], dim=1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers them
    ref = logits(model, "eager", seq, full_mask, positions)[:, ids.shape[1] - 1:-1]
    sdpa = logits(model, "sdpa", seq, full_mask, positions)[:, ids.shape[1] - 1:-1]
    dev_cute = (steps - ref).abs().max().item()
    dev_sdpa = (sdpa - ref).abs().max().item()
    assert dev_cute <= 2 * dev_sdpa + 1e-3 * ref.abs().max().item(), (dev_cute, dev_sdpa)


def gpt_oss():
    """gpt-oss: attention sinks (s_aux), a sliding and a full layer, a mixture of experts that
    routes every token to all of them (a top-k choice would flip on bf16 rounding)."""
    cfg = transformers.GptOssConfig(hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                                    num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                                    vocab_size=1000, max_position_embeddings=4096,
                                    num_local_experts=4, num_experts_per_tok=4,
                                    sliding_window=48,
                                    layer_types=["sliding_attention", "full_attention"])
    return cfg, transformers.GptOssForCausalLM


def test_gpt_oss_logits_and_training_step():
    """gpt-oss (random init, sinks set to matter) through cute_fa: the logits and every
    attention parameter's gradient of a training step (the sinks' among them) against float32
    eager, within twice the deviation of bf16 eager from it (+ 1e-3 of the scale)."""
    import copy

    cfg, cls = gpt_oss()
    torch.manual_seed(0)
    reference = cls(cfg).to(device="cuda", dtype=torch.float32)
    with torch.no_grad():
        for layer in reference.model.layers:
            layer.self_attn.sinks.copy_(torch.linspace(-1.0, 3.0, cfg.num_attention_heads))
    model = copy.deepcopy(reference).to(torch.bfloat16)
    ids = torch.randint(0, 1000, (2, 150), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(6))

    def step(m, impl):
        m.set_attn_implementation(impl)
        m.train()
        m.zero_grad()
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        return [out.logits.double()] + [p.grad.double() for name, p in
                                        sorted(m.named_parameters()) if "self_attn" in name]

    want = step(reference, "eager")
    # the logits, then per layer the sinks and the q, k, v, o projections' weights and biases
    assert len(want) == 1 + 2 * 9
    deviation = {}
    for impl in ("eager", "cute_fa"):
        got = step(model, impl)
        deviation[impl] = [((g - w).abs().max() / w.abs().max()).item()
                           for g, w in zip(got, want)]
    for i, (cute, eager) in enumerate(zip(deviation["cute_fa"], deviation["eager"])):
        assert cute <= 2 * eager + 1e-3, (i, deviation)


def test_training_mode_dropout_is_refused():
    cfg, cls = llama()
    cfg.attention_dropout = 0.1
    model = cls(cfg).to(device="cuda", dtype=torch.bfloat16).train()
    model.set_attn_implementation("cute_fa")
    ids = torch.randint(0, 1000, (1, 16), device="cuda")
    with torch.no_grad(), pytest.raises(ValueError, match="dropout"):
        model(input_ids=ids)
