"""A traced attention mod (`cute_fa.mods.graph.ModGraph`) as device code: each node one or a few
DSL operations on 32-bit values, traced into the kernel that holds the score element. Integer
`//` and `%` round toward minus infinity, as torch's (the reference's): the DSL's `//` is
already a floor division, its `%` keeps the dividend's sign and is corrected here.

`apply_mods` runs a kernel's score_mod and mask_mod over one round's S accumulator: every
element, every round (a mask_mod may drop any key), before the built-in mask.
`add_capture_grads` adds the backward's gradients of the tensors a score_mod captures."""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from ...mods.graph import (BOOL, COMPARISONS, FLOAT, INT, LEAVES, ordered, reads, root_factor,
                           scaled_score)

# a captured tensor's dtype (`Capture.dtype`, torch's name) as the kernel reads it: a bool
# tensor as its bytes (torch stores a bool in one; the launch passes a uint8 view), nonzero
# being True
DTYPES = {"float32": cutlass.Float32, "float16": cutlass.Float16, "bfloat16": cutlass.BFloat16,
          "int32": cutlass.Int32, "int64": cutlass.Int64, "bool": cutlass.Uint8}
_CAST = {FLOAT: cutlass.Float32, INT: cutlass.Int32, BOOL: cutlass.Boolean}


def _floor_mod(a, b):
    """a % b with the divisor's sign (the DSL's remainder has the dividend's)."""
    r = a % b
    return cutlass.select_((r != 0) & ((r < 0) != (b < 0)), r + b, r)


# FASTMATH: exp and tanh as the hardware's approximations (ex2.approx, tanh.approx.f32:
# relative errors of about 2^-22 and 2^-11; the built-in softcap's tanh) and a division by a
# constant as a multiply. The exact ones cost a score_mod written as a softcap 2.6x the
# built-in's time (docs/perf/2026-12-06-mods/); these, 1.02x-1.03x (H100, S 4k and 16k,
# docs/perf/2026-12-07-h100-bwd-mods/), the mods' GPU tests passing against float64 and
# FlexAttention. Part of the compiled code, not of the kernel key: change it in source only.
FASTMATH = True
_UNARY = {"neg": lambda a: -a, "abs": abs,
          "exp": lambda a: cute.math.exp(a, fastmath=FASTMATH),
          "tanh": lambda a: cute.math.tanh(a, fastmath=FASTMATH),
          "sigmoid": lambda a: 1.0 / (1.0 + cute.math.exp(-a, fastmath=FASTMATH)),
          "not": lambda a: ~a}
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
    return emit_nodes(graph.nodes(), leaves, captured)[graph.root]


def emit_nodes(nodes: list, leaves: dict, captured: tuple) -> dict:
    """`emit`'s value of each of `nodes` (each after its arguments: `graph.ordered`'s
    order), by node."""
    values = {}
    for node in nodes:
        if node.op in LEAVES:
            value = _CAST[node.kind](leaves[node.op])
        elif node.op == "const":
            value = _CAST[node.kind](node.value)
        elif node.op == "load":
            index = tuple(values[a] for a in node.args)
            tensor = captured[node.value.slot]
            raw = tensor[index] if index else tensor[0]
            value = raw != 0 if node.value.dtype == "bool" else _CAST[node.kind](raw)
        elif node.op == "where":
            c, a, b = (values[x] for x in node.args)
            value = cutlass.select_(c, _CAST[node.kind](a), _CAST[node.kind](b))
        elif node.op in _UNARY:
            value = _UNARY[node.op](_CAST[node.kind](values[node.args[0]]))
        elif (FASTMATH and node.op == "div" and node.args[1].op == "const"
              and node.args[1].value != 0):
            # by a constant (softcap's score / c): one multiply, not an IEEE division
            value = _CAST[FLOAT](values[node.args[0]]) * cutlass.Float32(1.0 / node.args[1].value)
        else:
            a, b = (_CAST[node.operand_kind](values[x]) for x in node.args)
            value = _BINARY[node.op](a, b)
            if node.op not in COMPARISONS:
                value = _CAST[node.kind](value)
        values[node] = value
    return values


def logit_factor(score_mod) -> float:
    """What a kernel's softmax scale takes of the score_mod's result (`graph.root_factor`:
    `apply_mods` leaves it out of the scores), 1 without a score_mod or FASTMATH."""
    if score_mod is None or not FASTMATH:
        return 1.0
    return root_factor(score_mod)[0]


@dataclass(frozen=True)
class ModArgs:
    """What a tile's mods read besides the score: its batch entry, its (first) query head and
    the captured tensors, the score_mod's slots first, then the mask_mod's."""

    batch: object
    head0: object
    captures: tuple


