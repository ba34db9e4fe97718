"""Block masks over ragged batches and KV caches on a GPU (`block_mask.SEQUENCE_BLOCK_MASKS`
turned on here): each sequence of `forward_varlen` against the float64 reference of its own
dense call under the mask's meaning at its positions, every forward backend, a mask made
longer than the sequences, lists that decide (hand-made, with a mask_mod they do not follow);
a paged cache with seqused_k; and the ragged backward against float64 autograd. Outputs start
poisoned (NaN); rows past a sequence's keys (a one-key sequence, an empty one) included."""

import itertools
import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import cute_fa  # noqa: E402
from test_mods_gpu import _float64_backward, _rand, check  # noqa: E402
from test_mods_gpu import mods_backward  # noqa: E402,F401  (a fixture: each backward)

from cute_fa.mods import block_mask  # noqa: E402

LENS_Q, LENS_K = [37, 300, 0, 129, 1], [50, 300, 129, 1, 64]


@pytest.fixture(autouse=True)
def sequence_masks(monkeypatch):
    monkeypatch.setattr(block_mask, "SEQUENCE_BLOCK_MASKS", True)


def _ragged(lens_q, lens_k, hq, hk, d, gen, grad=False):
    q = _rand(sum(lens_q), hq, d, dtype=torch.bfloat16, gen=gen)
    k, v = (_rand(sum(lens_k), hk, d, dtype=torch.bfloat16, gen=gen) for _ in range(2))
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    cu = [torch.tensor([0, *itertools.accumulate(n)], device="cuda", dtype=torch.int32)
          for n in (lens_q, lens_k)]
    return q, k, v, cu


def _entry(i):
    rq = slice(sum(LENS_Q[:i]), sum(LENS_Q[:i + 1]))
    rk = slice(sum(LENS_K[:i]), sum(LENS_K[:i + 1]))
    return rq, rk


