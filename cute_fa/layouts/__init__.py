"""The CuTe layouts of cute_fa: one source of truth for kernels and notebooks.

The builders (`smem`, `copies`, `mma`, `tma`) must be called while a `@cute.jit`
function is being traced; kernels call them to build their layouts, copies and
MMAs, and `FlashLayouts` calls the same builders to answer, on the CPU, which
elements each thread copies, holds and combines.
"""

from .config import TileConfig, canonical_dtype
from .introspect import FlashLayouts

__all__ = ["FlashLayouts", "TileConfig", "canonical_dtype"]