@dataclass(frozen=True)
class TileCoords:
    """Where a thread's score registers sit: the query of its first row and the constant
    offsets of its rows and columns (the forward's `fwd.base.MaskCoords` has the same)."""

    row_offsets: tuple
    col_offsets: tuple
    query0: object


def split_args(at: ModArgs, score_mod) -> tuple:
    """(the score_mod's ModArgs, the mask_mod's): the same tile, each with its own captures,
    for a kernel that runs the two mods apart."""
    n_score = len(score_mod.captures) if score_mod is not None else 0
    captures = at.captures if at.captures is not None else ()
    return (ModArgs(at.batch, at.head0, captures[:n_score]),
            ModArgs(at.batch, at.head0, captures[n_score:]))


def reads_captures(graph) -> bool:
    return graph is not None and any(n.op == "load" for n in graph.nodes())


def apply_mods(acc_S_mn: cute.Tensor, coords, key0, rows, seqlen, at: ModArgs, score_mod,
               mask_mod, pre_scale, score_grad=None, grad_mn: cute.Tensor = None,
               derivatives: tuple = ()):
    """S, in place, through score_mod (of S * pre_scale: the score FlexAttention's mods see,
    softmax_scale applied) and mask_mod (-inf where it returns False). Element (r, c) is query
    rows.query(coords.query0 + coords.row_offsets[r]) of head rows.head(head0, .) against key
    key0 + coords.col_offsets[c] (`TileCoords`); seqlen: the entry's lengths. Where a mod
    reads a captured tensor its indices are clamped into the sequences, so that a row or key
    past the end (padding, masked after this) reads the last one's entries rather than past
    the user's table. Traced inline (the loops unroll:
    the offsets and graphs are compile-time values). The backward's: score_grad (d score_mod /
    d score, `mods.grad.score_derivative`) evaluated at the same score into grad_mn, and each
    (graph, out_mn) of derivatives (`mods.grad.capture_derivatives`' graphs) into its out_mn."""
    clamp = reads_captures(score_mod) or reads_captures(mask_mod)
    score_at, mask_at = split_args(at, score_mod)
    if score_mod is not None and FASTMATH:
        # the result's constant factor is in the softmax's scale (`softmax.score_scales`), and a
        # constant the score is only ever multiplied (or divided) by joins pre_scale
        score_mod = root_factor(score_mod)[1]
        factor, (score_mod, score_grad, *graphs) = scaled_score(
            (score_mod, score_grad) + tuple(g for g, _ in derivatives))
        derivatives = tuple((g, mn) for g, (_, mn) in zip(graphs, derivatives))
        if factor != 1.0:
            pre_scale = pre_scale * cutlass.Float32(factor)
    for r in range(len(coords.row_offsets)):
        row = coords.query0 + coords.row_offsets[r]
        q_idx = rows.query(row)
        if clamp:
            q_idx = cutlass.min(q_idx, seqlen.seqlen_q - 1)
        head = rows.head(at.head0, row)
        for c in range(len(coords.col_offsets)):
            kv_idx = key0 + coords.col_offsets[c]
            if clamp:
                kv_idx = cutlass.min(kv_idx, seqlen.seqlen_k - 1)
            leaves = dict(b=at.batch, h=head, q_idx=q_idx, kv_idx=kv_idx)
            if score_mod is not None:
                score = dict(leaves, score=acc_S_mn[r, c] * pre_scale)
                if score_grad is not None:
                    grad_mn[r, c] = emit(score_grad, score, score_at.captures)
                for graph, out_mn in derivatives:
                    out_mn[r, c] = emit(graph, score, score_at.captures)
                acc_S_mn[r, c] = emit(score_mod, score, score_at.captures)
            if mask_mod is not None:
                keep = emit(mask_mod, leaves, mask_at.captures)
                acc_S_mn[r, c] = cutlass.select_(keep, acc_S_mn[r, c], -cutlass.Float32.inf)


@cute.jit
def apply_mods_unless_whole(acc_S_mn: cute.Tensor, coords, key0, rows, seqlen, at: ModArgs,
                            score_mod, mask_mod, pre_scale, needs_mask, score_grad=None,
                            grad_mn: cute.Tensor = None, derivatives: tuple = ()):
    """`apply_mods` on a block-sparse tile: the score_mod (and the backward's derivatives) on
    every score, the mask_mod only where needs_mask, a block mask's list flag
    (`kernels.sched.block_info.list_entry`: False on a tile every score of which the mask
    keeps), under a uniform branch. Shared by the forward's and the backward's rounds.
    needs_mask may be a function giving the flag, called after the score pass: the forward
    reads its list entry there (where its kernels have always read it)."""
    score_at, mask_at = split_args(at, score_mod)
    if cutlass.const_expr(score_mod is not None):
        apply_mods(acc_S_mn, coords, key0, rows, seqlen, score_at, score_mod, None, pre_scale,
                   score_grad, grad_mn, derivatives)
    if cutlass.const_expr(callable(needs_mask)):
        needs_mask = needs_mask()
    if needs_mask:
        apply_mods(acc_S_mn, coords, key0, rows, seqlen, mask_at, None, mask_mod, None)