def _hand_lists(heads, q_blocks, k_blocks, block, gen):
    """torch's BlockMask from random lists (partial and full blocks anywhere) with a
    mask_mod they do not follow, and what it keeps at (b, h, q, kv), by hand."""
    from torch.nn.attention.flex_attention import BlockMask as TorchBlockMask

    b = len(LENS_Q)
    kind = torch.randint(0, 3, (b, heads, q_blocks, k_blocks), generator=gen)
    lists = [kind == 1, kind == 2]
    counts = [t.sum(-1).to(torch.int32) for t in lists]
    indices = [torch.sort((~t).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
               for t in lists]
    mask = TorchBlockMask.from_kv_blocks(
        counts[0], indices[0], counts[1], indices[1], BLOCK_SIZE=block,
        mask_mod=lambda bb, h, q, kv: (q + kv) % 3 != 0,
        seq_lengths=(q_blocks * block, k_blocks * block)).to("cuda")
    kinds = kind.cuda()

    def seen(bb, h, q, kv):
        k_ = kinds[bb, h, q // block, kv // block]
        return (k_ == 2) | ((k_ == 1) & ((q + kv) % 3 != 0))
    return mask, seen


@pytest.mark.parametrize("backend", ["sm80", "tma", "sm90"])
@pytest.mark.parametrize("case", ["document", "longer_mask", "hand_lists"])
def test_varlen_block_mask(case, backend):
    gen = torch.Generator(device="cuda").manual_seed(61)
    hq, hk, d = 4, 2, 128
    q, k, v, cu = _ragged(LENS_Q, LENS_K, hq, hk, d, gen)
    max_q, max_k = max(LENS_Q), max(LENS_K)
    docs = torch.sort(torch.randint(0, 4, (len(LENS_Q), 512), device="cuda", generator=gen),
                      dim=1).values

    def document(b, h, qi, kv):
        return (docs[b, qi] == docs[b, kv]) & (kv <= qi + 32 * h)

    if case == "hand_lists":
        mask, seen = _hand_lists(hq, 3, 3, 128, torch.Generator().manual_seed(62))
    else:
        from cute_fa.mods.block_mask import create_block_mask

        size = (512, 512) if case == "longer_mask" else (max_q, max_k)
        mask, seen = create_block_mask(document, len(LENS_Q), hq, *size, device="cuda",
                                       block_size=64), document
    out = torch.full_like(q, math.nan)
    o, lse = cute_fa.forward_varlen(q, k, v, cu[0], cu[1], max_q, max_k, return_lse=True,
                                    out=out, backend=backend, block_mask=mask)
    for i in range(len(LENS_Q)):
        rq, rk = _entry(i)
        if LENS_Q[i] == 0:
            continue
        entry = lambda *a, i=i: seen(i, *a[1:])  # noqa: E731
        check(o[rq][None], lse[:, rq][None], q[rq][None], k[rk][None], v[rk][None], None,
              entry, flex=False)


@pytest.mark.parametrize("shared", [False, True])
def test_paged_block_mask(shared):
    """Few queries against a paged cache with seqused_k (the decode kernel), a mask made for
    the cache's capacity, per head (unpacked) or of one head shared by all (a GQA group packed
    into one tile, its lists at block_m / group queries a tile): each entry against its used
    keys' reference."""
    gen = torch.Generator(device="cuda").manual_seed(67)
    b, sq, hq, hk, d, page, pages = 2, 3, 8, 2, 128, 64, 24
    used = [1500, 70]
    q = _rand(b, sq, hq, d, dtype=torch.bfloat16, gen=gen)
    kc = _rand(b * pages, page, hk, d, dtype=torch.bfloat16, gen=gen)
    vc = _rand(b * pages, page, hk, d, dtype=torch.bfloat16, gen=gen)
    table = torch.randperm(b * pages, device="cuda", generator=gen).view(b, pages)
    table = table.to(torch.int32)
    from cute_fa.mods.block_mask import create_block_mask

    def mask_mod(bb, h, qi, kv):
        if shared:
            return (kv % 5 != qi) & (kv // 128 % 3 != bb)
        return (kv % 5 != h % 5) & (kv // 128 % 3 != bb)
    mask = create_block_mask(mask_mod, b, None if shared else hq, sq, pages * page,
                             device="cuda", block_size=128)
    out = torch.full_like(q, math.nan)
    o, lse = cute_fa.forward(q, kc, vc, return_lse=True, out=out, page_table=table,
                             seqused_k=torch.tensor(used, device="cuda", dtype=torch.int32),
                             block_mask=mask)
    for i in range(b):
        keys = torch.cat([kc[p] for p in table[i].tolist()])[:used[i]][None]
        values = torch.cat([vc[p] for p in table[i].tolist()])[:used[i]][None]
        entry = lambda bb, h, qi, kv, i=i: mask_mod(i, h, qi, kv)  # noqa: E731
        check(o[i:i + 1], lse[i:i + 1], q[i:i + 1], keys, values, None, entry, flex=False)


@pytest.mark.parametrize("sparse", [False, True])
def test_varlen_block_mask_gradients(sparse, monkeypatch, mods_backward):
    """dq, dk, dv of a ragged batch under hand-made lists (the backward walks each key
    tile's query tiles cut to its sequence, or with sparse off every one, masked by the
    kinds) against float64 autograd of each sequence's own attention under that mask."""
    monkeypatch.setattr(block_mask, "SPARSE_BACKWARD", sparse)
    gen = torch.Generator(device="cuda").manual_seed(71)
    hq, hk, d = 4, 2, 64
    q, k, v, cu = _ragged(LENS_Q, LENS_K, hq, hk, d, gen, grad=True)
    mask, seen = _hand_lists(hq, 3, 3, 128, torch.Generator().manual_seed(72))
    dout = _rand(*q.shape, dtype=torch.bfloat16, gen=gen)
    cute_fa.forward_varlen(q, k, v, cu[0], cu[1], max(LENS_Q), max(LENS_K),
                           block_mask=mask).backward(dout)
    for i in range(len(LENS_Q)):
        rq, rk = _entry(i)
        if LENS_Q[i] == 0:  # keys no query sees get no gradient
            assert not k.grad[rk].any() and not v.grad[rk].any()
            continue
        index_seen = lambda index, i=i: seen(i, *index[1:])  # noqa: E731
        leaves = _float64_backward(
            q[rq][None], k[rk][None], v[rk][None], dout[rq][None],
            lambda logits, index, _: logits.masked_fill(~index_seen(index), -math.inf))
        for label, got, want in zip(("dq", "dk", "dv"),
                                    (q.grad[rq], k.grad[rk], v.grad[rk]), leaves):
            err = (got.double() - want.grad[0]).abs().max().item()
            assert err <= 2e-2 * max(1.0, want.grad.abs().max().item()), (i, label, err)

