"""Which keys a query may see: the one rule shared by the kernels, the float64 reference and
the introspection. Plain integer arithmetic with no DSL import, so it runs on Python ints,
numpy arrays and DSL Int32 values inside a kernel alike.

causal_offset = Sk - Sq aligns the bottom-right corner (flash-attn's causal);
causal_offset = 0 is the top-left alignment of torch SDPA (docs/walkthrough.md §8).

A sliding window (flash-attn's window_size = (left, right), -1 for an unbounded side) moves
the edges: query i sees keys i + causal_offset - left ... i + causal_offset + right; causal
is right = 0. The kernels take an upper edge as causal masking with causal_offset + right,
and a lower edge as `first_visible_key` with window_offset = causal_offset - left.
"""


def last_visible_key(query, causal_offset):
    """Under causal masking, query `query` sees keys 0 .. query + causal_offset."""
    return query + causal_offset


def first_visible_key(query, window_offset):
    """Under a window with a lower edge, query `query` sees keys from query + window_offset."""
    return query + window_offset


def first_query_seeing(key, causal_offset):
    """Under causal masking, key `key` is seen by queries from key - causal_offset on (the
    inverse of `last_visible_key`: what the backward's transposed tiles mask by)."""
    return key - causal_offset


def last_query_seeing(key, window_offset):
    """Under a window's lower edge, key `key` is seen by queries up to key - window_offset (the
    inverse of `first_visible_key`)."""
    return key - window_offset


def key_visible(query, key, *, causal: bool, causal_offset=0, window_size=(-1, -1)):
    """True where key `key` contributes to query `query` (global positions). causal (bottom-
    right by causal_offset) is window_size's right side 0; window_size = (left, right)
    bounds the keys to query + causal_offset - left ... query + causal_offset + right."""
    left, right = window_size
    if causal:
        right = 0
    visible = True
    if right >= 0:
        visible = key <= last_visible_key(query, causal_offset + right)
    if left >= 0:
        visible = visible & (key >= first_visible_key(query, causal_offset - left))
    return visible