@cute.jit
def add_capture_grads(dS_mn: cute.Tensor, coords, key0, rows: cutlass.Constexpr, seqlen, at,
                      pairs: cutlass.Constexpr, derivative_mns, slots: cutlass.Constexpr, grads):
    """The backward's gradients of a score_mod's captured tensors: for each (load, d
    score_mod / d load) of pairs (`mods.grad.capture_derivatives`), with that derivative at
    each score in derivative_mns (`apply_mods`' derivatives), the gradient of its tensor
    (grads[j] for the tensor of slot slots[j]; a tensor may be read by several loads, or by
    none that reaches the result)[the load's indices] += dS_mn * derivative (dS_mn: dL / d
    score_mod, the tile's P (dP - D)), as float32
    reductions at L2. The tile's batch entry and head are one (a backward tile's), so a load
    that reads neither q_idx nor kv_idx adds one sum per warp, one that reads one of them a
    sum per row or column of the thread, else one reduction per score that is not 0 (a
    masked score's, a padding row's or column's: their indices are clamped as `apply_mods`
    clamps them). coords, key0, rows, seqlen, at: `apply_mods`'."""
    n_rows, n_cols = len(coords.row_offsets), len(coords.col_offsets)
    for i in cutlass.range_constexpr(len(pairs)):
        load = pairs[i][0]
        uses_q, uses_kv = reads(load.args, "q_idx"), reads(load.args, "kv_idx")
        d_mn, target = derivative_mns[i], grads[slots.index(load.value.slot)]
        if cutlass.const_expr(not uses_q and not uses_kv):
            total = cutlass.Float32(0.0)
            for r in cutlass.range_constexpr(n_rows):
                for c in cutlass.range_constexpr(n_cols):
                    total = total + dS_mn[r, c] * d_mn[r, c]
            for k in cutlass.range_constexpr(5):
                total = total + cute.arch.shuffle_sync_bfly(total, offset=16 >> k)
            if cute.arch.lane_idx() == 0:
                _add_at(load, target, coords, key0, rows, seqlen, at, 0, 0, total)
        elif cutlass.const_expr(not uses_kv):
            for r in cutlass.range_constexpr(n_rows):
                total = cutlass.Float32(0.0)
                for c in cutlass.range_constexpr(n_cols):
                    total = total + dS_mn[r, c] * d_mn[r, c]
                _add_at(load, target, coords, key0, rows, seqlen, at, r, 0, total)
        elif cutlass.const_expr(not uses_q):
            for c in cutlass.range_constexpr(n_cols):
                total = cutlass.Float32(0.0)
                for r in cutlass.range_constexpr(n_rows):
                    total = total + dS_mn[r, c] * d_mn[r, c]
                _add_at(load, target, coords, key0, rows, seqlen, at, 0, c, total)
        else:
            for r in cutlass.range_constexpr(n_rows):
                for c in cutlass.range_constexpr(n_cols):
                    value = dS_mn[r, c] * d_mn[r, c]
                    if value != 0.0:
                        _add_at(load, target, coords, key0, rows, seqlen, at, r, c, value)


@cute.jit
def _add_at(load: cutlass.Constexpr, target: cute.Tensor, coords, key0, rows: cutlass.Constexpr,
            seqlen, at, r: cutlass.Constexpr, c: cutlass.Constexpr, value):
    """target[load's indices at the tile's score (r, c)] += value (a float32 reduction)."""
    q_idx = cutlass.min(rows.query(coords.query0 + coords.row_offsets[r]), seqlen.seqlen_q - 1)
    kv_idx = cutlass.min(key0 + coords.col_offsets[c], seqlen.seqlen_k - 1)
    leaves = dict(b=at.batch, h=rows.head(at.head0, coords.query0), q_idx=q_idx, kv_idx=kv_idx)
    values = emit_nodes(ordered(load.args), leaves, at.captures)
    index = tuple(values[a] for a in load.args)
    offset = cute.crd2idx(index, target.layout) if cutlass.const_expr(len(index) > 0) else 0
    cute.arch.red(target.iterator + offset, value, op="add", dtype="f32", sem="relaxed",
                  scope="gpu")

