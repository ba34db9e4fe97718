"""A/B of the wgmma backward's tiles in one process, default and deterministic, with the peers
at S = 4k/8k and on the GQA rows (`cute_fa.bench.ab`): head_dim 128 on 80-query blocks (dQ
computed transposed, dV issued after dS: `WgmmaBwdTileConfig.dq_transposed`, `dv_after_ds`)
against its 64-query tile; head_dim 64 on 128 x 128 in two warpgroups with dV after dS, and on
80-query blocks of one warpgroup, against the 64 x 64 tile shipped before (deterministic: the
same 128 x 128 tile with dV before dS, serialized by ptxas). Usage: ab80.py OUT"""
import sys

from cute_fa.bench.ab import Shape, Variant, run


def grid(group, head_dim, heads, seqlens=(1024, 4096, 16384)):
    """16k tokens per batch at each seqlen, causal and not."""
    return [Shape(group, 16384 // s, heads, heads, s, head_dim, c)
            for c in (False, True) for s in seqlens]


SHAPES = (grid("d128", 128, 16) + [Shape("d128", 1, 32, 8, 2048, 128, True),
                                    Shape("d128", 1, 32, 8, 8192, 128, True),
                                    Shape("d128", 2, 32, 8, 4096, 128, False)]
          + grid("d64", 64, 32) + [Shape("d64", 1, 32, 8, 8192, 64, True)])
T, DT = "BWD_SM90_TILES", "BWD_SM90_DETERMINISTIC_TILES"
VARIANTS = {
    "d128": Variant("d128", 128, T, (64, 2, 3, 1, False, True)),
    "d128_80": Variant("d128", 128, T, (80, 2, 2, 1, False, True, 64, True)),
    "d128_80nw3": Variant("d128", 128, T, (80, 2, 3, 1, False, False, 64, True)),
    "d128_det": Variant("d128", 128, T, (64, 2, 3, 1, False, True), True),
    "d128_80_det": Variant("d128", 128, T, (80, 2, 2, 1, False, True, 64, True), True),
    "d64_old": Variant("d64", 64, T, (64, 1, 2, 2, False, True)),
    "d64": Variant("d64", 64, T, (128, 2, 2, 1, False, True, 64, True)),
    "d64_80": Variant("d64", 64, T, (80, 1, 2, 2, False, True)),
    "d64_old_det": Variant("d64", 64, DT, (128, 2, 2, 1, False, True), True),
    "d64_det": Variant("d64", 64, DT, (128, 2, 2, 1, False, True, 64, True), True),
}

if __name__ == "__main__":
    # the references are the tiles shipped before
    run(sys.argv[1], SHAPES, VARIANTS, {"d128": "d128", "d64": "d64_old"}, peers=True,
        name="ab80")
