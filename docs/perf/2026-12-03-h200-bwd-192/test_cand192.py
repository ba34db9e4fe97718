"""The head_dim-192 class (160-192) on candidate tiles of the wgmma backward, forced through
cute_fa.tuning: the float64 reference with flash-attn's criterion."""
import pytest
import torch
import cute_fa
import cute_fa.tuning as T
from cute_fa.runtime.plan import clear_plans
from grad_reference import check_grads
import test_bwd_sm90_gpu as G

VARIANTS = {"c2": (64, 2, 2, 1, True, False, 32), "c3": (64, 2, 3, 1, True, False, 32),
            "c2w": (64, 2, 2, 1, True, True, 32)}


@pytest.fixture(params=list(VARIANTS))
def variant(request, monkeypatch):
    monkeypatch.setitem(T.BWD_SM90_TILES, 192, VARIANTS[request.param])
    clear_plans()
    yield request.param
    clear_plans()


SHAPES = [(1, 257, 257, 2, 2, 192), (2, 200, 333, 4, 1, 192), (1, 333, 200, 4, 2, 176),
          (3, 1, 77, 2, 2, 192), (1, 700, 700, 4, 4, 160), (1, 1100, 1100, 4, 1, 192)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_grid(variant, shape, causal, dtype):
    G.test_gradients_grid(shape, causal, dtype)


@pytest.mark.parametrize("kw", [dict(window_size=(40, 0)), dict(softcap=50.0),
                                dict(window_size=(30, 30), softcap=5.0)],
                         ids=["window_causal", "softcap", "window_softcap"])
def test_window_softcap(variant, kw):
    q, k, v, dout = G._inputs((2, 300, 260, 4, 2, 192), torch.bfloat16, 12)
    check_grads(G._sm90_grads(q, k, v, dout, causal=True, **kw), q, k, v, dout, causal=True, **kw)


@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen(variant, deterministic):
    G._check_varlen(deterministic, (70, 0), head_dim=192)


@pytest.mark.parametrize("causal", [False, True])
def test_repeatable(variant, causal):
    G._check_repeatable((1, 1500, 1500, 16, 4, 192), causal, 9)


def test_tile_taken(variant):
    from cute_fa.tuning import bwd_sm90_tile
    assert bwd_sm90_tile("bfloat16", 192).atom_cols == 32
