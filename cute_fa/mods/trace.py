"""Tracing a user's attention mod into a `graph.ModGraph`: the function runs once on stand-ins
for the score and the indices (`Traced`), which record every operation. The vocabulary is
FlexAttention's common one: arithmetic, comparisons, `torch.where`, abs, exp, tanh, sigmoid,
`torch.minimum`/`maximum`/`clamp`, integer `//` and `%`, `&`, `|`, `~`, and indexing captured
tensors by traced indices. Anything else raises a TypeError naming the operation, at the
trace, before any kernel exists. Python numbers in the function become constants of the graph;
captured tensors become its arguments."""

from __future__ import annotations

import torch

from .graph import BOOL, FLOAT, INT, LEAVES, Capture, ModGraph, Node

LOADABLE = {torch.float32: FLOAT, torch.float16: FLOAT, torch.bfloat16: FLOAT,
            torch.int32: INT, torch.int64: INT, torch.bool: BOOL}
VOCABULARY = ("+ - * / // % unary -, comparisons, & | ~, abs(), torch.where, torch.exp, "
              "torch.tanh, torch.sigmoid, torch.abs, torch.minimum, torch.maximum, torch.clamp, "
              "captured_tensor[index, ...]")
INT32 = (-2 ** 31, 2 ** 31 - 1)


class Trace:
    """One tracing: the mod's role ('score_mod' or 'mask_mod') and the tensors it captured,
    by identity, in the order it first indexed them."""

    def __init__(self, role: str):
        self.role = role
        self.tensors: list = []

    def fail(self, what: str):
        raise TypeError(f"{self.role}: {what} cannot be compiled into an attention kernel; "
                        f"a mod may use {VOCABULARY}")

    def captures(self) -> tuple:
        """A `Capture` per tensor indexed, in slot order (one the result does not read keeps
        its slot, so that slots stay the captured tensors' places)."""
        return tuple(Capture(slot, str(t.dtype).removeprefix("torch."), t.ndim)
                     for slot, t in enumerate(self.tensors))

    def const(self, value) -> Node:
        if isinstance(value, bool):
            return Node("const", BOOL, value=value)
        if isinstance(value, int):
            if not INT32[0] <= value <= INT32[1]:
                self.fail(f"the integer {value} (outside int32)")
            return Node("const", INT, value=value)
        if isinstance(value, float):
            return Node("const", FLOAT, value=value)
        if isinstance(value, torch.Tensor):
            if value.ndim == 0:
                return self.load(value, ())
            self.fail(f"a captured tensor of shape {tuple(value.shape)} used whole (index "
                      f"every dimension, e.g. bias[h, q_idx])")
        self.fail(f"a value of type {type(value).__name__}")

    def node(self, value) -> Node:
        return value.node if isinstance(value, Traced) else self.const(value)

    def load(self, tensor: torch.Tensor, index) -> Node:
        """tensor[index]: one element, each dimension indexed by a traced integer or an int."""
        if tensor.dtype not in LOADABLE:
            self.fail(f"indexing a {tensor.dtype} tensor (convert it to float32, float16, "
                      f"bfloat16, int32, int64 or bool)")
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != tensor.ndim:
            self.fail(f"indexing a {tensor.ndim}-d captured tensor with {len(index)} "
                      f"index(es) (index every dimension, to one element)")
        nodes = []
        for i in index:
            if not isinstance(i, (Traced, int)) or isinstance(i, bool):
                self.fail(f"a captured tensor indexed by a {type(i).__name__} (only traced "
                          f"integers and ints: no slices, None, ... or tensors)")
            n = self.node(i)
            if n.kind != INT:
                self.fail(f"a captured tensor indexed by a {n.kind} value")
            nodes.append(n)
        slot = next((s for s, t in enumerate(self.tensors) if t is tensor), None)
        if slot is None:
            slot = len(self.tensors)
            self.tensors.append(tensor)
        return Node("load", LOADABLE[tensor.dtype], tuple(nodes), self.captures()[slot])

    def unary(self, op: str, x) -> "Traced":
        a = self.node(x)
        if op == "not":
            if a.kind != BOOL:
                self.fail(f"~ of a {a.kind} value (~ negates a mask)")
            return Traced(self, Node(op, BOOL, (a,)))
        if a.kind == BOOL:
            self.fail(f"{op} of a bool value (use torch.where)")
        kind = FLOAT if op in ("exp", "tanh", "sigmoid") else a.kind
        return Traced(self, Node(op, kind, (a,)))

    def binary(self, op: str, x, y) -> "Traced":
        a, b = self.node(x), self.node(y)
        kinds = {a.kind, b.kind}
        if op in ("and", "or"):
            if kinds != {BOOL}:
                self.fail(f"{'&' if op == 'and' else '|'} of {a.kind} and {b.kind} values "
                          f"(& and | combine masks)")
            return Traced(self, Node(op, BOOL, (a, b)))
        if BOOL in kinds:
            self.fail(f"{op} with a bool value (use torch.where)")
        if op in ("lt", "le", "gt", "ge", "eq", "ne"):
            return Traced(self, Node(op, BOOL, (a, b)))
        if op in ("floordiv", "mod") and kinds != {INT}:
            self.fail(f"{'//' if op == 'floordiv' else '%'} of a float value (integers only)")
        kind = FLOAT if op == "div" or FLOAT in kinds else INT
        return Traced(self, Node(op, kind, (a, b)))

    def where(self, cond, x, y) -> "Traced":
        c, a, b = self.node(cond), self.node(x), self.node(y)
        if c.kind != BOOL:
            self.fail(f"torch.where on a {c.kind} condition")
        kinds = {a.kind, b.kind}
        if BOOL in kinds and kinds != {BOOL}:
            self.fail("torch.where choosing between a bool and a number")
        kind = BOOL if kinds == {BOOL} else FLOAT if FLOAT in kinds else INT
        return Traced(self, Node("where", kind, (c, a, b)))


