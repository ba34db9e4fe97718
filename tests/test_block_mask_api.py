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


@pytest.mark.parametrize("tile", [(128, 128), (64, 128), (128, 64)])
def test_query_tiles_listed_whole_keep_every_score(tile):
    """The backward's lists with whole (`query_tiles`): the same query tiles per key tile, an
    entry -(i + 1) exactly where `kernel_blocks` marks tile (i, j) whole, and such a tile
    keeps every score of the mask (by `dense`, the reference's mask); a document mask
    without full blocks off the diagonal and a causal one with them."""
    for mask_mod in (document_causal, lambda b, h, q, kv: q >= kv):
        bm = create_block_mask(mask_mod, 2, None, 1000, 900, block_size=(64, 128))
        block_m, block_n = tile
        counts, listed = bm.kernel_blocks(block_m, block_n, 2, 3, whole=True)
        f_indices, f_whole = kernel_tile(listed)
        q_counts, q_listed = bm.query_tiles(block_m, block_n, 2, 3, whole=True)
        plain = bm.query_tiles(block_m, block_n, 2, 3, whole=False)
        assert torch.equal(q_counts, plain[0])
        q_indices, q_whole = kernel_tile(q_listed)
        assert torch.equal(q_indices, plain[1])
        kept = bm.dense()
        marked = 0
        for b in range(2):
            forward = {(i, j): w for i in range(counts.shape[2])
                       for j, w in zip(f_indices[b, 0, i, :counts[b, 0, i]].tolist(),
                                       f_whole[b, 0, i, :counts[b, 0, i]].tolist())}
            for j in range(q_counts.shape[2]):
                n = q_counts[b, 0, j]
                for i, w in zip(q_indices[b, 0, j, :n].tolist(), q_whole[b, 0, j, :n].tolist()):
                    assert w == forward[i, j], (b, i, j)
                    scores = kept[b, 0, i * block_m:(i + 1) * block_m,
                                  j * block_n:(j + 1) * block_n]
                    assert not w or bool(scores.all()), (b, i, j)
                    marked += w
        assert marked > 0 or mask_mod is document_causal
    assert bm.query_tiles(128, 128, 2, 3, whole=True) is bm.query_tiles(128, 128, 2, 3,
                                                                           whole=True)


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
def test_block_mask_plans_a_block_sparse_kernel(launches, monkeypatch, backend, kernel):
    from cute_fa.mods import block_mask

    monkeypatch.setattr(block_mask, "WHOLE_TILES", True)  # no kinds: the lists and the mask_mod
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
    _refused(TypeError, "block_mask must be", block_mask=object())
    with pytest.raises(ValueError, match="enable_gqa=True"):
        cute_fa.flex_attention(*(t.transpose(1, 2) for t in qkv()))
    assert not recorded


