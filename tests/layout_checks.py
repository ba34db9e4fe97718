"""Checks shared by the introspection tests of both kinds of kernel (`FlashLayouts` for the
mma.sync kernels, `WgmmaLayouts` for the wgmma one): both answer s_coords / o_coords per
thread over their `config`."""

from collections import Counter


def assert_s_and_o_owned_once(lay) -> None:
    """Every (query, key) of the S tile and every (query, d) of the O tile is held by exactly
    one thread."""
    c = lay.config
    s = Counter(x for t in range(c.num_threads) for x in lay.s_coords(t))
    assert set(s) == {(q, k) for q in range(c.block_m) for k in range(c.block_n)}
    assert set(s.values()) == {1}
    o = Counter(x for t in range(c.num_threads) for x in lay.o_coords(t))
    assert set(o) == {(q, d) for q in range(c.block_m) for d in range(c.head_dim_padded)}
    assert set(o.values()) == {1}
