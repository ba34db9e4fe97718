"""The CuTe layouts of cute_fa: one source of truth for kernels and notebooks.

The builders (`smem`, `copies`, `mma`, `tma`) must be called while a `@cute.jit`
function is being traced; kernels call them to build their layouts, copies and
MMAs, and `cute_fa.explain.FlashLayouts` calls the same builders to answer, on the CPU,
which elements each thread copies, holds and combines.
"""

from .config import BwdTileConfig, TileConfig, canonical_dtype

__all__ = ["BwdTileConfig", "FlashLayouts", "TileConfig", "canonical_dtype"]


def __getattr__(name: str):
    # FlashLayouts lives in cute_fa.explain (it reads these builders, kernels never import it);
    # this name stays for `from cute_fa.layouts import FlashLayouts`, resolved on first use so
    # that importing the builders never imports the explanations
    if name == "FlashLayouts":
        from ..explain import FlashLayouts

        return FlashLayouts
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
