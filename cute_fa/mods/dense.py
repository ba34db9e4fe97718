"""A traced mod evaluated densely on torch tensors, in float64 (integers in int64): the
reference the kernels' mods are checked against. Its semantics are torch's, which
FlexAttention's eager mods have: `//` and `%` round toward minus infinity, `/` is true
division."""

from __future__ import annotations

import torch

from .graph import BOOL, FLOAT, INT, ModGraph

_DTYPES = {FLOAT: torch.float64, INT: torch.int64, BOOL: torch.bool}
_UNARY = {"neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "tanh": torch.tanh,
          "sigmoid": torch.sigmoid, "not": torch.logical_not}
_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
           "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
           "mod": torch.remainder, "minimum": torch.minimum, "maximum": torch.maximum,
           "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq,
           "ne": torch.ne, "and": torch.logical_and, "or": torch.logical_or}


def index_grid(batch, heads, queries, keys, device=None) -> dict:
    """b, h, q_idx and kv_idx broadcast against each other over (batch, heads, queries,
    keys): each an arange of that count (or the given 1-D tensor) along its own dimension."""
    b, h, q, kv = (torch.arange(n, device=device) if isinstance(n, int) else n
                   for n in (batch, heads, queries, keys))
    return dict(b=b[:, None, None, None], h=h[None, :, None, None],
                q_idx=q[None, None, :, None], kv_idx=kv[None, None, None, :])


def evaluate(graph: ModGraph, captured: tuple, *, b, h, q_idx, kv_idx, score=None):
    """The mod's value for every broadcast combination of `b`, `h`, `q_idx`, `kv_idx`
    (integer tensors) and `score` (the score_mod's input scores), with its captured tensors
    `captured` (as `trace.trace_score_mod` / `trace_mask_mod` returned them): float64 for a
    score_mod, bool for a mask_mod."""
    leaves = dict(b=b, h=h, q_idx=q_idx, kv_idx=kv_idx, score=score)
    values = {}
    for node in graph.nodes():
        if node.op in leaves:
            if leaves[node.op] is None:
                raise ValueError(f"the {graph.role} reads {node.op}: pass it")
            value = leaves[node.op]
        elif node.op == "const":
            value = torch.tensor(node.value, dtype=_DTYPES[node.kind])
        elif node.op == "load":
            index = tuple(values[a].to(torch.int64) for a in node.args)
            value = captured[node.value.slot][index] if index else captured[node.value.slot]
        else:
            args = [values[a] for a in node.args]
            if node.op == "where":
                value = torch.where(*args)
            elif node.op in _UNARY:
                value = _UNARY[node.op](args[0].to(_DTYPES[node.kind]))
            else:
                value = _BINARY[node.op](*(a.to(_DTYPES[node.operand_kind]) for a in args))
        values[node] = value.to(_DTYPES[node.kind])
    out = values[graph.root]
    return out.to(torch.float64) if graph.role == "score_mod" else out
