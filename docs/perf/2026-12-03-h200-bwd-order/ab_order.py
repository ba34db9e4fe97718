"""A/B of WgmmaBwdTileConfig.dq_before_dk (dQ issued before dK, handed over while dK runs)
against the shipped tiles, default, deterministic and (head_dim 128) under a softcap, whose
tile has no writer (dQ's reductions from registers under dK), in one process
(`cute_fa.bench.ab`); at head_dim 128 also with two Q/dO stages (the stage is released after
dK, earlier than without it) and on 80-query blocks (flash-attn-4's non-causal tile, which
orders a step this way). Usage: ab_order.py OUT [--peers]"""
import sys

from cute_fa.bench.ab import Shape, Variant, run

T, DT, ST = "BWD_SM90_TILES", "BWD_SM90_DETERMINISTIC_TILES", "BWD_SM90_SOFTCAP_TILES"
SHAPES = [Shape("d128", 16, 16, 16, 1024, 128, False), Shape("d128", 4, 16, 16, 4096, 128, False),
          Shape("d128", 4, 16, 16, 4096, 128, True), Shape("d128", 1, 32, 8, 8192, 128, True),
          Shape("d64", 4, 32, 32, 4096, 64, False), Shape("d64", 4, 32, 32, 4096, 64, True),
          Shape("d64", 1, 32, 8, 8192, 64, True)]
FIRST = (64, False, True)  # atom_cols, dv_after_ds, dq_before_dk after the first six fields
VARIANTS = {
    "d128": Variant("d128", 128, T, (64, 2, 3, 1, False, True)),
    "d128q": Variant("d128", 128, T, (64, 2, 3, 1, False, True) + FIRST),
    "d128q2": Variant("d128", 128, T, (64, 2, 2, 1, False, True) + FIRST),
    "d128_80q": Variant("d128", 128, T, (80, 2, 2, 1, False, True, 64, True, True)),
    "d128_det": Variant("d128", 128, DT, (80, 2, 2, 1, False, True, 64, True), True),
    "d128q_det": Variant("d128", 128, DT, (80, 2, 2, 1, False, True, 64, True, True), True),
    "d128_sc": Variant("d128", 128, ST, (64, 2, 3, 1), softcap=True),
    "d128q_sc": Variant("d128", 128, ST, (64, 2, 3, 1, False, False) + FIRST, softcap=True),
    "d64": Variant("d64", 64, T, (128, 2, 2, 1, False, True, 64, True)),
    "d64q": Variant("d64", 64, T, (128, 2, 2, 1, False, True, 64, True, True)),
    "d64_det": Variant("d64", 64, DT, (128, 2, 2, 1, False, True, 64, True), True),
    "d64q_det": Variant("d64", 64, DT, (128, 2, 2, 1, False, True, 64, True, True), True),
}

if __name__ == "__main__":
    run(sys.argv[1], SHAPES, VARIANTS, {"d128": "d128", "d64": "d64"},
        peers="--peers" in sys.argv, name="ab_order")
