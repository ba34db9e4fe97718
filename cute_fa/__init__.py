"""cute_fa: FlashAttention forward kernels in CUTLASS's CuTe DSL, and the layouts they run.

Importing the package is cheap and compiles nothing: `cute_fa.layouts` (which
imports the CuTe DSL) and `cute_fa.reference` load on first use.
"""

import importlib
import os

__version__ = "0.1.0"
__all__ = ["forward", "sdpa", "precompile", "layouts", "reference", "__version__"]

_LAZY = {"forward": "interface", "sdpa": "interface", "precompile": "precompile"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    if name in ("layouts", "reference", "kernels"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if os.environ.get("CUTE_FA_PRECOMPILE"):
    importlib.import_module(f"{__name__}.precompile").precompile_from_env()