_UNARY_FUNCTIONS = {torch.exp: "exp", torch.tanh: "tanh", torch.sigmoid: "sigmoid",
                    torch.abs: "abs", torch.neg: "neg", torch.Tensor.__neg__: "neg",
                    torch.Tensor.__abs__: "abs", torch.Tensor.abs: "abs", torch.Tensor.exp: "exp",
                    torch.Tensor.tanh: "tanh", torch.Tensor.sigmoid: "sigmoid",
                    torch.Tensor.__invert__: "not", torch.logical_not: "not"}
_BINARY_FUNCTIONS = {torch.minimum: "minimum", torch.maximum: "maximum", torch.add: "add",
                     torch.sub: "sub", torch.mul: "mul", torch.div: "div",
                     torch.logical_and: "and", torch.logical_or: "or"}
# Tensor operators with a traced operand: (op, whether the operands come reversed)
_TENSOR_OPERATORS = {}
for _name, _op in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"),
                   ("floordiv", "floordiv"), ("mod", "mod"), ("and", "and"), ("or", "or")):
    _TENSOR_OPERATORS[getattr(torch.Tensor, f"__{_name}__")] = (_op, False)
    _TENSOR_OPERATORS[getattr(torch.Tensor, f"__r{_name}__")] = (_op, True)
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    _TENSOR_OPERATORS[getattr(torch.Tensor, f"__{_name}__")] = (_name, False)


