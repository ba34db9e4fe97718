"""cute_fa.reference against the hand example of docs/walkthrough.md §2, and against itself
at random."""

import math
from fractions import Fraction as F

import numpy as np
import pytest

from cute_fa.reference import attention, flash_forward_tiles

# the inputs of docs/walkthrough.md §2
Q = [[1, 0], [0, 1]]
K = [[0, 1], [1, 0], [2, 1], [0, 2]]
V = [[1, 0], [0, 1], [1, 1], [2, 0]]
S_HALF = math.log(2.0)  # s = ln 2, so exp(s*x) = 2**x


def fr(rows):
    return np.array([[float(F(x)) for x in row] for row in rows])


def test_hand_example_two_rounds_exact():
    o, lse, states = flash_forward_tiles(Q, K, V, scale=S_HALF, block_n=2)
    assert len(states) == 2
    # the scores of docs/walkthrough.md §2 are Q K^T; the rounds see its left and right halves
    np.testing.assert_array_equal(np.array(Q) @ np.array(K).T, [[0, 1, 2, 0], [1, 0, 1, 2]])
    # round 1 of the §2 rounds table: m = 1, the weights, l = 3/2, the numerator
    np.testing.assert_array_equal(states[0]["m"], [1, 1])
    np.testing.assert_array_equal(states[0]["p"], fr([["1/2", 1], [1, "1/2"]]))
    np.testing.assert_array_equal(states[0]["l"], [1.5, 1.5])
    np.testing.assert_array_equal(states[0]["o"], fr([["1/2", 1], [1, "1/2"]]))
    # round 2 of the §2 rounds table: alpha = 1/2, the weights, l = (2, 9/4), the numerator
    np.testing.assert_array_equal(states[1]["alpha"], [0.5, 0.5])
    np.testing.assert_array_equal(states[1]["m"], [2, 2])
    np.testing.assert_array_equal(states[1]["p"], fr([[1, "1/4"], ["1/2", 1]]))
    np.testing.assert_array_equal(states[1]["l"], [2, 2.25])
    np.testing.assert_array_equal(states[1]["o"], fr([["7/4", "3/2"], [3, "3/4"]]))
    # the P~ V_j column of round 2 (§2) is the increment O2 - alpha*O1
    np.testing.assert_array_equal(states[1]["o"] - 0.5 * states[0]["o"], fr([["3/2", 1], ["5/2", "1/2"]]))
    # the final output of §2 and the LSE of §10: ln 8 and ln 9
    np.testing.assert_array_equal(o, fr([["7/8", "3/4"], ["4/3", "1/3"]]))
    np.testing.assert_allclose(lse, [math.log(8), math.log(9)], rtol=0, atol=1e-15)


def test_hand_example_direct_attention():
    o, lse = attention(Q, K, V, scale=S_HALF)
    np.testing.assert_allclose(o, fr([["7/8", "3/4"], ["4/3", "1/3"]]), rtol=1e-15)
    np.testing.assert_allclose(lse, [math.log(8), math.log(9)], rtol=1e-15)


def test_hand_example_causal():
    # docs/walkthrough.md §8, top-left causal: query 0 sees key 0, query 1 sees keys 0,1 (scores 1, 0)
    o, lse = attention(Q, K, V, scale=S_HALF, causal=True)
    np.testing.assert_allclose(o, [[1, 0], [2 / 3, 1 / 3]], rtol=1e-15)
    np.testing.assert_allclose(lse, [0.0, math.log(3)], rtol=1e-15, atol=1e-15)
    o2, lse2, _ = flash_forward_tiles(Q, K, V, scale=S_HALF, block_n=2, causal=True)
    np.testing.assert_allclose(o2, o, rtol=1e-15)
    np.testing.assert_allclose(lse2, lse, rtol=1e-15, atol=1e-15)


def test_short_last_round():
    # 4 keys in rounds of 3: the last round has one key
    o, lse, states = flash_forward_tiles(Q, K, V, scale=S_HALF, block_n=3)
    assert len(states) == 2
    np.testing.assert_allclose(o, fr([["7/8", "3/4"], ["4/3", "1/3"]]), rtol=1e-15)
    np.testing.assert_allclose(lse, [math.log(8), math.log(9)], rtol=1e-15)


