"""cute_fa: FlashAttention kernels (forward and backward) in CUTLASS's CuTe DSL, and the layouts
they run, which `cute_fa.explain` answers questions about lane by lane.

The public functions are `cute_fa.api`'s; importing the package is cheap and compiles nothing
(they, `cute_fa.layouts` (which imports the CuTe DSL) and `cute_fa.reference` load on first use).
"""

import importlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the lazy attributes below resolve to, for type checkers
    from . import explain, kernels, layouts, reference
    from .api.backward import backward, backward_varlen
    from .api.flex import flex_attention
    from .api.forward import forward, forward_varlen, merge_attention, sdpa
    from .api.precompile import precompile
    from .runtime.plan import tiles_of

__version__ = "0.1.0"
__all__ = ["forward", "forward_varlen", "sdpa", "flex_attention", "backward", "backward_varlen",
           "merge_attention", "precompile", "tiles_of", "explain", "layouts", "reference",
           "__version__"]

_LAZY = {"forward": "api.forward", "forward_varlen": "api.forward", "sdpa": "api.forward",
         "flex_attention": "api.flex",
         "merge_attention": "api.forward", "backward": "api.backward",
         "backward_varlen": "api.backward", "precompile": "api.precompile",
         "tiles_of": "runtime.plan"}
_SUBMODULES = ("explain", "layouts", "reference", "kernels")


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(__all__) | set(_SUBMODULES))


if os.environ.get("CUTE_FA_PRECOMPILE"):
    importlib.import_module(f"{__name__}.api.precompile").precompile_from_env()
