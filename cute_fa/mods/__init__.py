"""Programmable attention: a user's `score_mod` / `mask_mod` (FlexAttention's signatures)
traced into an expression graph (`trace`, `graph`), evaluated densely (`evaluate`), and the
float64 attention with mods that kernels will be checked against (`reference`). The kernels'
hooks that compile a graph into the score loop come next; no public function takes a mod
yet."""

from .evaluate import evaluate
from .graph import Capture, ModGraph, Node
from .trace import trace_mask_mod, trace_score_mod

__all__ = ["Capture", "ModGraph", "Node", "evaluate", "trace_mask_mod", "trace_score_mod"]
