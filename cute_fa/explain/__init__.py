"""Explanations read off the layouts the kernels run: host-side introspection (`FlashLayouts`:
who copies, holds and combines what), figures, the per-lane tour, the one-tile GPU probe and
docs/walkthrough.md's generator; `WgmmaLayouts` and `pipeline_rounds` do the same for the Hopper
wgmma kernel, and `BwdLayouts` for the backward's three TiledMMAs and its P and dS tiles in shared
memory. Nothing here shapes a kernel: `cute_fa.layouts` is what kernels
build from, and this package reads those very builders.
"""

from .bwd import BwdLayouts
from .introspect import FlashLayouts
from .bwd_wgmma import WgmmaBwdLayouts
from .wgmma import WgmmaLayouts, pipeline_rounds

__all__ = ["BwdLayouts", "FlashLayouts", "WgmmaBwdLayouts", "WgmmaLayouts", "pipeline_rounds"]