def test_empty_rows():
    # bottom-right style offset that hides every key from query 0
    o, lse = attention(Q, K, V, scale=S_HALF, causal=True, causal_offset=-1)
    np.testing.assert_array_equal(o[0], [0, 0])
    assert lse[0] == -np.inf
    np.testing.assert_allclose(o[1], [1, 0])
    o2, lse2, _ = flash_forward_tiles(Q, K, V, scale=S_HALF, block_n=1, causal=True, causal_offset=-1)
    np.testing.assert_array_equal(o2, o)
    np.testing.assert_array_equal(lse2, lse)


@pytest.mark.parametrize("seed", range(6))
def test_tiles_match_direct_attention(seed):
    rng = np.random.default_rng(seed)
    nq, nk, d = rng.integers(1, 40), rng.integers(1, 70), rng.choice([8, 16, 24])
    q, k, v = (rng.standard_normal((n, d)) for n in (nq, nk, nk))
    block_n = int(rng.integers(1, 20))
    for causal, offset in ((False, 0), (True, 0), (True, int(nk) - int(nq))):
        o_ref, lse_ref = attention(q, k, v, causal=causal, causal_offset=offset)
        o, lse, states = flash_forward_tiles(q, k, v, scale=1 / math.sqrt(d), block_n=block_n,
                                             causal=causal, causal_offset=offset)
        assert len(states) == -(-nk // block_n)
        np.testing.assert_allclose(o, o_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse, lse_ref, rtol=1e-12, atol=1e-12)


def test_direct_attention_against_softmax_definition():
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((5, 8)), rng.standard_normal((9, 8)), rng.standard_normal((9, 8))
    o, lse = attention(q, k, v, scale=0.3)
    s = 0.3 * q @ k.T
    w = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(o, w @ v, rtol=1e-13)
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(axis=1)), rtol=1e-13)


@pytest.mark.parametrize("bad", [dict(scale=0), dict(scale=-1.0), dict(scale="x")])
def test_bad_scale(bad):
    with pytest.raises(ValueError, match="scale"):
        attention(Q, K, V, **bad)


def test_bad_shapes():
    with pytest.raises(ValueError, match="k must have head_dim"):
        attention(Q, [[1, 2, 3]], [[1, 2]])
    with pytest.raises(ValueError, match="v must have"):
        attention(Q, K, V[:3])
    with pytest.raises(ValueError, match="q must be 2-D"):
        attention([1, 2], K, V)
    with pytest.raises(ValueError, match="block_n"):
        flash_forward_tiles(Q, K, V, scale=1.0, block_n=0)


def test_window_and_softcap_by_hand():
    """Three keys with scores 0, 1, 2 (scale 1) for one query at the last key (bottom-right,
    causal_offset 2): a window of one key back keeps scores 1 and 2; a softcap of 1 turns them
    into tanh(1) and tanh(2)."""
    q = np.array([[1.0, 0.0]])
    k = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    v = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 2.0]])
    o, lse = attention(q, k, v, scale=1.0, causal=True, causal_offset=2, window_size=(1, -1))
    e1, e2 = math.exp(1), math.exp(2)
    np.testing.assert_allclose(o[0], [0, (e1 + 2 * e2) / (e1 + e2)], rtol=1e-14)
    np.testing.assert_allclose(lse, [math.log(e1 + e2)], rtol=1e-14)
    o, lse = attention(q, k, v, scale=1.0, causal=True, causal_offset=2, window_size=(1, -1),
                       softcap=1.0)
    t1, t2 = math.exp(math.tanh(1)), math.exp(math.tanh(2))
    np.testing.assert_allclose(o[0], [0, (t1 + 2 * t2) / (t1 + t2)], rtol=1e-14)
    np.testing.assert_allclose(lse, [math.log(t1 + t2)], rtol=1e-14)