class Traced:
    """A traced value: its node, and the tracing that records what is done with it. Python
    operators (the binary ones are set after the class, `_operator`) and the torch functions
    of the vocabulary build new nodes; converting it to a Python bool or number (if/and/or,
    min()/max(), math.*) raises."""

    def __init__(self, trace: Trace, node: Node):
        self.trace = trace
        self.node = node

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        trace = _trace_in((args, tuple(kwargs.values())))
        name = getattr(func, "__name__", str(func))
        if func is torch.Tensor.__getitem__:
            return Traced(trace, trace.load(args[0], args[1]))
        if func is torch.where and len(args) == 3 and not kwargs:
            return trace.where(*args)
        if func is torch.clamp or func is torch.Tensor.clamp:
            x, low, high = (list(args) + [None, None])[:3]
            low, high = kwargs.get("min", low), kwargs.get("max", high)
            out = x
            out = out if low is None else trace.binary("maximum", out, low)
            return out if high is None else trace.binary("minimum", out, high)
        if not kwargs and len(args) == 1 and func in _UNARY_FUNCTIONS:
            return trace.unary(_UNARY_FUNCTIONS[func], args[0])
        if not kwargs and len(args) == 2 and func in _BINARY_FUNCTIONS:
            return trace.binary(_BINARY_FUNCTIONS[func], *args)
        if func in (torch.max, torch.min) and not kwargs and len(args) == 2:
            return trace.binary("maximum" if func is torch.max else "minimum", *args)
        if not kwargs and len(args) == 2 and func in _TENSOR_OPERATORS:
            op, reversed_ = _TENSOR_OPERATORS[func]
            a, b = (args[1], args[0]) if reversed_ else args
            return trace.binary(op, a, b)
        trace.fail(f"torch.{name}" + (" with keyword arguments" if kwargs else ""))

    __hash__ = None  # == builds a node: a traced value is no dict key

    def __neg__(self):
        return self.trace.unary("neg", self)

    def __abs__(self):
        return self.trace.unary("abs", self)

    def __invert__(self):
        return self.trace.unary("not", self)

    def exp(self):
        return self.trace.unary("exp", self)

    def tanh(self):
        return self.trace.unary("tanh", self)

    def sigmoid(self):
        return self.trace.unary("sigmoid", self)

    def abs(self):
        return self.trace.unary("abs", self)

    def __bool__(self):
        self.trace.fail("Python control flow on a traced value (if, and, or, not, min(), "
                        "max(); use torch.where, &, |, ~, torch.minimum)")

    def _number(self):
        self.trace.fail("converting a traced value to a Python number (float(), int(), "
                        "math.*)")

    __float__ = __int__ = __index__ = __complex__ = _number

    def _unsupported(name):
        def method(self, *args, **kwargs):
            self.trace.fail(f"the operator {name}")
        return method

    __pow__ = __rpow__ = _unsupported("**")
    __matmul__ = __rmatmul__ = _unsupported("@")
    __xor__ = __rxor__ = _unsupported("^")
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _unsupported("<< / >>")
    del _unsupported

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        self.trace.fail(f"the method .{name}()")


def _operator(op: str, reflected: bool = False):
    """A Traced operator method building `op` (reflected: the traced value on the right)."""
    def method(self, other):
        return self.trace.binary(op, other, self) if reflected else \
            self.trace.binary(op, self, other)
    return method


for _name, _op in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"),
                   ("floordiv", "floordiv"), ("mod", "mod"), ("and", "and"), ("or", "or")):
    setattr(Traced, f"__{_name}__", _operator(_op))
    setattr(Traced, f"__r{_name}__", _operator(_op, reflected=True))
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):  # Python reflects comparisons itself
    setattr(Traced, f"__{_name}__", _operator(_name))


def _trace_in(values):
    """The tracing of the first traced value in `values` (nested tuples and lists: an index)."""
    for value in values:
        if isinstance(value, Traced):
            return value.trace
        if isinstance(value, (tuple, list)):
            found = _trace_in(value)
            if found is not None:
                return found
    return None


def _traced(role: str, fn, leaves) -> tuple:
    trace = Trace(role)
    kinds = {"score": FLOAT}
    args = [Traced(trace, Node(leaf, kinds.get(leaf, INT))) for leaf in leaves]
    result = trace.node(fn(*args))
    return trace, result


def trace_score_mod(fn) -> tuple:
    """(ModGraph, captured tensors) of `score_mod(score, b, h, q_idx, kv_idx) -> score`."""
    trace, result = _traced("score_mod", fn, LEAVES)
    if result.kind == BOOL:
        trace.fail("returning a bool (a mask is a mask_mod's)")
    return ModGraph("score_mod", result, trace.captures()), tuple(trace.tensors)


def trace_mask_mod(fn) -> tuple:
    """(ModGraph, captured tensors) of `mask_mod(b, h, q_idx, kv_idx) -> bool`."""
    trace, result = _traced("mask_mod", fn, LEAVES[1:])
    if result.kind != BOOL:
        trace.fail(f"returning a {result.kind} value (a mask_mod returns a bool)")
    return ModGraph("mask_mod", result, trace.captures()), tuple(trace.tensors)
