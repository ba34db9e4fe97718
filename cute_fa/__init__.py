"""cute_fa: FlashAttention forward kernels in CUTLASS's CuTe DSL, and the layouts they run.

Importing the package is cheap and compiles nothing: `cute_fa.layouts` (which
imports the CuTe DSL) and `cute_fa.reference` load on first use.
"""

import importlib

__version__ = "0.1.0"
__all__ = ["layouts", "reference", "__version__"]


def __getattr__(name):
    if name in ("layouts", "reference", "kernels"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
