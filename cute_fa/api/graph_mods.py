"""score_mod, mask_mod and sinks inside a graph torch.compile traces: the custom ops

    cute_fa::fwd_mods(q, k, v, captures, sinks, ...)               -> (out, lse)
    cute_fa::bwd_mods(dout, q, k, v, out, lse, captures, sinks, ...) -> [dq, dk, dv, dsinks,
                                                                         dcaptures...]

While dynamo traces a call with mods, `spec` traces the Python functions once, eagerly (the
same tracer as an eager call, so an operation outside the vocabulary raises its TypeError at
compile time), keeps their graphs here under their signatures' key (a string, what the op
takes) and finds where each captured tensor lives: a closure cell, a global, a default or a
bound method's object, or one attribute of one of those. Dynamo then reads the tensors from
there (`captures`), so they are the graph's inputs and new values in them never retrace. A
captured tensor found nowhere else (in a list, a dict) leaves the call to run eagerly behind
a graph break, as block masks and KV-cache calls do.

A process that loads a compiled graph from a cache traces the Python again first, which
fills the table before the graph runs.
"""

from __future__ import annotations

import types
from typing import Callable, Optional

import torch
from torch import Tensor

from ..runtime.call import DENSE, RAGGED
from ..runtime.device import device
from ..runtime.plan import plan
from ..runtime.run import kernel_ready, run_forward, score_tensors
from .autograd import capture_slots, scored_backward
from .checks import as_deterministic, check_forward, window_ints
from .mods import TracedMods, checked_mods, refuse_without_backward, with_mods
from .ops import forward_outputs_like

_GRAPHS: dict = {}  # key -> (score_mod graph, mask_mod graph), either None


def _path(fn: Callable, tensor) -> tuple | None:
    """Where fn reaches `tensor`: ("cell", i), ("global", name), ("default", i) or ("self",),
    then at most one attribute name; None if not there."""
    func = getattr(fn, "__func__", fn)
    names = getattr(getattr(func, "__code__", None), "co_names", ())
    places = [(("cell", i), c.cell_contents)
              for i, c in enumerate(getattr(func, "__closure__", None) or ())
              if _filled(c)]
    places += [(("global", n), func.__globals__[n]) for n in names
               if n in getattr(func, "__globals__", {})]
    places += [(("default", i), d) for i, d in enumerate(getattr(func, "__defaults__", None)
                                                         or ())]
    if hasattr(fn, "__self__"):
        places.append((("self",), fn.__self__))
    for place, obj in places:
        if obj is tensor:
            return place
    for place, obj in places:
        for name in names:
            if not isinstance(obj, torch.Tensor) and getattr(obj, name, None) is tensor:
                return place + (name,)
    return None


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


@torch._dynamo.assume_constant_result
def spec(score_mod: Callable | None, mask_mod: Callable | None) -> tuple | None:
    """(key, paths) of the call's mods, traced once while dynamo traces the call: the key of
    their graphs in this module's table, and where each captured tensor is, the score_mod's
    first (`_path`); None if one of them is nowhere `captures` can read it."""
    from ..mods.trace import trace_mask_mod, trace_score_mod

    graphs, paths = [], []
    for which, (fn, tracer) in enumerate(((score_mod, trace_score_mod),
                                          (mask_mod, trace_mask_mod))):
        if fn is None:
            graphs.append(None)
            continue
        graph, tensors = tracer(fn)
        graphs.append(graph)
        for t in tensors:
            path = _path(fn, t)
            if path is None:
                return None
            paths.append((which,) + path)
    key = "|".join(g.signature() if g is not None else "-" for g in graphs)
    _GRAPHS[key] = tuple(graphs)
    return key, tuple(paths)


def captures(score_mod: Callable | None, mask_mod: Callable | None, paths: tuple) -> list:
    """The captured tensors at `paths` (`spec`), read as the functions read them: plain
    Python, which dynamo traces into reads of the graph's inputs."""
    tensors = []
    for which, kind, *rest in paths:
        fn = score_mod if which == 0 else mask_mod
        func = getattr(fn, "__func__", fn)
        # indexing, not rest.pop(0): dynamo of torch 2.11 makes *rest a tuple
        names = rest if kind == "self" else rest[1:]
        if kind == "cell":
            obj = func.__closure__[rest[0]].cell_contents
        elif kind == "global":
            obj = func.__globals__[rest[0]]
        elif kind == "default":
            obj = func.__defaults__[rest[0]]
        else:
            obj = fn.__self__
        for name in names:
            obj = getattr(obj, name)
        tensors.append(obj)
    return tensors


def _call(q, k, v, captures, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
          mods, causal, softmax_scale, window_left, window_right, softcap, bottom_right,
          backend):
    """(call, traced mods) of an op's arguments, checked as an eager call is."""
    if mods not in _GRAPHS:
        raise RuntimeError(f"cute_fa: no mods traced under {mods!r} in this process: the graph "
                           f"was loaded without running the Python call that traces them "
                           f"(torch.compile does run it; an exported program does not)")
    score_graph, mask_graph = _GRAPHS[mods]
    ragged = cu_seqlens_q is not None
    extra = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                 max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k) if ragged \
        else dict(bottom_right=bottom_right)
    call = check_forward(RAGGED if ragged else DENSE, q, k, v, softmax_scale=softmax_scale,
                         causal=causal, return_lse=True, backend=backend,
                         window_size=(window_left, window_right), softcap=softcap, **extra)
    split = len(score_graph.captures) if score_graph is not None else 0
    traced = checked_mods((score_graph, tuple(captures[:split])),
                          (mask_graph, tuple(captures[split:])), q, softcap, sinks,
                          call.heads_q)
    return with_mods(call, traced), traced


