"""Block-sparse attention on the CPU: `BlockMask.kernel_blocks` (the key tiles a kernel's query
tile visits) against a dense enumeration of the mask; and `forward(block_mask=)` /
`flex_attention` with the compiler and the launch stood in (`launch_recording`): the planned
key (block_sparse, the mask's mask_mod, the sm90 or sm80 kernel, no GQA packing, the prefill
kernel even for few queries), the lists at the planned tile as its last score tensors, and
each refusal before any launch."""

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402
from launch_recording import launches  # noqa: E402,F401  (a fixture)
from launch_recording import named_arguments  # noqa: E402

from cute_fa.mods.block_mask import create_block_mask, kernel_tile  # noqa: E402

DOCS = torch.sort(torch.randint(0, 5, (2, 1000), generator=torch.Generator().manual_seed(0)),
                  dim=1).values


def document_causal(b, h, q, kv):
    return (DOCS[b, q] == DOCS[b, kv]) & (q >= kv)


def windowed(b, h, q, kv):
    return (q - kv <= 200 + 30 * h) & (kv <= q)


@pytest.mark.parametrize("mask, heads", [(document_causal, None), (windowed, 3)])
@pytest.mark.parametrize("tile", [(128, 128), (128, 176), (64, 64), (192, 112)])
@pytest.mark.parametrize("block_size", [128, (64, 256)])
def test_kernel_blocks_cover_every_kept_score(mask, heads, tile, block_size):
    """Each query tile's list is ascending, names every key tile holding a score the mask
    keeps, and only tiles that meet one of the mask's full or partial blocks."""
    bm = create_block_mask(mask, 2, heads, 1000, 900, block_size=block_size)
    kept = bm.dense()
    block_m, block_n = tile
    counts, listed = bm.kernel_blocks(block_m, block_n, 2, 3, whole=True)
    indices, whole = kernel_tile(listed)
    assert torch.equal(bm.kernel_blocks(block_m, block_n, 2, 3, whole=False)[1], indices)
    assert counts.shape == (2, 3, -(-1000 // block_m)) and counts.dtype == torch.int32
    assert indices.shape == counts.shape + (-(-900 // block_n),)
    assert not whole[counts[..., None] <= torch.arange(whole.shape[-1])].any()
    bq, bk = (block_size, block_size) if isinstance(block_size, int) else block_size
    touched = (bm.kv_num_blocks[..., None] > torch.arange(bm.kv_indices.shape[-1])) | \
        (bm.full_kv_num_blocks[..., None] > torch.arange(bm.kv_indices.shape[-1]))
    for b in range(2):
        for h in range(3):
            hb = h if heads else 0
            for m in range(counts.shape[2]):
                got = indices[b, h, m, :counts[b, h, m]].tolist()
                assert got == sorted(got)
                rows = slice(m * block_m, (m + 1) * block_m)
                need = {j for j in range(indices.shape[-1])
                        if kept[b, hb, rows, j * block_n:(j + 1) * block_n].any()}
                assert need <= set(got), (b, h, m)
                for j, w in zip(got, whole[b, h, m, :counts[b, h, m]].tolist()):
                    # a tile listed whole keeps every score of its rows and keys
                    scores = kept[b, hb, rows, j * block_n:(j + 1) * block_n]
                    assert not w or bool(scores.all()), (b, h, m, j)
                torch_rows = range(m * block_m // bq, min(-(-(m + 1) * block_m // bq),
                                                          touched.shape[2]))
                for j in got:  # a listed tile meets a listed block
                    cols = range(j * block_n // bk, -(-(j + 1) * block_n // bk))
                    assert any(touched[b, hb, r, bm.kv_indices[b, hb, r] == c].any()
                               or touched[b, hb, r, bm.full_kv_indices[b, hb, r] == c].any()
                               for r in torch_rows for c in cols if c < touched.shape[3])


@pytest.mark.parametrize("tile", [(128, 128), (64, 64), (128, 256), (192, 112)])
def test_full_tiles_are_listed_whole(tile):
    """Causal on blocks of 128, 1000 positions: a kernel tile is listed whole (the kernel skips
    its mask_mod) exactly where every block it meets is full, strictly below the diagonal and
    inside the sequences (the last block row and column hold padding: partial)."""
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 1000, 1000)
    block_m, block_n = tile
    counts, listed = bm.kernel_blocks(block_m, block_n, 1, 1, whole=True)
    indices, whole = kernel_tile(listed)
    full_rows = 1000 // 128  # block rows 0 ... 6 hold no padding
    for m in range(counts.shape[2]):
        got = dict(zip(indices[0, 0, m, :counts[0, 0, m]].tolist(),
                       whole[0, 0, m, :counts[0, 0, m]].tolist()))
        r0, r1 = m * block_m // 128, (min((m + 1) * block_m, 1000) - 1) // 128
        assert sorted(got) == [j for j in range(-(-1000 // block_n))
                               if j * block_n < (r1 + 1) * 128], m
        for j, w in got.items():
            c1 = (min((j + 1) * block_n, 1000) - 1) // 128
            assert w == (c1 < r0 and r1 < full_rows), (m, j)
    assert whole.any()


def test_kernel_blocks_are_kept_per_tile():
    """A mask converts once per (tile, batch, heads): every layer of a step reuses it."""
    bm = create_block_mask(document_causal, 2, None, 1000, 1000)
    first = bm.kernel_blocks(128, 128, 2, 4)
    assert bm.kernel_blocks(128, 128, 2, 4) is first
    assert bm.kernel_blocks(128, 64, 2, 4) is not first


def qkv(b=2, sq=1000, sk=1000, hq=4, hk=2, d=64):
    return (torch.randn(b, sq, hq, d, dtype=torch.bfloat16),
            torch.randn(b, sk, hk, d, dtype=torch.bfloat16),
            torch.randn(b, sk, hk, d, dtype=torch.bfloat16))


@pytest.mark.parametrize("backend, kernel", [("auto", "sm90"), ("sm90", "sm90"),
                                             ("sm80", "sm80")])
def test_block_mask_plans_a_block_sparse_kernel(launches, backend, kernel):
    recorded, _ = launches
    bm = create_block_mask(document_causal, 2, None, 1000, 1000)
    cute_fa.forward(*qkv(), block_mask=bm, backend=backend)
    (key, args), = recorded
    assert key.backend == kernel and key.block_sparse and not key.causal
    assert key.mask_mod is not None and getattr(key, "pack_gqa", 1) == 1
    assert not getattr(key, "persistent", 0)
    tensors = named_arguments(key, args)["score_tensors"]
    docs, counts, indices = tensors
    assert docs is DOCS
    want = bm.kernel_blocks(key.tile.block_m, key.tile.block_n, 2, 4)
    assert torch.equal(counts, want[0]) and torch.equal(indices, want[1])


def test_few_queries_take_the_prefill_kernel(launches):
    recorded, _ = launches
    q, k, v = qkv(sq=5)
    cute_fa.forward(q, k, v, block_mask=create_block_mask(windowed, None, 4, 5, 1000))
    (key, _), = recorded
    assert key.block_sparse and key.backend == "sm90"  # not the decode (cp.async) kernel


def test_flex_attention_is_forward_on_transposes(launches):
    recorded, _ = launches
    q, k, v = (t.transpose(1, 2) for t in qkv())
    bm = create_block_mask(document_causal, 2, None, 1000, 1000)
    out = cute_fa.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s * 2,
                                 block_mask=bm, enable_gqa=True, scale=0.5)
    (key, args), = recorded
    named = named_arguments(key, args)
    assert named["q"].data_ptr() == q.data_ptr() and named["q"].shape == (2, 1000, 4, 64)
    assert named["softmax_scale"] == 0.5 and key.score_mod is not None
    assert out.shape == q.shape


def _refused(error, match, q=None, **kwargs):
    q, k, v = qkv() if q is None else q
    with pytest.raises(error, match=match):
        cute_fa.forward(q, k, v, **kwargs)


def test_block_mask_refusals(launches):
    recorded, _ = launches
    bm = create_block_mask(document_causal, 2, None, 1000, 1000)
    _refused(ValueError, "mask_mod or as block_mask", block_mask=bm,
             mask_mod=document_causal)
    _refused(ValueError, "causal or window_size: put them in the mask", block_mask=bm,
             causal=True)
    _refused(ValueError, r"made for \(seqlen_q, seqlen_k\) = \(1000, 1000\)", qkv(sq=999),
             block_mask=bm)
    _refused(ValueError, r"batch and heads \(3, 1\)", qkv(),
             block_mask=create_block_mask(lambda b, h, q, kv: q >= kv, 3, None, 1000, 1000))
    _refused(ValueError, "not the TMA kernel", block_mask=bm, backend="tma")
    _refused(TypeError, "block_mask must be", block_mask=object())
    with pytest.raises(ValueError, match="enable_gqa=True"):
        cute_fa.flex_attention(*(t.transpose(1, 2) for t in qkv()))
    assert not recorded
