"""A traced attention mod (`cute_fa.mods.graph.ModGraph`) as device code: each node one or a few
DSL operations on 32-bit values, traced into the kernel that holds the score element. Integer
`//` and `%` round toward minus infinity, as torch's (the reference's): the DSL's `//` is
already a floor division, its `%` keeps the dividend's sign and is corrected here."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from ...mods.graph import BOOL, COMPARISONS, FLOAT, INT, LEAVES

_CAST = {FLOAT: cutlass.Float32, INT: cutlass.Int32, BOOL: cutlass.Boolean}


def _floor_mod(a, b):
    """a % b with the divisor's sign (the DSL's remainder has the dividend's)."""
    r = a % b
    return cutlass.select_((r != 0) & ((r < 0) != (b < 0)), r + b, r)


_UNARY = {"neg": lambda a: -a, "abs": abs, "exp": cute.math.exp, "tanh": cute.math.tanh,
          "sigmoid": lambda a: 1.0 / (1.0 + cute.math.exp(-a)), "not": lambda a: ~a}
_BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "div": lambda a, b: a / b, "floordiv": lambda a, b: a // b, "mod": _floor_mod,
           "minimum": lambda a, b: cutlass.select_(b < a, b, a),
           "maximum": lambda a, b: cutlass.select_(b > a, b, a),
           "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
           "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
           "and": lambda a, b: a & b, "or": lambda a, b: a | b}


def emit(graph, leaves: dict, captured: tuple):
    """The value of `graph` at one element, traced now: `leaves` maps 'score' (Float32) and
    'b', 'h', 'q_idx', 'kv_idx' (Int32) to the element's values (only those the graph reads
    are needed); `captured` holds the kernel's tensor of each capture slot. A float result is
    a Float32, a mask's a Boolean."""
    values = {}
    for node in graph.nodes():
        if node.op in LEAVES:
            value = _CAST[node.kind](leaves[node.op])
        elif node.op == "const":
            value = _CAST[node.kind](node.value)
        elif node.op == "load":
            index = tuple(values[a] for a in node.args)
            tensor = captured[node.value.slot]
            value = _CAST[node.kind](tensor[index] if index else tensor[0])
        elif node.op == "where":
            c, a, b = (values[x] for x in node.args)
            value = cutlass.select_(c, _CAST[node.kind](a), _CAST[node.kind](b))
        elif node.op in _UNARY:
            value = _UNARY[node.op](_CAST[node.kind](values[node.args[0]]))
        else:
            a, b = (_CAST[node.operand_kind](values[x]) for x in node.args)
            value = _BINARY[node.op](a, b)
            if node.op not in COMPARISONS:
                value = _CAST[node.kind](value)
        values[node] = value
    return values[graph.root]
