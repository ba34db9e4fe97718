"""cute_fa: FlashAttention forward kernels in CUTLASS's CuTe DSL, and the layouts they run.

Importing the package is cheap and compiles nothing: `cute_fa.layouts` (which
imports the CuTe DSL) and `cute_fa.reference` load on first use.
"""

import importlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the lazy attributes below resolve to, for type checkers
    from . import kernels, layouts, reference
    from ._precompile import precompile
    from .interface import forward, forward_varlen, merge_attention, sdpa

__version__ = "0.1.0"
__all__ = ["forward", "forward_varlen", "sdpa", "merge_attention", "precompile", "layouts",
           "reference", "__version__"]

_LAZY = {"forward": "interface", "forward_varlen": "interface", "sdpa": "interface",
         "merge_attention": "interface", "precompile": "_precompile"}
_SUBMODULES = ("layouts", "reference", "kernels")


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(__all__) | set(_SUBMODULES))


if os.environ.get("CUTE_FA_PRECOMPILE"):
    importlib.import_module(f"{__name__}._precompile").precompile_from_env()
