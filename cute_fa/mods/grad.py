"""The derivative of a traced score_mod with respect to its score: another `ModGraph` of the same
leaves and captures (`score_derivative`), which a backward kernel runs next to the mod itself,
since dL/dS = P (dP - D) * score_mod'(S * scale) * scale. Forward-mode, node by node; integer
and bool values and captured tensors are constants with respect to the score, and so is a
piecewise-constant operation's result (its derivative is 0 almost everywhere)."""

from __future__ import annotations

from .graph import BOOL, FLOAT, ModGraph, Node

_ZERO, _ONE = Node("const", FLOAT, value=0.0), Node("const", FLOAT, value=1.0)


def _node(op: str, *args: Node) -> Node:
    return Node(op, FLOAT, tuple(args))


def _times(a: Node, b: Node | None) -> Node | None:
    return None if b is None else _node("mul", a, b)


def _sum(op: str, a: Node | None, b: Node | None) -> Node | None:
    if a is None and b is None:
        return None
    if b is None:
        return a
    if a is None:
        return b if op == "add" else _node("neg", b)
    return _node(op, a, b)


def _rule(node: Node, d: dict) -> Node | None:
    """d(node)/d(score) from its arguments' derivatives `d` (None: 0)."""
    op, args = node.op, node.args
    if op == "score":
        return _ONE
    if node.kind != FLOAT or op in ("const", "load", "b", "h", "q_idx", "kv_idx"):
        return None
    da = [d.get(a) for a in args]
    if op in ("add", "sub"):
        return _sum(op, *da)
    if op == "mul":
        return _sum("add", _times(args[1], da[0]), _times(args[0], da[1]))
    if op == "div":  # (a' b - a b') / b^2
        a, b = args
        top = _sum("sub", _times(b, da[0]), _times(a, da[1]))
        return None if top is None else _node("div", top, _node("mul", b, b))
    if op == "neg":
        return None if da[0] is None else _node("neg", da[0])
    if op == "abs":
        return None if da[0] is None else Node(
            "where", FLOAT, (Node("lt", BOOL, (args[0], _ZERO)), _node("neg", da[0]), da[0]))
    if op == "exp":
        return _times(node, da[0])
    if op == "tanh":  # 1 - tanh^2
        return _times(_node("sub", _ONE, _node("mul", node, node)), da[0])
    if op == "sigmoid":  # s (1 - s)
        return _times(_node("mul", node, _node("sub", _ONE, node)), da[0])
    if op == "where":
        cond, (db, dc) = args[0], da[1:]
        if db is None and dc is None:
            return None
        return Node("where", FLOAT, (cond, db or _ZERO, dc or _ZERO))
    if op in ("minimum", "maximum"):  # the derivative of the operand taken
        a, b = args
        if da[0] is None and da[1] is None:
            return None
        takes_b = Node("lt" if op == "minimum" else "gt", BOOL, (b, a))
        return Node("where", FLOAT, (takes_b, da[1] or _ZERO, da[0] or _ZERO))
    if op in ("floordiv", "mod"):  # integers only (the tracer refuses float // and %)
        return None
    raise ValueError(f"no derivative rule for {op!r}")


def score_derivative(graph: ModGraph) -> ModGraph:
    """d score_mod / d score as a graph: same role ('score_mod'), leaves and captures."""
    if graph.role != "score_mod":
        raise ValueError(f"a derivative with respect to the score needs a score_mod, got a "
                         f"{graph.role}")
    d: dict = {}
    for node in graph.nodes():
        value = _rule(node, d)
        if value is not None:
            d[node] = value
    return ModGraph("score_mod", d.get(graph.root, _ZERO), graph.captures)
