"""Block masks (`cute_fa.mods.block_mask`) against torch's FlexAttention on the CPU: the same
counts and indices as torch's `create_block_mask` (tails, broadcast batch and heads, unequal
block sizes, captured tables), a dense view that is the mask itself, torch's block masks
converted, and the float64 reference with a block mask against `flex_attention`."""

import pytest

torch = pytest.importorskip("torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention")

from cute_fa.mods.block_mask import create_block_mask, from_torch  # noqa: E402
from test_mods_trace import DOCS, MASKS, PREFIX  # noqa: E402

# (mask name, batch, heads, seqlen_q, seqlen_k, block size); DOCS is (2, 53)
CASES = [("causal", 2, 3, 700, 650, 128), ("sliding_window", None, None, 512, 512, 128),
         ("prefix_lm", 1, 2, 300, 1000, 64), ("block_diagonal", 2, 1, 257, 130, (32, 64)),
         ("document", 2, 2, 37, 53, 16), ("prefix_lm_per_entry", 2, 1, 90, 90, 32),
         ("dilated_where", 1, 4, 100, 100, (16, 32))]


def _fields(mask):
    return (mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks, mask.full_kv_indices)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_block_mask_is_torchs(case):
    name, b, h, sq, sk, bs = case
    ours = create_block_mask(MASKS[name], b, h, sq, sk, block_size=bs)
    theirs = flex.create_block_mask(MASKS[name], b, h, sq, sk, device="cpu", BLOCK_SIZE=bs)
    for mine, torchs in zip(_fields(ours), _fields(theirs)):
        assert mine.dtype == torch.int32 and torch.equal(mine, torchs)
    converted = from_torch(theirs)
    assert all(torch.equal(x, y) for x, y in zip(_fields(converted), _fields(ours)))
    # the dense view: the mask itself inside the sequences
    idx = [torch.arange(n)[shape] for n, shape in ((b or 1, (slice(None), None, None, None)),
                                                 (h or 1, (None, slice(None), None, None)),
                                                 (sq, (None, None, slice(None), None)),
                                                 (sk, (None, None, None, slice(None))))]
    expected = MASKS[name](*idx).expand(b or 1, h or 1, sq, sk)
    assert torch.equal(ours.dense(), expected) and torch.equal(converted.dense(), expected)


def test_reference_with_block_mask_matches_flex_attention():
    """A block mask whose partial blocks evaluate a document mask and whose skipped blocks are
    dropped whole: the float64 reference against `flex_attention` on the same mask."""
    from cute_fa.mods.reference import attention

    def mask_mod(b, h, q, kv):
        return (DOCS[b, q] == DOCS[b, kv]) | (kv < PREFIX[b])

    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 37, 4, 16, generator=gen)
    k, v = (torch.randn(2, 53, 2, 16, generator=gen) for _ in range(2))
    theirs = flex.create_block_mask(mask_mod, 2, 4, 37, 53, device="cpu", BLOCK_SIZE=16)
    fo = flex.flex_attention(*(t.transpose(1, 2) for t in (q, k, v)), block_mask=theirs,
                             enable_gqa=True).transpose(1, 2)
    for mask in (create_block_mask(mask_mod, 2, 4, 37, 53, block_size=16), from_torch(theirs)):
        o, _ = attention(q, k, v, block_mask=mask)
        assert torch.allclose(o.float(), fo, atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="not both"):
        attention(q, k, v, mask_mod=mask_mod, block_mask=mask)
