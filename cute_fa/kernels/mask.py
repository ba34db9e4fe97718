"""Which keys a query may see. Shared by the kernels and the host introspection.

The predicate is plain integer arithmetic, so the same function runs on Python
ints (introspection, tests) and on DSL Int32 values inside a kernel.

causal_offset = Sk - Sq aligns the bottom-right corner (flash-attn's causal);
causal_offset = 0 is the top-left alignment of the walkthrough and of torch SDPA.
"""


def key_visible(query, key, *, causal: bool, causal_offset=0):
    """True where key `key` contributes to query `query` (global positions)."""
    if not causal:
        return True
    return key <= query + causal_offset
