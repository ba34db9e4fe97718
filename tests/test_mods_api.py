"""score_mod / mask_mod at the public functions, on the CPU (the compiler and the launch stood
in, `launch_recording`): the traced graphs become the planned kernel key's fields and the
tensors they index its `captures` argument (the same tensors, in slot order, a 0-d one as one
element, a bool one as its bytes) on every forward backend, decode and ragged calls too;
equal graphs share a plan; and every refusal raises before any launch, naming what it
refuses, with `out=` untouched."""

import math

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402
from launch_recording import cpu_ops, launches  # noqa: E402,F401  (fixtures)
from launch_recording import named_arguments  # noqa: E402

from cute_fa.compile.registry import used_arguments  # noqa: E402

SLOPES = torch.rand(8)
DOCS = torch.randint(0, 3, (2, 300), dtype=torch.int32)
SCALE = torch.tensor(0.5)
BLOCKS = torch.rand(2, 5, 5) < 0.5


def alibi(s, b, h, q, kv):
    return s + SLOPES[h] * (kv - q)


def document(b, h, q, kv):
    return (DOCS[b, q] == DOCS[b, kv]) & (q >= kv)


def qkv(b=2, sq=300, sk=300, hq=8, hk=2, d=64):
    return (torch.randn(b, sq, hq, d, dtype=torch.bfloat16),
            torch.randn(b, sk, hk, d, dtype=torch.bfloat16),
            torch.randn(b, sk, hk, d, dtype=torch.bfloat16))


def _only_launch(recorded):
    (key, args), = recorded
    for arg, used in zip(args, used_arguments(key)):
        assert (arg is not None) == used, key
    return key, named_arguments(key, args)


@pytest.mark.parametrize("backend", ["sm80", "tma", "sm90"])
def test_mods_reach_the_key_and_captures_the_launch(launches, backend):
    recorded, _ = launches
    cute_fa.forward(*qkv(), backend=backend, score_mod=alibi, mask_mod=document)
    key, named = _only_launch(recorded)
    assert key.backend == backend
    assert key.score_mod.role == "score_mod" and key.mask_mod.role == "mask_mod"
    assert [c.dtype for c in key.score_mod.captures] == ["float32"]
    assert [c.dtype for c in key.mask_mod.captures] == ["int32"]
    captures = named["score_tensors"]
    assert captures[0] is SLOPES and captures[1] is DOCS and len(captures) == 2


def test_without_mods_no_captures_and_plain_key(launches):
    recorded, _ = launches
    cute_fa.forward(*qkv(), causal=True)
    key, named = _only_launch(recorded)
    assert key.score_mod is None and key.mask_mod is None and named["score_tensors"] is None


