"""The CuTe layouts of cute_fa: one source of truth for kernels and notebooks.

The builders (`smem`, `copies`, `mma`, `wgmma`, `tma`, `ring`, `bwd`) must be called while a
`@cute.jit` function is being traced; kernels call them to build their layouts, copies and
MMAs, and `cute_fa.explain` calls the same builders to answer, on the CPU, which elements each
thread copies, holds and combines.
"""

from .config import BwdTileConfig, TileConfig, canonical_dtype

__all__ = ["BwdTileConfig", "TileConfig", "canonical_dtype"]
