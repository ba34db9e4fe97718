"""Draws docs/decode_packing.png: decode's three tiles, from the layouts the kernels run
(python docs/decode_packing_figure.py), each for the call that takes it: one query of a 32/8
GQA model (4 packed rows: 16-row tile, 4 warps splitting the keys), four queries of a 64/8 model
(32 rows: 32-row tile, 2 warps per 16-row slab) and sixteen of a 32/8 one (64 rows: the 64-row
tile of 16-row slabs per warp)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from cute_fa.explain import FlashLayouts  # noqa: E402
from cute_fa.explain.figures import packed_rows_map  # noqa: E402
from cute_fa.tuning import decode_key  # noqa: E402


def main(path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(13, 8))
    for ax, (group, seqlen_q) in zip(axes, ((4, 1), (8, 4), (4, 16))):
        key = decode_key("sm_90a", "bfloat16", 128, True, seqlen_q=seqlen_q, group=group,
                         page_size=0, seqused_k=False, split_kv=False)
        packed_rows_map(FlashLayouts.of(key.tile), group, seqlen_q, ax=ax)
        tile = key.tile
        kind = (f"{tile.key_groups} warps per 16-row slab, splitting the keys"
                if tile.warps_split_keys else "16-row slab per warp")
        ax.set_title(f"{ax.get_title()}\n{tile.block_m}x{tile.block_n} tile, {kind}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main(Path(__file__).with_name("decode_packing.png"))
