"""forward_varlen, sliding windows and softcap on a GPU, against a reference written here.

The reference is plain torch in float64 (float32 for the ≥100k-token batch), one sequence at a
time, with the window and softcap rules spelled out below (not read from cute_fa). cute_fa's
error must be at most about that of an eager torch implementation in the input dtype (scores
and P in the input dtype, softmax in float32, as HF's `eager` attention computes) on the same
inputs: max|err| <= 2 * max|err_eager| + 1e-3 * max|o_ref|. Outputs are poisoned with NaN
before each call, so an unwritten element fails."""

import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import cute_fa  # noqa: E402


def visible(sq, sk, causal, window, device):
    """(sq, sk) bool: flash-attn's rule, bottom-right: query i sits at key i + sk - sq and sees
    keys from that minus left to that plus right (-1: unbounded); causal is right = 0."""
    left, right = window
    if causal:
        right = 0
    diag = torch.arange(sq, device=device)[:, None] + (sk - sq)
    keys = torch.arange(sk, device=device)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        keep &= keys <= diag + right
    if left >= 0:
        keep &= keys >= diag - left
    return keep


def attend(q, k, v, scale, causal, window, softcap, dtype):
    """One sequence, q (sq, hq, d), k/v (sk, hk, d): (o, lse) computed in `dtype` (float64 /
    float32: the reference; float16 / bfloat16: eager torch's rounding)."""
    sq, hq, d = q.shape
    sk, hk, _ = k.shape
    low = dtype in (torch.float16, torch.bfloat16)
    qh, kh, vh = (t.to(dtype).transpose(0, 1) for t in (q, k, v))
    kh = kh.repeat_interleave(hq // hk, dim=0)
    vh = vh.repeat_interleave(hq // hk, dim=0)
    s = (qh @ kh.transpose(-1, -2)).to(torch.float32 if low else dtype) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~visible(sq, sk, causal, window, q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0)[..., None])
    o = (p.to(dtype) @ vh).to(torch.float64 if not low else torch.float32)
    return o.transpose(0, 1), lse


def check(o, lse, q, k, v, cu_q, cu_k, *, causal, window=(-1, -1), softcap=0.0, scale=None,
          ref_dtype=torch.float64, lens_k=None):
    """Compare every sequence of a ragged batch (dense calls pass cu of one entry per row)."""
    d = q.shape[-1]
    scale = scale or 1.0 / math.sqrt(d)
    assert not torch.isnan(o).any(), "NaN in output (unwritten or poisoned element)"
    err = err_eager = 0.0
    peak = 1e-6
    for b in range(len(cu_q) - 1):
        q0, q1 = int(cu_q[b]), int(cu_q[b + 1])
        k0, k1 = int(cu_k[b]), int(cu_k[b + 1])
        if lens_k is not None:
            k1 = k0 + int(lens_k[b])
        if q1 == q0:
            continue
        qs, ks, vs = q[q0:q1], k[k0:k1], v[k0:k1]
        o_ref, lse_ref = attend(qs, ks, vs, scale, causal, window, softcap, ref_dtype)
        o_low, _ = attend(qs, ks, vs, scale, causal, window, softcap, q.dtype)
        empty = ~torch.isfinite(lse_ref).transpose(0, 1)  # (sq, hq) rows that see no key
        if empty.any():
            assert (o[q0:q1][empty] == 0).all(), "rows that see no key must be 0"
            if lse is not None:
                assert (lse[:, q0:q1].transpose(0, 1)[empty] == float("-inf")).all()
        o_ref = o_ref.where(~empty[..., None], 0)
        o_low = o_low.nan_to_num(0).where(~empty[..., None], 0)
        err = max(err, (o[q0:q1].double() - o_ref.double()).abs().max().item())
        err_eager = max(err_eager, (o_low.double() - o_ref.double()).abs().max().item())
        peak = max(peak, o_ref.abs().max().item())
        if lse is not None:
            lse_err = (lse[:, q0:q1].double() - lse_ref.double()).where(~empty.T, 0).abs().max()
            assert lse_err.item() <= 1e-3 * max(1.0, lse_ref.where(~empty.T, 0).abs().max().item())
    tol = 2 * err_eager + 1e-3 * peak
    assert err <= tol, f"max err {err:.3g} vs eager torch {err_eager:.3g}"


def ragged(lens_q, lens_k, hq, hk, d, dtype, gen):
    cu_q = torch.tensor([0] + lens_q, device="cuda").cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lens_k, device="cuda").cumsum(0).to(torch.int32)
    q = torch.randn(int(cu_q[-1]), hq, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(max(int(cu_k[-1]), 1), hk, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(max(int(cu_k[-1]), 1), hk, d, device="cuda", dtype=dtype, generator=gen)
    return q, k, v, cu_q, cu_k


BACKENDS = ["sm80", "tma", "sm90"]
DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d, hq, hk", [(64, 8, 2), (128, 4, 4), (96, 6, 1), (256, 4, 2)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("same_k", [True, False], ids=["sk=sq", "sk>=sq"])
def test_varlen(backend, dtype, d, hq, hk, causal, same_k):
    gen = torch.Generator("cuda").manual_seed(d * 7 + hq + causal + 2 * same_k)
    lens_q = [0, 1, 300, 17, 128, 1000, 1, 0, 257, 64]
    lens_k = lens_q if same_k else [n + extra for n, extra in
                                    zip(lens_q, [5, 0, 900, 3, 128, 33, 2047, 0, 1, 64])]
    q, k, v, cu_q, cu_k = ragged(lens_q, lens_k, hq, hk, d, dtype, gen)
    out = torch.full_like(q, float("nan"))
    o, lse = cute_fa.forward_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                    return_lse=True, out=out, backend=backend)
    assert o is out and lse.shape == (hq, q.shape[0])
    check(o, lse, q, k, v, cu_q, cu_k, causal=causal)


WINDOWS = [(0, 0), (16, -1), (-1, 16), (100, 0), (100, 50), (5000, 0), (5000, 5000), (1, 1)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("sq, sk", [(700, 700), (300, 1000), (1, 1500), (2000, 4500)])
def test_window_dense(backend, window, causal, sq, sk):
    gen = torch.Generator("cuda").manual_seed(sq + sk + window[0] + 3 * window[1] + causal)
    dtype = torch.bfloat16
    q = torch.randn(2, sq, 8, 128, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(2, sk, 2, 128, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(2, sk, 2, 128, device="cuda", dtype=dtype, generator=gen)
    out = torch.full_like(q, float("nan"))
    o, lse = cute_fa.forward(q, k, v, causal=causal, window_size=window, return_lse=True,
                             out=out, backend=backend if sq > 16 else "sm80")
    cu_q = torch.arange(3, dtype=torch.int32) * sq
    cu_k = torch.arange(3, dtype=torch.int32) * sk
    check(o.flatten(0, 1), lse.transpose(0, 1).flatten(1, 2), q.flatten(0, 1),
          k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, causal=causal, window=window)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("softcap", [50.0, 5.0, 0.5])
def test_softcap(backend, dtype, d, softcap):
    gen = torch.Generator("cuda").manual_seed(d + int(softcap * 10))
    q = 3 * torch.randn(2, 333, 8, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(2, 333, 4, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(2, 333, 4, d, device="cuda", dtype=dtype, generator=gen)
    for causal in (True, False):
        o, lse = cute_fa.forward(q, k, v, causal=causal, softcap=softcap, return_lse=True,
                                 backend=backend)
        cu = torch.arange(3, dtype=torch.int32) * 333
        check(o.flatten(0, 1), lse.transpose(0, 1).flatten(1, 2), q.flatten(0, 1),
              k.flatten(0, 1), v.flatten(0, 1), cu, cu, causal=causal, softcap=softcap)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_varlen_window_softcap(backend, dtype):
    """Gemma 2's layer: a ragged batch with a window and a softcap together."""
    gen = torch.Generator("cuda").manual_seed(5)
    lens = [1, 4000, 0, 37, 513, 2048, 100]
    q, k, v, cu_q, cu_k = ragged(lens, lens, 8, 4, 256, dtype, gen)
    out = torch.full_like(q, float("nan"))
    cute_fa.forward_varlen(q, k, v, cu_q, cu_k, max(lens), max(lens), causal=True,
                           window_size=(1023, 0), softcap=50.0, out=out, backend=backend,
                           softmax_scale=0.0625)
    check(out, None, q, k, v, cu_q, cu_k, causal=True, window=(1023, 0), softcap=50.0,
          scale=0.0625)


@pytest.mark.parametrize("window", [(-1, -1), (255, 0), (2047, 0)],
                         ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_decode_window(window, num_splits):
    """A sliding-window model decoding: one query per entry against a cache with room to grow
    (seqused_k), packed GQA, split keys."""
    gen = torch.Generator("cuda").manual_seed(window[0] + 11 * (num_splits or 0))
    b, cap = 4, 8192
    lens = [1, 300, 8192, 5000]
    q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, cap, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, cap, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    used = torch.tensor(lens, device="cuda", dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    o, lse = cute_fa.forward(q, k, v, causal=True, window_size=window, seqused_k=used,
                             num_splits=num_splits, return_lse=True, out=out)
    cu_q = torch.arange(b + 1, dtype=torch.int32)
    cu_k = torch.arange(b + 1, dtype=torch.int32) * cap
    check(o.flatten(0, 1), lse.transpose(0, 1).flatten(1, 2), q.flatten(0, 1),
          k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, causal=True, window=window,
          lens_k=lens)


def test_varlen_paged():
    """Chunked prefill against a paged cache: ragged queries, each sequence's keys in pages
    (scattered), seqused_k keys each."""
    gen = torch.Generator("cuda").manual_seed(9)
    lens_q, lens_k, page = [5, 130, 1, 0, 64], [300, 130, 1024, 7, 900], 64
    b = len(lens_q)
    per_seq = 16
    pool = torch.randperm(b * per_seq + 3, device="cuda", generator=gen)
    table = pool[:b * per_seq].view(b, per_seq).to(torch.int32)
    k_pages = torch.randn(b * per_seq + 3, page, 2, 128, device="cuda", dtype=torch.bfloat16,
                          generator=gen)
    v_pages = torch.randn_like(k_pages)
    cu_q = torch.tensor([0] + lens_q, device="cuda").cumsum(0).to(torch.int32)
    q = torch.randn(int(cu_q[-1]), 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    used = torch.tensor(lens_k, device="cuda", dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    cute_fa.forward_varlen(q, k_pages, v_pages, cu_q, None, max(lens_q), max(lens_k),
                           causal=True, out=out, page_table=table, seqused_k=used)
    # the same keys gathered into a ragged (total_k, ...) tensor for the reference
    k_flat = k_pages[table.long()].flatten(1, 2)  # (b, per_seq * page, hk, d)
    v_flat = v_pages[table.long()].flatten(1, 2)
    cu_k = torch.arange(b + 1, dtype=torch.int32) * per_seq * page
    check(out, None, q, k_flat.flatten(0, 1), v_flat.flatten(0, 1), cu_q, cu_k, causal=True,
          lens_k=lens_k)


def test_varlen_100k_tokens():
    """A ragged batch of more than 100k tokens: 40 prompts of 1-6000 tokens (GQA 8/2, d=128),
    float32 reference."""
    gen = torch.Generator("cuda").manual_seed(100)
    lens = torch.randint(1, 6000, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    lens[3], lens[17] = 0, 1
    assert sum(lens) >= 100_000
    q, k, v, cu_q, cu_k = ragged(lens, lens, 8, 2, 128, torch.bfloat16, gen)
    out = torch.full_like(q, float("nan"))
    cute_fa.forward_varlen(q, k, v, cu_q, cu_k, max(lens), max(lens), causal=True, out=out)
    check(out, None, q, k, v, cu_q, cu_k, causal=True, ref_dtype=torch.float32)


def test_varlen_matches_dense():
    """A uniform ragged batch is the dense call: the same kernel schedule on the same data
    (a grid of more query blocks than SMs, so that the dense call keeps the 128-row tile:
    tuning.is_small_grid)."""
    gen = torch.Generator("cuda").manual_seed(3)
    q = torch.randn(3, 500, 16, 64, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(3, 500, 4, 64, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(3, 500, 4, 64, device="cuda", dtype=torch.float16, generator=gen)
    cu = torch.arange(4, device="cuda", dtype=torch.int32) * 500
    for backend in BACKENDS:
        dense = cute_fa.forward(q, k, v, causal=True, backend=backend)
        ragged_o = cute_fa.forward_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu,
                                          cu, 500, 500, causal=True, backend=backend)
        assert torch.equal(dense.flatten(0, 1), ragged_o), backend
