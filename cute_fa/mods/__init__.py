"""Programmable attention: a user's `score_mod` / `mask_mod` (FlexAttention's signatures)
traced into an expression graph (`trace`, `graph`), evaluated densely (`dense`), and the
float64 attention with mods that kernels will be checked against (`reference`); block masks
(`block_mask`: which key blocks each query block visits whole, in part or not at all, torch's
`BlockMask` layout, convertible both ways). The graph is
torch-free data, which the kernels' device code reads (`kernels/common/mods.py`; the public
functions take `score_mod=` / `mask_mod=`, `api/mods.py`); the tracer and the evaluation need
torch and load on first use."""

from .graph import Capture, ModGraph, Node

_LAZY = {"trace_score_mod": "trace", "trace_mask_mod": "trace", "evaluate": "dense"}

__all__ = ["Capture", "ModGraph", "Node", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
