"""The derivatives of a traced score_mod, each another `ModGraph` of the same leaves and captures
that a backward kernel runs next to the mod itself: with respect to its score
(`score_derivative`), since dL/dS = P (dP - D) * score_mod'(S * scale) * scale, and with
respect to each element it reads from a captured tensor that requires grad
(`capture_derivatives`), which the kernel adds into that tensor's gradient. Forward-mode,
node by node; integer and bool values are constants, each other leaf and load is a constant
with respect to the seed, and so is a piecewise-constant operation's result (its derivative
is 0 almost everywhere)."""

from __future__ import annotations

from .graph import BOOL, FLOAT, ModGraph, Node, reads

_ZERO, _ONE = Node("const", FLOAT, value=0.0), Node("const", FLOAT, value=1.0)


def _node(op: str, *args: Node) -> Node:
    return Node(op, FLOAT, tuple(args))


def _times(a: Node, b: Node | None) -> Node | None:
    return None if b is None else _product(a, b)


def _factor(node: Node) -> tuple:
    """(constant factor, the rest) of a node: c * x or x * c -> (c, x), a float constant ->
    (c, None), anything else -> (1.0, node)."""
    if node.op == "const" and node.kind == FLOAT:
        return float(node.value), None
    if node.op == "mul":
        for i in (0, 1):
            if node.args[i].op == "const" and node.args[i].kind == FLOAT:
                return float(node.args[i].value), node.args[1 - i]
    return 1.0, node


def _product(a: Node, b: Node) -> Node:
    """a * b with the constant factors of both gathered into one, folded here, and dropped
    where it is 1: the chain rule multiplies constants that float32 code could not
    reassociate (softcap * tanh(s / softcap)'s derivative would be softcap * ((1 - t^2) *
    (1 / softcap)), two multiplies a score where the built-in softcap's 1 - t^2 has none)."""
    ca, xa = _factor(a)
    cb, xb = _factor(b)
    c = ca * cb
    rest = xa if xb is None else xb if xa is None else _node("mul", xa, xb)
    if rest is None:
        return Node("const", FLOAT, value=c)
    if c == 1.0 and rest.kind == FLOAT:  # (an integer rest keeps its multiply: a cast)
        return rest
    return _node("mul", Node("const", FLOAT, value=c), rest)


def _sum(op: str, a: Node | None, b: Node | None) -> Node | None:
    if a is None and b is None:
        return None
    if b is None:
        return a
    if a is None:
        return b if op == "add" else _node("neg", b)
    return _node(op, a, b)


def _rule(node: Node, d: dict, seed: Node) -> Node | None:
    """d(node)/d(seed) from its arguments' derivatives `d` (None: 0)."""
    op, args = node.op, node.args
    if node == seed:
        return _ONE
    if node.kind != FLOAT or op in ("const", "load", "score", "b", "h", "q_idx", "kv_idx"):
        return None
    da = [d.get(a) for a in args]
    if op in ("add", "sub"):
        return _sum(op, *da)
    if op == "mul":
        return _sum("add", _times(args[1], da[0]), _times(args[0], da[1]))
    if op == "div":  # (a' b - a b') / b^2; a' / b where b is a constant
        a, b = args
        if b.op == "const" and b.kind == FLOAT and da[1] is None and float(b.value) != 0.0:
            return _times(Node("const", FLOAT, value=1.0 / float(b.value)), da[0])
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


def _derivative(graph: ModGraph, seed: Node) -> Node | None:
    """d root / d seed (a node of the graph: the score, or a load of a captured tensor), None
    where it is 0 everywhere."""
    if graph.role != "score_mod":
        raise ValueError(f"a derivative of the score needs a score_mod, got a {graph.role}")
    d: dict = {}
    for node in graph.nodes():
        value = _rule(node, d, seed)
        if value is not None:
            d[node] = value
    return d.get(graph.root)


def score_derivative(graph: ModGraph) -> ModGraph:
    """d score_mod / d score as a graph: same role ('score_mod'), leaves and captures."""
    found = _derivative(graph, Node("score", FLOAT))
    return ModGraph("score_mod", found if found is not None else _ZERO, graph.captures)


def capture_derivatives(graph: ModGraph, slots: tuple) -> tuple:
    """For a gradient of the captured tensors in `slots` (float ones): a pair (load, d
    score_mod / d load) per element the score_mod reads from them (a `load` node, its
    indices then where each score's gradient adds in), the derivative a graph of the same
    leaves and captures. dL/dtensor[i] sums, over every score whose load reads element i,
    dL/d score_mod times that derivative. A load whose value never reaches the result gives
    no pair; one indexed through the score raises (the index would have to be kept per score)."""
    pairs = []
    for node in graph.nodes():
        if node.op != "load" or node.kind != FLOAT or node.value.slot not in slots:
            continue
        if reads(node.args, "score"):
            raise ValueError(f"captured tensor {node.value.slot} of the score_mod is indexed "
                             f"through the score: its gradient is not computed")
        found = _derivative(graph, node)
        if found is not None:
            pairs.append((node, ModGraph("score_mod", found, graph.captures)))
    return tuple(pairs)
