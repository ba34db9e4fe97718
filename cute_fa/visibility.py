"""Which keys a query may see: the one rule shared by the kernels, the float64 reference and
the introspection. Plain integer arithmetic with no DSL import, so it runs on Python ints,
numpy arrays and DSL Int32 values inside a kernel alike.

causal_offset = Sk - Sq aligns the bottom-right corner (flash-attn's causal);
causal_offset = 0 is the top-left alignment of torch SDPA (docs/walkthrough.md §8).
"""


def last_visible_key(query, causal_offset):
    """Under causal masking, query `query` sees keys 0 .. query + causal_offset."""
    return query + causal_offset


def key_visible(query, key, *, causal: bool, causal_offset=0):
    """True where key `key` contributes to query `query` (global positions)."""
    if not causal:
        return True
    return key <= last_visible_key(query, causal_offset)