def hand_built(seqlen: int = 1000, block: int = 128, heads: int = 2, mask_mod: bool = True):
    """torch's BlockMask from lists written here (from_kv_blocks), with a causal mask_mod
    that the lists do not follow: partial blocks anywhere, full blocks above the diagonal too;
    and what it lets attention see, by hand: a full block's every score, a partial block's
    where q >= kv (every one without the mask_mod), nothing else."""
    from torch.nn.attention.flex_attention import BlockMask as TorchBlockMask

    n = -(-seqlen // block)
    gen = torch.Generator().manual_seed(5)
    kind = torch.randint(0, 3, (1, heads, n, n), generator=gen)  # 0 skip, 1 partial, 2 full
    lists = [kind == 1, kind == 2]
    counts = [t.sum(-1).to(torch.int32) for t in lists]
    indices = [torch.sort((~t).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
               for t in lists]
    mask = TorchBlockMask.from_kv_blocks(counts[0], indices[0], counts[1], indices[1],
                                         BLOCK_SIZE=block, mask_mod=lambda b, h, q, kv: q >= kv,
                                         seq_lengths=(seqlen, seqlen))
    seen = torch.zeros(1, heads, seqlen, seqlen, dtype=torch.bool)
    for h in range(heads):
        for i in range(n):
            for j in range(n):
                rows, cols = slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block)
                if kind[0, h, i, j] == 2:
                    seen[0, h, rows, cols] = True
                elif kind[0, h, i, j] == 1:
                    q = torch.arange(i * block, min((i + 1) * block, seqlen))[:, None]
                    kv = torch.arange(j * block, min((j + 1) * block, seqlen))[None, :]
                    seen[0, h, rows, cols] = (q >= kv) | (not mask_mod)
    return mask, seen


def test_exact_mask_mod_is_what_the_blocks_say():
    """`exact_mask_mod` evaluated densely over the block kinds keeps what the hand-made lists
    and the mask_mod say, as FlexAttention's kernels do (not what the mask_mod says alone)."""
    from cute_fa.mods.block_mask import exact_mask_mod, from_torch
    from cute_fa.mods.dense import evaluate, index_grid
    from cute_fa.mods.trace import trace_mask_mod

    torch_mask, seen = hand_built()
    bm = from_torch(torch_mask)
    graph, captured = trace_mask_mod(bm.mask_mod)
    exact = exact_mask_mod(graph, bm.block_size)
    got = evaluate(exact, captured + (bm.block_kinds(1, 2),), **index_grid(1, 2, 1000, 1000))
    assert torch.equal(got, seen)
    assert torch.equal(bm.dense(), seen)
    blocks_only = exact_mask_mod(None, bm.block_size)
    got = evaluate(blocks_only, (bm.block_kinds(1, 2),), **index_grid(1, 2, 1000, 1000))
    assert torch.equal(got, bm.block_kinds(1, 2).repeat_interleave(128, 2).repeat_interleave(
        128, 3)[..., :1000, :1000] > 0)


@pytest.mark.parametrize("head_dim, backend, tile", [(64, "sm90", (128, 128)),
                                                     (192, "sm90", (128, 64)),
                                                     (256, "sm90", (128, 64)),
                                                     (128, "sm90", (128, 128)),
                                                     (64, "sm80", (128, 64)),
                                                     (128, "tma", (128, 64))])
def test_block_mask_tiles_fit_its_blocks(launches, monkeypatch, head_dim, backend, tile):
    """A block-sparse call runs a tile whose rows and keys lie inside the mask's blocks of 128
    (the wgmma kernel's 192 x 128 at head_dim 64, 128 x 112 at 192 and 128 x 80 at 256 would
    straddle them), and then, where tiles inside full blocks skip it, the mask_mod as it is."""
    from cute_fa.mods import block_mask

    monkeypatch.setattr(block_mask, "WHOLE_TILES", True)
    recorded, _ = launches
    torch_mask, _ = hand_built(heads=4)
    q, k, v = qkv(b=1, d=head_dim)
    cute_fa.forward(q, k, v, block_mask=torch_mask, backend=backend)
    (key, args), = recorded
    assert (key.tile.block_m, key.tile.block_n) == tile
    assert key.mask_mod.root.op == "ge" and not key.mask_mod.captures
    counts, indices = named_arguments(key, args)["score_tensors"]
    assert counts.shape == (1, 4, -(-1000 // tile[0]))


def test_block_mask_without_whole_tiles_reads_the_kinds(launches, monkeypatch):
    """Where tiles inside full blocks run the mask_mod (`block_mask.WHOLE_TILES` off), a full
    block's scores would follow the mask_mod: the kernel reads the blocks' kinds, on a tile
    that fits the blocks too; a mask without a mask_mod needs no kinds."""
    from cute_fa.mods import block_mask
    from cute_fa.mods.block_mask import exact_mask_mod, from_torch
    from cute_fa.mods.trace import trace_mask_mod

    monkeypatch.setattr(block_mask, "WHOLE_TILES", False)
    recorded, _ = launches
    torch_mask, _ = hand_built(heads=4)
    cute_fa.forward(*qkv(b=1, d=128), block_mask=torch_mask, backend="sm90")
    (key, args), = recorded
    bm = from_torch(torch_mask)
    assert (key.tile.block_m, key.tile.block_n) == (128, 128)
    assert key.mask_mod == exact_mask_mod(trace_mask_mod(bm.mask_mod)[0], (128, 128))
    assert named_arguments(key, args)["score_tensors"][0] is bm.block_kinds(1, 4)


def test_block_mask_of_blocks_the_tile_cannot_fit(launches, monkeypatch):
    """Blocks of 64 query rows, on the wgmma kernel (128-row tiles at least): the tile keeps
    its shape and the mask_mod becomes the blocks' kinds with it (`exact_mask_mod`), the
    kinds its last captured tensor, before the lists; the cp.async kernel's 64 x 64 tile
    fits them."""
    from cute_fa.mods import block_mask
    from cute_fa.mods.block_mask import exact_mask_mod, from_torch

    monkeypatch.setattr(block_mask, "WHOLE_TILES", True)
    recorded, _ = launches
    torch_mask, _ = hand_built(block=64, heads=4)
    cute_fa.forward(*qkv(b=1, d=128), block_mask=torch_mask, backend="sm90")
    (key, args), = recorded
    bm = from_torch(torch_mask)
    from cute_fa.mods.trace import trace_mask_mod
    assert key.mask_mod == exact_mask_mod(trace_mask_mod(bm.mask_mod)[0], (64, 64))
    kinds, counts, indices = named_arguments(key, args)["score_tensors"]
    assert kinds is bm.block_kinds(1, 4)
    cute_fa.forward(*qkv(b=1, d=128), block_mask=torch_mask, backend="sm80")
    key80 = recorded[1][0]
    assert (key80.tile.block_m, key80.tile.block_n) == (64, 64)
    assert key80.mask_mod.root.op == "ge"


def test_torch_block_mask_without_a_mask_mod(launches):
    """torch's from_kv_blocks without a mask_mod (its noop_mask): every score of a listed
    block is kept; the kernel runs the lists and no mask_mod."""
    from torch.nn.attention.flex_attention import BlockMask as TorchBlockMask

    from cute_fa.mods.block_mask import from_torch

    recorded, _ = launches
    torch_mask, _ = hand_built(heads=4)
    bare = TorchBlockMask.from_kv_blocks(torch_mask.kv_num_blocks, torch_mask.kv_indices,
                                         torch_mask.full_kv_num_blocks,
                                         torch_mask.full_kv_indices, seq_lengths=(1000, 1000))
    assert from_torch(bare).mask_mod is None
    cute_fa.forward(*qkv(b=1), block_mask=bare)
    (key, _), = recorded
    assert key.block_sparse and key.mask_mod is None


@pytest.mark.parametrize("heads_q", [4, 6])
def test_mods_keep_the_plain_wgmma_tile(launches, heads_q):
    """head_dim 64 with a mask_mod on the wgmma kernel: the plain call's 192 x 128 tile and GQA
    packing (the faster one though it spills with mods, `tuning.mods_tile`); with a block mask
    of 128 x 128 blocks, 128 x 128, inside them."""
    from cute_fa.mods.block_mask import create_block_mask

    recorded, _ = launches
    q, k, v = qkv(b=1, hq=heads_q, hk=2, d=64)
    causal = lambda b, h, qi, kv: qi >= kv  # noqa: E731
    cute_fa.forward(q, k, v, mask_mod=causal)
    cute_fa.forward(q, k, v)
    cute_fa.forward(q, k, v, block_mask=create_block_mask(causal, 1, None, 1000, 1000))
    (key, _), (plain, _), (blocked, _) = recorded
    assert key.backend == plain.backend == "sm90" and plain.tile.block_m == 192
    assert key.tile == plain.tile and key.pack_gqa == plain.pack_gqa
    assert (blocked.tile.block_m, blocked.tile.block_n) == (128, 128)


@pytest.mark.parametrize("block", [128, 64])
def test_block_mask_backward_reads_the_kinds(launches, monkeypatch, block):
    """A block-sparse call autograd records: the forward walks the lists; the dense mma.sync
    backward (`SPARSE_BACKWARD` off) visits every key block with the mask as a mask_mod over
    the blocks' kinds (`exact_mask_mod`), the kinds its last score tensor, once (blocks of
    64: the forward's 128-row tile reads them already)."""
    from cute_fa import tuning_bwd
    from cute_fa.mods import block_mask
    from cute_fa.mods.block_mask import exact_mask_mod, from_torch
    from cute_fa.mods.trace import trace_mask_mod

    monkeypatch.setattr(block_mask, "WHOLE_TILES", True)
    monkeypatch.setattr(block_mask, "SPARSE_BACKWARD", False)
    monkeypatch.setattr(tuning_bwd, "SM90_MODS", False)
    recorded, _ = launches
    torch_mask, _ = hand_built(block=block, heads=4)
    q, k, v = (t.requires_grad_() for t in qkv(b=1, d=128))
    cute_fa.forward(q, k, v, block_mask=torch_mask, backend="sm90").sum().backward()
    bm = from_torch(torch_mask)
    exact = exact_mask_mod(trace_mask_mod(bm.mask_mod)[0], (block, block))
    forward = [(key, args) for key, args in recorded if key.backend == "sm90"]
    (fkey, fargs), = forward
    assert fkey.block_sparse and fkey.mask_mod == (exact if block == 64 else
                                                   trace_mask_mod(bm.mask_mod)[0])
    (bkey, bargs), = [(key, args) for key, args in recorded if key.backend == "bwd_sm80"]
    assert not bkey.block_sparse and bkey.mask_mod == exact
    tensors = named_arguments(bkey, bargs)["score_tensors"]
    assert len(tensors) == 1 and tensors[0] is bm.block_kinds(1, 4)
    assert q.grad is not None and k.grad is not None


@pytest.mark.parametrize("sm90_mods", [False, True])
def test_mods_backward_kernel(launches, monkeypatch, sm90_mods):
    """Which backward runs the mods: the mma.sync one, or with `tuning_bwd.SM90_MODS` the
    wgmma one, either with the score_mod, a captured tensor's gradient slot, the block mask's
    kinds and its query tile lists at the kernel's tile."""
    from cute_fa import tuning_bwd
    from cute_fa.mods import block_mask

    monkeypatch.setattr(tuning_bwd, "SM90_MODS", sm90_mods)
    monkeypatch.setattr(block_mask, "SPARSE_BACKWARD", True)
    recorded, _ = launches
    torch_mask, _ = hand_built(block=128, heads=4)
    slopes = torch.rand(4).requires_grad_()
    q, k, v = (t.requires_grad_() for t in qkv(b=1, d=128))
    cute_fa.forward(q, k, v, score_mod=lambda s, b, h, qi, kv: s + slopes[h] * (kv - qi),
                    block_mask=torch_mask, backend="sm90").sum().backward()
    (bkey, bargs), = [(key, args) for key, args in recorded if key.backend.startswith("bwd_sm")]
    assert bkey.backend == ("bwd_sm90" if sm90_mods else "bwd_sm80")
    assert bkey.score_mod is not None and bkey.mask_mod is not None
    assert bkey.capture_grads == (0,) and bkey.block_sparse
    tensors = named_arguments(bkey, bargs)["score_tensors"]
    # the slopes, the blocks' kinds, the lists' counts and indices, the slopes' gradient
    counts, listed = block_mask.from_torch(torch_mask).query_tiles(
        bkey.tile.block_m, bkey.tile.block_n, 1, 4)
    assert len(tensors) == 5 and tensors[2] is counts and tensors[3] is listed


@pytest.mark.parametrize("tile", [(128, 128), (64, 128), (128, 64)])
def test_query_tiles_are_the_key_lists_turned_around(tile):
    """`BlockMask.query_tiles` (the backward's lists): key tile j lists query tile i exactly
    where `kernel_blocks` lists j for i, ascending; every kept score's tile is listed."""
    bm = create_block_mask(document_causal, 2, None, 1000, 900, block_size=(64, 128))
    block_m, block_n = tile
    counts, indices = bm.kernel_blocks(block_m, block_n, 2, 3, whole=False)
    q_counts, q_indices = bm.query_tiles(block_m, block_n, 2, 3, whole=False)
    assert q_counts.shape == (2, 3, -(-900 // block_n))
    assert q_indices.shape == q_counts.shape + (-(-1000 // block_m),)
    # the kernels take both lists' last dimension at stride 1 (a launch of a strided one fails)
    assert q_indices.stride()[-1] == 1 and indices.stride()[-1] == 1
    kept = bm.dense()
    for b in range(2):
        for h in range(3):
            pairs = {(i, j) for i in range(counts.shape[2])
                     for j in indices[b, h, i, :counts[b, h, i]].tolist()}
            for j in range(q_counts.shape[2]):
                got = q_indices[b, h, j, :q_counts[b, h, j]].tolist()
                assert got == sorted(got) and set(got) == {i for i, jj in pairs if jj == j}
                cols = slice(j * block_n, (j + 1) * block_n)
                need = {i for i in range(counts.shape[2])
                        if kept[b, 0, i * block_m:(i + 1) * block_m, cols].any()}
                assert need <= set(got), (b, h, j)


@pytest.mark.parametrize("deterministic", [False, True])
def test_sparse_backward_walks_the_query_lists(launches, monkeypatch, deterministic):
    """With `block_mask.SPARSE_BACKWARD`, the mma.sync backward of a block mask is
    block-sparse, its score tensors the kinds, then the query tile lists at its own tile;
    deterministic (whose turns count every query block) visits every query block."""
    from cute_fa import tuning_bwd
    from cute_fa.mods import block_mask

    monkeypatch.setattr(block_mask, "SPARSE_BACKWARD", True)
    monkeypatch.setattr(block_mask, "WHOLE_TILES", True)
    monkeypatch.setattr(tuning_bwd, "SM90_MODS", False)
    recorded, _ = launches
    torch_mask, _ = hand_built(heads=4)
    q, k, v = (t.requires_grad_() for t in qkv(b=1, d=128))
    cute_fa.forward(q, k, v, block_mask=torch_mask, deterministic=deterministic).sum().backward()
    (key, args), = [(key, args) for key, args in recorded if key.backend == "bwd_sm80"]
    tensors = named_arguments(key, args)["score_tensors"]
    bm = block_mask.from_torch(torch_mask)
    assert key.block_sparse != deterministic and tensors[0] is bm.block_kinds(1, 4)
    if not deterministic:
        want = bm.query_tiles(key.tile.block_m, key.tile.block_n, 1, 4)
        assert len(tensors) == 3 and tensors[1] is want[0] and tensors[2] is want[1]
    else:
        assert len(tensors) == 1
