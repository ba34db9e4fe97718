"""Compile a chosen set of kernels up front (into memory and the on-disk cache).

`cute_fa.precompile(head_dims=(64, 128))` or, at import time,
CUTE_FA_PRECOMPILE="64,128" (both dtypes, causal and not, for the local GPU).
"""

from __future__ import annotations

import itertools
import os

from .compiler import get_kernel, wait_for_saves
from .tuning import kernel_key


def precompile(head_dims=(64, 128), dtypes=("bfloat16", "float16"), causal=(False, True),
               arch: str | None = None, backend: str = "auto") -> list:
    """Compile every (head_dim, dtype, causal) combination for `arch` (default: this GPU's)
    and `backend` ('auto' compiles what `forward` would pick)."""
    if arch is None:
        import torch

        from .interface import _arch

        if not torch.cuda.is_available():
            raise RuntimeError("precompile needs arch= when there is no CUDA GPU")
        arch = _arch(torch.cuda.current_device())
    keys = []
    for head_dim, dtype, is_causal in itertools.product(head_dims, dtypes, causal):
        key = kernel_key(arch, dtype, int(head_dim), bool(is_causal), backend)
        get_kernel(key)
        keys.append(key)
    wait_for_saves()
    return keys


def precompile_from_env() -> None:
    spec = os.environ.get("CUTE_FA_PRECOMPILE", "").strip()
    if spec:
        precompile(head_dims=tuple(int(x) for x in spec.split(",") if x.strip()))