def test_a_mod_without_tensors_takes_no_captures(launches):
    recorded, _ = launches
    cute_fa.forward(*qkv(), mask_mod=lambda b, h, q, kv: q // 16 == kv // 16)
    key, named = _only_launch(recorded)
    assert key.mask_mod is not None and not key.has_score_tensors and named["score_tensors"] is None


def test_scalar_and_bool_captures(launches):
    recorded, _ = launches
    cute_fa.forward(*qkv(), score_mod=lambda s, b, h, q, kv: SCALE * s,
                    mask_mod=lambda b, h, q, kv: BLOCKS[b, q // 64, kv // 64])
    _, named = _only_launch(recorded)
    scale, blocks = named["score_tensors"]
    assert scale.shape == (1,) and scale.item() == SCALE.item()
    assert blocks.dtype == torch.uint8 and torch.equal(blocks.bool(), BLOCKS)
    assert blocks.data_ptr() == BLOCKS.data_ptr()  # a view, no copy


def test_equal_graphs_share_the_plan_new_ones_do_not(launches):
    recorded, _ = launches
    q, k, v = qkv()
    for slopes in (torch.rand(8), torch.rand(8)):
        cute_fa.forward(q, k, v, score_mod=lambda s, b, h, qi, kv: s + slopes[h] * (kv - qi))
    cute_fa.forward(q, k, v, score_mod=lambda s, b, h, qi, kv: s + SLOPES[h] * (qi - kv))
    keys = [key for key, _ in recorded]
    assert keys[0] == keys[1] and keys[2] != keys[0]
    assert named_arguments(*recorded[0])["score_tensors"][0] is not \
        named_arguments(*recorded[1])["score_tensors"][0]


def test_decode_and_paged_calls_take_mods(launches):
    recorded, _ = launches
    q, k, v = qkv(sq=2, sk=1000)
    cute_fa.forward(q, k, v, score_mod=alibi, num_splits=1)
    table = torch.arange(2 * 8, dtype=torch.int32).view(2, 8)
    cache = torch.randn(16, 128, 2, 64, dtype=torch.bfloat16)
    cute_fa.forward(q, cache, cache, mask_mod=document, page_table=table, num_splits=1)
    (dense, dense_args), (paged, paged_args) = recorded
    assert dense.backend == "sm80" and dense.score_mod is not None
    assert named_arguments(dense, dense_args)["score_tensors"] == (SLOPES,)
    assert paged.page_size == 128 and paged.mask_mod is not None
    assert named_arguments(paged, paged_args)["score_tensors"][0] is DOCS


def test_varlen_and_sdpa_take_mods(launches):
    recorded, _ = launches
    q = torch.randn(100, 8, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 40, 100], dtype=torch.int32)
    cute_fa.forward_varlen(q, q[:, :2], q[:, :2], cu, cu, 60, 60, score_mod=alibi)
    qt = torch.randn(2, 8, 300, 64, dtype=torch.bfloat16)
    cute_fa.sdpa(qt, qt, qt, mask_mod=document)
    (ragged, _), (dense, _) = recorded
    assert ragged.varlen_q and ragged.score_mod is not None
    assert dense.mask_mod is not None


def _refused(error, match, **kwargs):
    q, k, v = qkv()
    out = torch.full_like(q, 7.0)
    with pytest.raises(error, match=match):
        cute_fa.forward(q, k, v, out=out, **kwargs)
    assert (out == 7.0).all()


def test_refusals_before_any_launch(launches):
    recorded, _ = launches
    _refused(TypeError, r"score_mod: .*math\.", score_mod=lambda s, b, h, q, kv: math.sin(s))
    _refused(TypeError, "mask_mod returns a bool|returning", mask_mod=lambda b, h, q, kv: q - kv)
    _refused(TypeError, "score_mod must be a function", score_mod=3.0)
    _refused(ValueError, "softcap and score_mod", score_mod=alibi, softcap=30.0)
    far = torch.zeros(4, device="meta")
    _refused(ValueError, "mask_mod indexes a tensor on meta",
             mask_mod=lambda b, h, q, kv: far[h] > 0)
    assert not recorded


@pytest.mark.parametrize("backend", ["auto", "sm80", "tma", "sm90"])
@pytest.mark.parametrize("sm90_mods", [True, False])
def test_mods_train_through_the_planned_backward(launches, monkeypatch, backend, sm90_mods):
    """A call with mods that autograd records, whatever its forward's backend: its backward's
    main kernel is the wgmma one (`tuning_bwd.SM90_MODS`, on an sm90 GPU as here) or else the
    mma.sync one, the other not launched, with the mods in its key and the captured tensors as
    its score_tensors."""
    from cute_fa import tuning_bwd

    monkeypatch.setattr(tuning_bwd, "SM90_MODS", sm90_mods)
    recorded, _ = launches
    q, k, v = (t.requires_grad_() for t in qkv())
    o = cute_fa.forward(q, k, v, score_mod=alibi, mask_mod=document, backend=backend)
    o.backward(torch.ones_like(o))
    planned, other = ("bwd_sm90", "bwd_sm80") if sm90_mods else ("bwd_sm80", "bwd_sm90")
    (key, args), = [(key, args) for key, args in recorded if key.backend == planned]
    assert key.score_mod is not None and key.mask_mod is not None
    assert named_arguments(key, args)["score_tensors"] == (SLOPES, DOCS)
    assert not any(key.backend == other for key, _ in recorded)


@pytest.mark.parametrize("frozen_qkv", [False, True])
def test_captured_tensors_get_gradients(launches, frozen_qkv):
    """A score_mod's float tensors that require grad (a bf16 table, a 0-d scale): autograd
    records the call even where q, k, v do not require grad, the backward's key names their
    slots, its score tensors end with a float32 zero buffer of each one's shape (the kernel
    adds into it, stood in here: the gradients stay 0), and each gradient comes back in the
    tensor's shape and dtype; an int table and the mask_mod's tensor get none."""
    recorded, _ = launches
    q, k, v = qkv()
    if not frozen_qkv:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    table = torch.rand(8, 600, dtype=torch.bfloat16).requires_grad_()
    scale = torch.tensor(0.5, requires_grad=True)
    docs = DOCS.clone()
    cutoff = torch.tensor(200.0, requires_grad=True)

    def biased(s, b, h, qi, kv):
        return s * scale + table[h, qi - kv + 299] + docs[b, qi]

    o = cute_fa.forward(q, k, v, score_mod=biased,
                        mask_mod=lambda b, h, qi, kv: (qi - kv) < cutoff)
    assert o.requires_grad
    o.sum().backward()
    (key, args), = [(key, args) for key, args in recorded if key.backend.startswith("bwd_sm")]
    assert key.capture_grads == (0, 1)
    tensors = named_arguments(key, args)["score_tensors"]
    assert len(tensors) == 6 and tensors[0].shape == (1,) and tensors[0].item() == 0.5
    assert tensors[1].data_ptr() == table.data_ptr() and tensors[2] is docs
    grads = tensors[4:]
    assert [(g.shape, g.dtype) for g in grads] == [((1,), torch.float32),
                                                   ((8, 600), torch.float32)]
    assert not any(g.any() for g in grads)
    assert scale.grad.shape == () and scale.grad.dtype == torch.float32
    assert table.grad.shape == (8, 600) and table.grad.dtype == torch.bfloat16
    assert cutoff.grad is None
    assert (q.grad is None) == frozen_qkv


def test_capture_gradient_refusals(launches):
    """A table indexed through the score cannot get its gradient: refused before any launch;
    under no_grad the same call runs."""
    recorded, _ = launches
    q, k, v = (t.requires_grad_() for t in qkv())
    table = torch.rand(2, requires_grad=True)

    def through_score(s, b, h, qi, kv):
        return s + table[torch.where(s > 0, 1, 0)]

    with pytest.raises(ValueError, match="indexed through the score"):
        cute_fa.forward(q, k, v, score_mod=through_score)
    assert not recorded
    with torch.no_grad():
        cute_fa.forward(q, k, v, score_mod=through_score)
    assert len(recorded) == 1


def test_backward_keys_and_mods():
    """The mma.sync and wgmma backwards' keys take mods (and a block mask's lists, not
    causal, deterministic or, the wgmma one, persistent); sinks are refused by every backward
    key."""
    import dataclasses

    from cute_fa.compile.keys import BwdKey
    from cute_fa.layouts.config import BwdTileConfig
    from cute_fa.mods import trace_mask_mod
    from cute_fa.tuning_bwd import bwd_keys

    graph, _ = trace_mask_mod(document)
    assert BwdKey("sm_80", False, BwdTileConfig(head_dim=64), mask_mod=graph).has_score_tensors
    with pytest.raises(ValueError, match="take no sinks"):
        BwdKey("sm_80", False, BwdTileConfig(head_dim=64), sinks=True)
    with pytest.raises(ValueError, match="without causal, a window or deterministic"):
        BwdKey("sm_80", False, BwdTileConfig(head_dim=64), mask_mod=graph, block_sparse=True,
               deterministic=True)
    wgmma = bwd_keys("sm_90a", "bfloat16", 64, False, backend="sm90")[1]
    assert dataclasses.replace(wgmma, mask_mod=graph, block_sparse=True).has_score_tensors
    with pytest.raises(ValueError, match="without causal, a window or deterministic"):
        dataclasses.replace(wgmma, mask_mod=graph, block_sparse=True, deterministic=True)
    with pytest.raises(ValueError, match="persistence"):
        dataclasses.replace(wgmma, mask_mod=graph, block_sparse=True, persistent=132)
    with pytest.raises(ValueError, match="take no sinks"):
        dataclasses.replace(wgmma, sinks=True)


def test_forward_key_checks_its_mods():
    from cute_fa.mods import trace_mask_mod, trace_score_mod
    from cute_fa.tuning import kernel_key

    import dataclasses

    key = kernel_key("sm_90a", "bfloat16", 64, False, "sm90")
    mask, _ = trace_mask_mod(document)
    score, _ = trace_score_mod(alibi)
    with pytest.raises(TypeError, match="score_mod must be a traced score_mod"):
        dataclasses.replace(key, score_mod=mask)
    with pytest.raises(ValueError, match="softcap and a score_mod"):
        dataclasses.replace(key, score_mod=score, softcap=True)


@pytest.mark.parametrize("backend", ["sm80", "tma", "sm90"])
def test_sinks_reach_the_key_and_the_launch(launches, backend):
    """Sinks: a key field, and the last of the score tensors, float32 (from bf16 here), after
    a mod's captured tensors."""
    recorded, _ = launches
    sinks = torch.randn(8, dtype=torch.bfloat16)
    cute_fa.forward(*qkv(), backend=backend, sinks=sinks)
    cute_fa.forward(*qkv(), backend=backend, sinks=sinks, score_mod=alibi)
    (plain, plain_args), (modded, modded_args) = recorded
    assert plain.sinks and plain.score_mod is None and modded.sinks
    (got,) = named_arguments(plain, plain_args)["score_tensors"]
    assert got.dtype == torch.float32 and torch.equal(got, sinks.float())
    slopes, got = named_arguments(modded, modded_args)["score_tensors"]
    assert slopes is SLOPES and torch.equal(got, sinks.float())


def test_sinks_refusals(launches):
    recorded, _ = launches
    _refused(ValueError, r"sinks must be a float tensor of shape \(heads_q,\) = \(8,\)",
             sinks=torch.zeros(4))
    _refused(ValueError, "sinks must be a float tensor", sinks=torch.zeros(8, dtype=torch.int32))
    _refused(TypeError, "sinks must be a tensor", sinks=[0.0] * 8)
    # sinks that require grad make autograd record the call, which takes no out=
    _refused(ValueError, r"out= has no backward.*\(or sinks\)",
             sinks=torch.zeros(8, requires_grad=True))
    assert not recorded
    with torch.no_grad():
        cute_fa.forward(*qkv(), sinks=torch.zeros(8, requires_grad=True))
    assert len(recorded) == 1


def test_mods_under_torch_compile(launches, cpu_ops):
    """Under torch.compile (dynamo, the eager backend here) forward with mods and
    forward_varlen with sinks go through the in-graph ops (`api.graph_mods`), sdpa with a
    block mask runs eagerly behind a graph break: each launches the keys of the eager call,
    and autograd runs the backward with the mods."""
    from cute_fa.mods.block_mask import create_block_mask

    recorded, _ = launches
    q, k, v = (t.requires_grad_() for t in qkv())
    sinks = torch.zeros(8)
    bm = create_block_mask(document, 2, None, 300, 300)

    def step(q, k, v):
        o = cute_fa.forward(q, k, v, score_mod=alibi, mask_mod=document) * 2
        o = o + cute_fa.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                             block_mask=bm).transpose(1, 2)
        cu = torch.tensor([0, 300, 600], dtype=torch.int32)
        ragged = cute_fa.forward_varlen(q.reshape(600, 8, 64), k.reshape(600, 2, 64),
                                        v.reshape(600, 2, 64), cu, cu, 300, 300, sinks=sinks)
        return o + ragged.reshape(2, 300, 8, 64)

    torch.compile(step, backend="eager")(q, k, v).sum().backward()
    keys = [key for key, _ in recorded]
    forward = [key for key in keys if key.backend == "sm90"]
    assert [(key.score_mod is not None, key.block_sparse, key.varlen_q, key.sinks)
            for key in forward] == [(True, False, False, False), (False, True, False, False),
                                    (False, False, True, True)]
    backward = [key for key in keys if key.backend.startswith("bwd_sm")]
    assert any(key.score_mod is not None and key.mask_mod is not None for key in backward)
    assert q.grad is not None
