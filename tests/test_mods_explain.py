"""`cute_fa.explain` for mods: the values a mod computes in one thread's score registers, read off
the same S layout as the kernels' (`FlashLayouts.mod_values`), agree with the layout's own causal
rule and with the dense evaluation; a block mask's picture shows its own classification."""

import pytest

torch = pytest.importorskip("torch")

from cute_fa.explain import FlashLayouts  # noqa: E402
from cute_fa.explain.figures import block_mask_codes, block_mask_map  # noqa: E402
from test_mods_trace import MASKS, SCORES  # noqa: E402


@pytest.mark.parametrize("tid", [0, 5, 37, 127])
@pytest.mark.parametrize("m_block, n_block", [(0, 0), (1, 0), (2, 3)])
def test_causal_mask_mod_is_the_layouts_causal_rule(tid, m_block, n_block):
    fl = FlashLayouts()
    kept = fl.mod_values(tid, mask_mod=MASKS["causal"], m_block=m_block, n_block=n_block)
    rule = fl.causal_keep(tid, m_block, n_block)
    assert set(kept) == set(rule)
    for q, pairs in kept.items():
        assert [k for k, keep in pairs if keep] == rule[q]
        assert len(pairs) == len(fl.s_rowcol(tid)[0][1])


def test_score_mod_values_per_register():
    """ALiBi at b=1, h=3 on a tile's scores: each register's value is the score plus its
    head's slope times (key - query), at the (query, key) the S layout gives that register."""
    from test_mods_trace import SLOPES

    fl = FlashLayouts()
    gen = torch.Generator().manual_seed(2)
    scores = torch.randn(64, 64, generator=gen, dtype=torch.float64)
    got = fl.mod_values(9, score_mod=SCORES["alibi"], m_block=1, n_block=2, b=1, h=3,
                        scores=scores.tolist())
    coords = fl.s_rowcol(9)
    assert len(got) == len(coords)
    for row, cols in coords:
        q = 64 + row
        for col, (key, value) in zip(cols, got[q]):
            assert key == 128 + col
            expected = scores[row, col].item() + SLOPES[3].double().item() * (key - q)
            assert value == pytest.approx(expected, rel=1e-12, abs=1e-12)
    with pytest.raises(ValueError, match="one of"):
        fl.mod_values(0)


def test_block_mask_picture_shows_its_classification():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from cute_fa.mods.block_mask import create_block_mask

    mask = create_block_mask(MASKS["causal"], 1, 1, 300, 300, block_size=32)
    codes = block_mask_codes(mask)
    # each block's kind from the mask itself: full where every position of a whole block is
    # kept (the tail blocks, 12 rows or keys, are never full), partial where some are
    q = torch.arange(300)[:, None]
    kv = torch.arange(300)[None, :]
    keep = MASKS["causal"](None, None, q, kv)
    for m in range(codes.shape[0]):
        for n in range(codes.shape[1]):
            block = keep[32 * m:32 * (m + 1), 32 * n:32 * (n + 1)]
            full = block.all() and block.shape == (32, 32)
            expected = 2 if full else 1 if block.any() else 0
            assert codes[m, n] == expected, (m, n)
    assert set(codes.flatten().tolist()) == {0, 1, 2}
    ax = block_mask_map(mask)
    assert (ax.images[0].get_array() == codes).all()