@torch.library.custom_op("cute_fa::fwd_mods", mutates_args=(), device_types="cuda")
def fwd_mods(q: Tensor, k: Tensor, v: Tensor, captures: list[Tensor], sinks: Optional[Tensor],
             cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
             max_seqlen_q: int, max_seqlen_k: int, mods: str, causal: bool,
             softmax_scale: Optional[float], window_left: int, window_right: int,
             softcap: float, bottom_right: bool, backend: str, deterministic: bool
             ) -> tuple[Tensor, Tensor]:
    """`forward` / `forward_varlen` with the mods of key `mods` (`spec`) reading `captures`,
    and return_lse=True; deterministic is kept for the backward."""
    call, traced = _call(q, k, v, captures, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, mods, causal, softmax_scale, window_left, window_right,
                         softcap, bottom_right, backend)
    return run_forward(call, plan(call, device(call.device_index)), q, k, v,
                       cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, return_lse=True,
                       score_tensors=score_tensors(traced.captures, traced.sinks))


@fwd_mods.register_fake
def _(q, k, v, captures, sinks, cu_seqlens_q, cu_seqlens_k, *rest):
    return forward_outputs_like(q, ragged=cu_seqlens_q is not None)


@torch.library.custom_op("cute_fa::bwd_mods", mutates_args=(), device_types="cuda")
def bwd_mods(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
             captures: list[Tensor], sinks: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
             cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, mods: str,
             causal: bool, softmax_scale: Optional[float], window_left: int,
             window_right: int, softcap: float, bottom_right: bool, backend: str,
             deterministic: bool, slots: list[int]) -> list[Tensor]:
    """[dq, dk, dv, dsinks (empty without sinks), the gradient of each capture in `slots`]."""
    call, traced = _call(q, k, v, captures, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, mods, causal, softmax_scale, window_left, window_right,
                         softcap, bottom_right, backend)
    dq, dk, dv, dsinks, dcaptures = scored_backward(
        call, deterministic, kernel_ready(dout), q, k, v, out, lse, sinks, cu_seqlens_q,
        cu_seqlens_k, tuple(captures), tuple(slots))
    return [dq, dk, dv, dsinks if dsinks is not None else q.new_empty(0)] + \
        [dcaptures[i] for i in slots]


@bwd_mods.register_fake
def _(dout, q, k, v, out, lse, captures, sinks, *rest):
    slots = rest[-1]
    return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            torch.empty_like(sinks) if sinks is not None else q.new_empty(0)] + \
        [torch.empty_like(captures[i]) for i in slots]


def _setup(ctx, inputs, output):
    q, k, v, captures, sinks, cu_q, cu_k = inputs[:7]
    out, lse = output
    graph = _GRAPHS[inputs[9]][0]
    slots = list(capture_slots(graph, captures, [t.requires_grad for t in captures]))
    if slots:  # one indexed through the score raises here, while the graph is traced
        refuse_without_backward(TracedMods(graph, None, tuple(captures)))
    ctx.save_for_backward(q, k, v, out, lse, sinks, cu_q, cu_k, *captures)
    ctx.args, ctx.slots = inputs[7:], slots
    ctx.count = len(captures)
    ctx.inputs = len(inputs)  # the backward returns a gradient (or None) for each
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, _dlse):
    if dout is None:
        return (None,) * 3 + ([None] * ctx.count,) + (None,) * (ctx.inputs - 4)
    q, k, v, out, lse, sinks, cu_q, cu_k = ctx.saved_tensors[:8]
    captures = list(ctx.saved_tensors[8:])
    grads = bwd_mods(dout, q, k, v, out, lse, captures, sinks, cu_q, cu_k, *ctx.args,
                     ctx.slots)
    dcaptures = [None] * ctx.count
    for i, g in zip(ctx.slots, grads[4:]):
        dcaptures[i] = g
    dsinks = grads[3] if sinks is not None else None
    return (grads[0], grads[1], grads[2], dcaptures, dsinks) + (None,) * (ctx.inputs - 5)


fwd_mods.register_autograd(_backward, setup_context=_setup)


def attend(q, k, v, score_mod, mask_mod, sinks, causal, softmax_scale, window_size, softcap,
           bottom_right: bool, backend: str, deterministic, cu_seqlens_q=None,
           cu_seqlens_k=None, max_seqlen_q: int = 0, max_seqlen_k: int = 0):
    """(o, lse) of a call with mods or sinks that dynamo is tracing (its arguments checked),
    through `fwd_mods`; None where a captured tensor is out of the graph's reach (`spec`)."""
    for fn in (score_mod, mask_mod):
        if fn is not None and not isinstance(fn, types.MethodType):
            # A function made inside the compiled region is no constant dynamo can hand
            # `spec` (converting its cells fails inside dynamo): reading its cells breaks the
            # graph here instead, and dynamo resumes with the function made.
            fn.__closure__
    found = spec(score_mod, mask_mod)
    if found is None:
        return None
    key, paths = found
    left, right = window_ints(window_size)
    return fwd_mods(q, k, v, captures(score_mod, mask_mod, paths), sinks, cu_seqlens_q,
                    cu_seqlens_k, max_seqlen_q, max_seqlen_k, key, bool(causal),
                    softmax_scale, left, right, float(softcap), bottom_right, backend,
                    as_deterministic(deterministic))
