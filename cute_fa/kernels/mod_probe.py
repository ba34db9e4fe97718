"""Mod probe: a traced mod (`cute_fa.mods`) evaluated by `common.mods.emit` at n given elements,
one thread each, so that the device code of every node is checked against the float64
reference (`cute_fa.mods.evaluate`) before any attention kernel runs it: CI compiles it for
each arch, a GPU runs it (tests/test_mod_probe_gpu.py).

Inputs, each (n,): the scores (float32; a mask_mod's are unread) and the indices b, h, q_idx,
kv_idx (int32); the captured tensors, in slot order (a 0-d one as a 1-element tensor). Output
(n,) float32: the score_mod's value, or 1.0 / 0.0 where the mask_mod keeps / drops the key."""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute

from ..mods.graph import BOOL
from .common.mods import DTYPES, emit

THREADS = 128


class ModProbe:
    def __init__(self, graph):
        self.graph = graph

    @cute.jit
    def __call__(self, mScore: cute.Tensor, mB: cute.Tensor, mH: cute.Tensor, mQ: cute.Tensor,
                 mKV: cute.Tensor, mOut: cute.Tensor, captured: Optional[tuple], stream):
        """captured: None where the mod captures nothing (the DSL takes no empty tuple)."""
        self.kernel(mScore, mB, mH, mQ, mKV, mOut, captured).launch(
            grid=(cute.ceil_div(cute.size(mOut), THREADS), 1, 1), block=(THREADS, 1, 1),
            stream=stream)

    @cute.kernel
    def kernel(self, mScore: cute.Tensor, mB: cute.Tensor, mH: cute.Tensor, mQ: cute.Tensor,
               mKV: cute.Tensor, mOut: cute.Tensor, captured: Optional[tuple]):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * THREADS + tidx
        if i < cute.size(mOut):
            leaves = dict(score=mScore[i], b=mB[i], h=mH[i], q_idx=mQ[i], kv_idx=mKV[i])
            value = emit(self.graph, leaves, () if cutlass.const_expr(captured is None)
                         else captured)
            if cutlass.const_expr(self.graph.root.kind == BOOL):
                value = cutlass.select_(value, cutlass.Float32(1.0), cutlass.Float32(0.0))
            mOut[i] = cutlass.Float32(value)


def fake_arguments(graph, n: int = 1024, capture_extent: int = 16):
    """Fake tensors and stream for compiling the probe without a GPU: n elements, each
    capture `capture_extent` long in every dimension."""
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    def vector(dtype):
        return make_fake_compact_tensor(dtype, (n,), stride_order=(0,), assumed_align=4)

    captured = tuple(make_fake_compact_tensor(
        DTYPES[c.dtype], (capture_extent,) * max(c.ndim, 1),
        stride_order=tuple(reversed(range(max(c.ndim, 1)))), assumed_align=4)
        for c in graph.captures) or None
    return (vector(cutlass.Float32), *(vector(cutlass.Int32) for _ in range(4)),
            vector(cutlass.Float32), captured, make_fake_stream())


def compile_probe(graph, arch: str = "sm_80", arguments=None):
    """cute.compile the probe for `graph` and `arch` ('sm_80', 'sm_90a', 'sm_120a'; PTX kept,
    `.__ptx__`); `arguments`: the call's own (on a GPU), else fake ones (no GPU needed)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        options = f"--gpu-arch={arch} --keep-ptx --dump-dir={tmp}"
        return cute.compile(ModProbe(graph), *(arguments or fake_arguments(graph)),
                            options=options)
