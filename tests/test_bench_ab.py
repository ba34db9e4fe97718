"""cute_fa.bench.ab's host side (CPU): a variant is a tile the tables can hold, `use` puts one
entry in and the imported tables back, and `run` refuses a malformed A/B before any GPU
work."""
import pytest

import cute_fa.tuning_bwd as tuning_bwd
from cute_fa.bench.ab import Shape, Variant, run, use

D128 = Variant("d128", 128, "BWD_SM90_DETERMINISTIC_TILES", (64, 2, 3, 1, False, True), True)


def test_variant_is_checked():
    with pytest.raises(ValueError, match="table must be one of"):
        Variant("d128", 128, "BWD_TILES", (64, 2, 3, 1))
    with pytest.raises(ValueError, match="q_stages must be 2 or 3"):
        Variant("d128", 128, "BWD_SM90_TILES", (64, 2, 4, 1))


def test_use_patches_one_entry_and_puts_the_tables_back():
    before = {n: dict(getattr(tuning_bwd, n)) for n in ("BWD_SM90_TILES",
                                                    "BWD_SM90_DETERMINISTIC_TILES")}
    shipped = tuning_bwd.bwd_sm90_tile("bfloat16", 128, deterministic=True)
    try:
        use({"x": D128}, "x")
        tile = tuning_bwd.bwd_sm90_tile("bfloat16", 120, deterministic=True)  # the same class
        assert (tile.block_m, tile.q_stages, tile.head_dim) == (64, 3, 120)
        assert tuning_bwd.BWD_SM90_TILES == before["BWD_SM90_TILES"]
    finally:
        use({"x": D128}, None)
    assert {n: getattr(tuning_bwd, n) for n in before} == before
    assert tuning_bwd.bwd_sm90_tile("bfloat16", 128, deterministic=True) == shipped


def test_run_refuses_a_malformed_ab(tmp_path):
    shapes = [Shape("d128", 1, 4, 4, 256, 128, False)]
    with pytest.raises(ValueError, match="reference names variants that are not there"):
        run(str(tmp_path), shapes, {"x": D128}, {"d128": "y"})
    wrong = Variant("d128", 64, "BWD_SM90_TILES", (64, 1, 2, 2, False, True))
    with pytest.raises(ValueError, match="are not for its head_dim 128"):
        run(str(tmp_path), shapes, {"x": D128, "w": wrong}, {"d128": "x"})
