"""Float64 reference attention for one head, on the CPU (numpy).

`attention` computes softmax(scale * Q K^T) V directly. `flash_forward_tiles`
emulates FlashAttention-2 Algorithm 1 tile by tile, keeping the convention of
docs/walkthrough.md §1: m is the running max of the *raw* scores (before the scale), and
exp(scale * (S - m)) is evaluated as exp2(scale * log2(e) * (S - m)), the form
the kernels use.
"""

from __future__ import annotations

import math

import numpy as np

from .visibility import key_visible


def _as_2d(name: str, x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().to("cpu").double().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D (seqlen, head_dim), got shape {arr.shape}")
    return arr


def _check(q, k, v, scale):
    q, k, v = _as_2d("q", q), _as_2d("k", k), _as_2d("v", v)
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"k must have head_dim {q.shape[1]} like q, got {k.shape[1]}")
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"v must have {k.shape[0]} rows like k, got {v.shape[0]}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[1])
    if not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    return q, k, v, float(scale)


def visible_mask(seqlen_q: int, seqlen_k: int, *, causal: bool, causal_offset: int = 0,
                 window_size=(-1, -1)) -> np.ndarray:
    """(seqlen_q, seqlen_k) booleans: True where the key is visible to the query."""
    qi = np.arange(seqlen_q)[:, None]
    ki = np.arange(seqlen_k)[None, :]
    return np.broadcast_to(key_visible(qi, ki, causal=causal, causal_offset=causal_offset,
                                       window_size=window_size), (seqlen_q, seqlen_k))


def attention(q, k, v, *, scale=None, causal=False, causal_offset=0, window_size=(-1, -1),
              softcap=0.0):
    """(o, lse) of one head in float64. causal is top-left (key <= query + causal_offset);
    window_size = (left, right) keeps keys query + causal_offset - left ... + right (-1: no
    bound, `cute_fa.visibility`); softcap c > 0 turns the scaled scores s into c tanh(s / c).

    A query with no visible key gets o = 0 and lse = -inf.
    """
    q, k, v, scale = _check(q, k, v, scale)
    s = scale * (q @ k.T)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    s = np.where(visible_mask(len(q), len(k), causal=causal, causal_offset=causal_offset,
                              window_size=window_size), s, -np.inf)
    m = s.max(axis=1, initial=-np.inf, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    l = p.sum(axis=1, keepdims=True)
    empty = l == 0
    o = np.where(empty, 0.0, (p @ v) / np.where(empty, 1.0, l))
    lse = np.where(empty[:, 0], -np.inf, (m_safe + np.log(np.where(empty, 1.0, l)))[:, 0])
    return o, lse


def flash_forward_tiles(q, k, v, *, scale, block_n, causal=False, causal_offset=0):
    """FlashAttention-2 Algorithm 1 over K/V tiles of `block_n` rows (the last may be shorter).

    Returns (o, lse, states); states[j] holds, after round j: "m" the row max
    of raw scores so far, "l" the row sum of exp(scale*(S-m)), "o" the
    unnormalised output numerator, "p" the round's unnormalised weights and
    "alpha" the factor the previous l and o were rescaled by (0 in round 1).
    """
    q, k, v, scale = _check(q, k, v, scale)
    if not (isinstance(block_n, int) and block_n > 0):
        raise ValueError(f"block_n must be a positive int, got {block_n!r}")
    scale_log2 = scale / math.log(2.0)
    nq, nk = len(q), len(k)
    m = np.full(nq, -np.inf)
    l = np.zeros(nq)
    o = np.zeros((nq, v.shape[1]))
    states = []
    for start in range(0, nk, block_n):
        stop = min(start + block_n, nk)
        s = q @ k[start:stop].T
        keep = visible_mask(nq, nk, causal=causal, causal_offset=causal_offset)[:, start:stop]
        s = np.where(keep, s, -np.inf)
        m_new = np.maximum(m, s.max(axis=1))
        # A row that has seen no visible key yet keeps m = -inf; exp2 of -inf - 0 is 0.
        m_ref = np.where(np.isfinite(m_new), m_new, 0.0)
        alpha = np.exp2(scale_log2 * (np.where(np.isfinite(m), m, m_ref) - m_ref))
        alpha = np.where(np.isfinite(m), alpha, 0.0)
        p = np.exp2(scale_log2 * (s - m_ref[:, None]))
        l = alpha * l + p.sum(axis=1)
        o = alpha[:, None] * o + p @ v[start:stop]
        m = m_new
        states.append({"m": m.copy(), "l": l.copy(), "o": o.copy(), "p": p, "alpha": alpha})
    empty = l == 0
    out = np.where(empty[:, None], 0.0, o / np.where(empty, 1.0, l)[:, None])
    lse = np.where(empty, -np.inf, scale * np.where(empty, 0.0, m) + np.log(np.where(empty, 1.0, l)))
    return out, lse, states
