"""A traced attention mod as data: the expression graph that `trace.py` records from a user's
`score_mod(score, b, h, q_idx, kv_idx)` or `mask_mod(b, h, q_idx, kv_idx)`, which the float64
reference evaluates (`dense.py`). It holds no tensors and imports no torch: its `signature`
(what a kernel compiled for it depends on) names each captured tensor by its slot, dtype and
rank only, so new values in the same tensors never change it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# the value kinds a node carries, as a kernel holds them: 32-bit float, 32-bit int, predicate
FLOAT, INT, BOOL = "float", "int", "bool"

# what a node computes from its arguments' values
UNARY = ("neg", "abs", "exp", "tanh", "sigmoid", "not")
BINARY = ("add", "sub", "mul", "div", "floordiv", "mod", "minimum", "maximum",
          "lt", "le", "gt", "ge", "eq", "ne", "and", "or")
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
LEAVES = ("score", "b", "h", "q_idx", "kv_idx")


@dataclass(frozen=True)
class Capture:
    """A tensor the mod indexes: its place among the mod's captured tensors, dtype (torch's
    name, e.g. 'float32') and rank. A kernel takes it as an argument."""

    slot: int
    dtype: str
    ndim: int


@dataclass(frozen=True)
class Node:
    """One value of the mod: a leaf (`LEAVES`: the score and the four indices), a constant
    (`value`), an operation of `UNARY` or `BINARY` on `args`, `where` (cond, a, b), or `load`
    (an element of capture `value`, args its indices, one per dimension). kind: `FLOAT`,
    `INT` or `BOOL`."""

    op: str
    kind: str
    args: tuple = ()
    value: object = None

    @property
    def operand_kind(self) -> str:
        """The kind a binary node computes in: float if an operand is (or for `div`), else
        its operands' (comparisons then give bool, the others that kind)."""
        kinds = {a.kind for a in self.args}
        return FLOAT if FLOAT in kinds or self.op == "div" else self.args[0].kind

    def key(self) -> tuple:
        """The node as nested tuples of plain values (equal for equal graphs)."""
        return (self.op, self.kind, self.value, tuple(a.key() for a in self.args))


@dataclass(frozen=True)
class ModGraph:
    """A traced mod: which function it is ('score_mod' or 'mask_mod'), its result and the
    tensors it captures, in slot order."""

    role: str
    root: Node
    captures: tuple = ()

    def signature(self) -> str:
        """A digest of the graph and the captures' dtypes and ranks: what a kernel compiled
        for this mod depends on (the captures' values and shapes are its arguments)."""
        text = repr((self.role, self.root.key(), self.captures))
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def nodes(self) -> list:
        """Every distinct node, each after its arguments (the order a kernel emits them)."""
        return ordered((self.root,))

    def uses(self, leaf: str) -> bool:
        """Whether the mod reads `leaf` ('score', 'b', 'h', 'q_idx' or 'kv_idx')."""
        return reads((self.root,), leaf)


def ordered(roots) -> list:
    """Every distinct node the values `roots` need, each after its arguments, roots in turn:
    the order a kernel emits them (`ModGraph.nodes`; a load's indices alone)."""
    seen, order = set(), []

    def visit(node):
        if node in seen:
            return
        for arg in node.args:
            visit(arg)
        seen.add(node)
        order.append(node)
    for root in roots:
        visit(root)
    return order


def reads(roots, leaf: str) -> bool:
    """Whether the values `roots` depend on `leaf` ('score', 'b', 'h', 'q_idx' or 'kv_idx')."""
    return any(n.op == leaf for n in ordered(roots))


def scaled_score(graphs: tuple) -> tuple:
    """(c, the graphs rewritten) where every use of the score in `graphs` (score_mods: a mod
    and its derivatives; None skipped) is score * c, c * score or score / c for one constant
    c: each such product is then the score itself, which a kernel forms as S * (scale * c),
    one multiply a score where it took two (softcap * tanh(score / softcap)). (1.0, graphs)
    where the score is used otherwise, or not at all."""
    nodes = ordered(tuple(g.root for g in graphs if g is not None))
    users = [n for n in nodes if any(a.op == "score" for a in n.args)]
    factors = {_score_factor(n) for n in users}
    if not users or None in factors or len(factors) != 1 or any(
            g is not None and g.root.op == "score" for g in graphs):
        return 1.0, graphs
    score = next(a for a in users[0].args if a.op == "score")
    made: dict = {}
    for node in nodes:
        made[node] = score if node in users else Node(
            node.op, node.kind, tuple(made[a] for a in node.args), node.value)
    return factors.pop(), tuple(
        None if g is None else ModGraph(g.role, made[g.root], g.captures) for g in graphs)


def _score_factor(node: Node) -> float | None:
    """c where node is score * c, c * score or score / c (c a nonzero constant), else None."""
    a, b = (node.args + (None, None))[:2]
    if node.op == "mul" and a is not None and b is not None:
        if a.op == "score" and b.op == "const":
            return float(b.value)
        if b.op == "score" and a.op == "const":
            return float(a.value)
    if node.op == "div" and a is not None and a.op == "score" and b is not None \
            and b.op == "const" and float(b.value) != 0.0:
        return 1.0 / float(b.value)
    return None


def root_factor(graph: ModGraph) -> tuple:
    """(c, the graph without it) where a score_mod's result is c * x or x * c for a positive
    constant c (softcap * tanh(...)): a kernel then takes x as the logit and c into its
    softmax's scale (as the built-in softcap takes its softcap), a multiply a score fewer;
    (1.0, graph) otherwise. A positive c keeps a masked -inf where it is."""
    root = graph.root
    if root.op == "mul" and root.kind == FLOAT:
        for i in (0, 1):
            c, x = root.args[i], root.args[1 - i]
            if c.op == "const" and x.kind == FLOAT and 0.0 < float(c.value) < float("inf"):
                return float(c.value), ModGraph(graph.role, x, graph.captures)
    return 1.0, graph
