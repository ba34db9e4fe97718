"""cute_fa.forward / cute_fa.sdpa on a GPU against a float64 reference, next to torch SDPA.

For each case the error of cute_fa must be at most about the error of torch SDPA
(its default backend) on the same inputs: max|err_cute_fa| <= 2 * max|err_sdpa| + 1e-3 * scale.
Every case runs on each backend: the sm80 (cp.async) kernel, the TMA kernel and the wgmma kernel.
"""

import math

import pytest

from gpu_grid import OTHER_ARCH_TILES, SHAPES

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

BACKENDS = ["sm80", "tma", "sm90"]


def reference(q, k, v, *, causal, causal_offset, scale):
    """float64 attention in flash-attn's (B, S, H, D) layout, GQA by broadcasting heads."""
    b, sq, hq, d = q.shape
    hk = k.shape[2]
    q64, k64, v64 = (t.double().transpose(1, 2) for t in (q, k, v))
    k64 = k64.repeat_interleave(hq // hk, dim=1)
    v64 = v64.repeat_interleave(hq // hk, dim=1)
    s = scale * q64 @ k64.transpose(-1, -2)
    if causal:
        qi = torch.arange(sq, device=q.device)[:, None]
        ki = torch.arange(k.shape[1], device=q.device)[None, :]
        s = s.masked_fill(ki > qi + causal_offset, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0)[..., None])
    o = (p @ v64).transpose(1, 2)
    return o, lse


def sdpa_error(q, k, v, o_ref, *, causal, causal_offset, scale):
    """max |torch SDPA - reference| on the same inputs (torch's default backend choice)."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    mask = None
    if causal:
        qi = torch.arange(q.shape[1], device=q.device)[:, None]
        ki = torch.arange(k.shape[1], device=q.device)[None, :]
        mask = ki <= qi + causal_offset
    o = torch.nn.functional.scaled_dot_product_attention(
        qt, kt, vt, attn_mask=mask, scale=scale, enable_gqa=True).transpose(1, 2)
    visible = torch.isfinite(o_ref).all(dim=-1, keepdim=True)
    return (o.double() - o_ref).abs().where(visible, 0).nan_to_num(0).max().item()


def rand(*shape, dtype, gen):
    return torch.randn(*shape, device="cuda", dtype=getattr(torch, dtype), generator=gen)


def check_case(o, lse, q, k, v, *, causal, causal_offset, scale):
    o_ref, lse_ref = reference(q, k, v, causal=causal, causal_offset=causal_offset, scale=scale)
    assert not torch.isnan(o).any(), "NaN in output (unwritten or poisoned element)"
    empty = ~torch.isfinite(lse_ref)  # (B, H, Sq) rows with no visible key
    if empty.any():
        assert (o.transpose(1, 2)[empty] == 0).all(), "fully masked rows must be 0"
        if lse is not None:
            assert (lse[empty] == float("-inf")).all(), "fully masked rows must have LSE -inf"
    o_ref = o_ref.where(~empty.transpose(1, 2)[..., None], 0)
    err = (o.double() - o_ref).abs().max().item()
    err_sdpa = sdpa_error(q, k, v, o_ref, causal=causal, causal_offset=causal_offset, scale=scale)
    tol = 2 * err_sdpa + 1e-3 * o_ref.abs().max().item() + 1e-6
    assert err <= tol, f"max err {err:.3g} vs torch SDPA {err_sdpa:.3g}"
    if lse is not None:
        lse_err = (lse.double() - lse_ref).where(~empty, 0).abs().max().item()
        assert lse_err <= 1e-3 * max(1.0, lse_ref.where(~empty, 0).abs().max().item()), lse_err


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-q{}-k{}-h{}/{}-d{}-{}-{}".format(
    *s[:6], "causal" if s[6] else "full", s[7]))
def test_forward_grid(shape, backend):
    _grid_case(shape, backend)


# Other archs' tile tables (gpu_grid.OTHER_ARCH_TILES) run here: no GPU of those kinds is at
# hand, and this is how what they run gets checked against the reference.
@pytest.mark.parametrize("tile_arch, backend", OTHER_ARCH_TILES, ids=lambda x: str(x))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-q{}-k{}-h{}/{}-d{}-{}-{}".format(
    *s[:6], "causal" if s[6] else "full", s[7]))
def test_forward_grid_other_arch_tiles(shape, tile_arch, backend):
    from cute_fa import tiles_of

    with tiles_of(tile_arch):
        _grid_case(shape, backend)


# the wgmma kernel on key blocks of 176 and 192 (head_dim, block_n; two consumer warpgroups),
# whose P V runs 11 or 12 k-steps of P packed two values a register (`convert.pack_pairs`): the
# tiles docs/perf/2026-12-06-h100-sm90-tiles measured (none faster than the tables')
SM90_WIDE = [(64, 192), (128, 176), (128, 192)]


@pytest.mark.parametrize("shape, block_n", [(s, n) for s in SHAPES for d, n in SM90_WIDE
                                            if s[5] == d], ids=lambda x: str(x))
def test_forward_grid_wide_sm90_tiles(shape, block_n):
    from cute_fa.layouts import TileConfig
    from cute_fa.runtime.plan import overriding

    tile = TileConfig(head_dim=shape[5], block_m=128, block_n=block_n, num_threads=256,
                      dtype=shape[7], wgmma=True)
    with overriding(tile=tile, packed_p=True):
        _grid_case(shape, "sm90")


def _grid_case(shape, backend):
    import cute_fa

    b, sq, sk, hq, hk, d, causal, dtype = shape
    gen = torch.Generator(device="cuda").manual_seed(sq * 1000 + sk + d)
    q = rand(b, sq, hq, d, dtype=dtype, gen=gen)
    k = rand(b, sk, hk, d, dtype=dtype, gen=gen)
    v = rand(b, sk, hk, d, dtype=dtype, gen=gen)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    o, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True, out=out, backend=backend)
    assert o.data_ptr() == out.data_ptr()
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32
    check_case(o, lse, q, k, v, causal=causal, causal_offset=sk - sq, scale=1 / math.sqrt(d))
    o2 = cute_fa.forward(q, k, v, causal=causal, backend=backend)
    assert torch.equal(o2, o), "repeat runs must be bitwise identical"


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, dtype): more tiles than a
# small persistent grid's CTAs, so that each CTA loops (its K/V ring, Q's two barriers and the
# ping-pong's turns running on from tile to tile), over tiles of every kind: fully masked rows
# (Sq > Sk, causal: tiles that visit no key block), three consumer warpgroups (head_dim 64,
# not causal), a padded head_dim
PERSISTENT_SHAPES = [
    (2, 700, 700, 8, 2, 128, True, "bfloat16"),
    (2, 700, 700, 8, 2, 128, False, "float16"),
    (1, 1000, 17, 8, 8, 128, True, "bfloat16"),
    (3, 333, 1000, 4, 1, 64, False, "bfloat16"),
    (3, 333, 1000, 4, 1, 64, True, "float16"),
    (1, 129, 130, 6, 2, 40, False, "float16"),
]


@pytest.mark.parametrize("ctas", [1, 5, 132])
@pytest.mark.parametrize("shape", PERSISTENT_SHAPES, ids=lambda s: "b{}-q{}-k{}-h{}/{}-d{}-{}-{}"
                         .format(*s[:6], "causal" if s[6] else "full", s[7]))
def test_persistent_forward(shape, ctas):
    """The persistent wgmma kernel (`Sm90Key.persistent`) on `ctas` CTAs: against the float64
    reference, and bitwise equal to the one-CTA-per-tile kernel (a tile's arithmetic is the
    same; only the CTA that runs it changes)."""
    import cute_fa
    from cute_fa.runtime.plan import overriding

    b, sq, sk, hq, hk, d, causal, dtype = shape
    gen = torch.Generator(device="cuda").manual_seed(sq * 7 + sk + d + ctas)
    q = rand(b, sq, hq, d, dtype=dtype, gen=gen)
    k = rand(b, sk, hk, d, dtype=dtype, gen=gen)
    v = rand(b, sk, hk, d, dtype=dtype, gen=gen)
    with overriding(pack_gqa=1):  # the one-tile kernel of the same rows (persistent: unpacked)
        single, single_lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True,
                                             backend="sm90")
    out = torch.full_like(q, float("nan"))
    with overriding(persistent=ctas, pack_gqa=1):
        o, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True, out=out,
                                 backend="sm90")
    check_case(o, lse, q, k, v, causal=causal, causal_offset=sk - sq, scale=1 / math.sqrt(d))
    assert torch.equal(o, single) and torch.equal(lse, single_lse)
    # causal: the CTAs take tiles from the stream's counter, which each launch's last fetch
    # puts back to zero; launches in a row must each see every tile
    with overriding(persistent=ctas, pack_gqa=1):
        again = [cute_fa.forward(q, k, v, causal=causal, backend="sm90") for _ in range(3)]
    assert all(torch.equal(a, single) for a in again)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_persistent_forward_window_softcap(head_dim):
    """A sliding window and a softcap on the persistent kernel (3 CTAs), bitwise equal to the
    one-CTA-per-tile kernel, whose features the other GPU tests check against references."""
    import cute_fa
    from cute_fa.runtime.plan import overriding

    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    q, k, v = (rand(2, 900, 4, head_dim, dtype="bfloat16", gen=gen) for _ in range(3))
    kwargs = dict(causal=True, window_size=(200, 0), softcap=20.0, backend="sm90")
    single = cute_fa.forward(q, k, v, **kwargs)
    with overriding(persistent=3, pack_gqa=1):
        o = cute_fa.forward(q, k, v, **kwargs)
    assert torch.isfinite(o).all() and torch.equal(o, single)


@pytest.mark.parametrize("tile_arch", [None, "sm_120a"], ids=["own-tiles", "sm120-tiles"])
@pytest.mark.parametrize("ctas", [1, 5, 264])
@pytest.mark.parametrize("shape", PERSISTENT_SHAPES, ids=lambda s: "b{}-q{}-k{}-h{}/{}-d{}-{}-{}"
                         .format(*s[:6], "causal" if s[6] else "full", s[7]))
def test_persistent_tma_forward(shape, ctas, tile_arch):
    """The persistent TMA kernel (`TmaKey.persistent`) on `ctas` CTAs, with this GPU's tiles and
    with sm120's: against the float64 reference, and bitwise equal to the one-CTA-per-tile
    kernel. Each CTA's ring runs on from tile to tile, its last rounds loading the next
    tile's first key blocks; tiles that visit no key block (Sq > Sk, causal) load none."""
    import cute_fa
    from cute_fa.runtime.plan import overriding, tiles_of

    b, sq, sk, hq, hk, d, causal, dtype = shape
    gen = torch.Generator(device="cuda").manual_seed(sq * 5 + sk + d + ctas)
    q = rand(b, sq, hq, d, dtype=dtype, gen=gen)
    k = rand(b, sk, hk, d, dtype=dtype, gen=gen)
    v = rand(b, sk, hk, d, dtype=dtype, gen=gen)
    with tiles_of(tile_arch):
        single, single_lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True,
                                             backend="tma")
    out = torch.full_like(q, float("nan"))
    with tiles_of(tile_arch), overriding(persistent=ctas):
        o, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True, out=out,
                                 backend="tma")
        again = [cute_fa.forward(q, k, v, causal=causal, backend="tma") for _ in range(2)]
    check_case(o, lse, q, k, v, causal=causal, causal_offset=sk - sq, scale=1 / math.sqrt(d))
    assert torch.equal(o, single) and torch.equal(lse, single_lse)
    assert all(torch.equal(a, single) for a in again)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_persistent_tma_window_softcap(head_dim):
    """A sliding window and a softcap on the persistent TMA kernel (3 CTAs; tiles whose
    windows hold different numbers of key blocks), bitwise equal to the one-tile kernel."""
    import cute_fa
    from cute_fa.runtime.plan import overriding

    gen = torch.Generator(device="cuda").manual_seed(head_dim + 1)
    q, k, v = (rand(2, 900, 4, head_dim, dtype="bfloat16", gen=gen) for _ in range(3))
    kwargs = dict(causal=True, window_size=(200, 0), softcap=20.0, backend="tma")
    single = cute_fa.forward(q, k, v, **kwargs)
    with overriding(persistent=3):
        o = cute_fa.forward(q, k, v, **kwargs)
    assert torch.isfinite(o).all() and torch.equal(o, single)


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
@pytest.mark.parametrize("causal", [False, True])
def test_tma_rescale_under_growing_max(causal, lazy):
    """Keys are walked from the last block down; making the early keys much larger makes
    every row's max jump by far more than the lazy threshold (2^8) mid-sweep, so both the
    kept-stale-max path and the rescale path run."""
    import cute_fa
    from cute_fa.runtime.plan import overriding

    gen = torch.Generator(device="cuda").manual_seed(21 + causal)
    b, s, h, d = 1, 700, 4, 128
    q = rand(b, s, h, d, dtype="bfloat16", gen=gen) * 2
    k = rand(b, s, h, d, dtype="bfloat16", gen=gen)
    k[:, : s // 2] *= 6
    v = rand(b, s, h, d, dtype="bfloat16", gen=gen)
    out = torch.full_like(q, float("nan"))
    with overriding(lazy_rescale=lazy):
        o, lse = cute_fa.forward(q, k, v, causal=causal, out=out, return_lse=True, backend="tma")
    check_case(o, lse, q, k, v, causal=causal, causal_offset=0, scale=1 / math.sqrt(d))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_entry_point_top_left(causal, backend):
    import cute_fa

    gen = torch.Generator(device="cuda").manual_seed(5)
    b, h, sq, sk, d = 2, 4, 100, 170, 64
    q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(b, h, sk, d, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(b, h, sk, d, device="cuda", dtype=torch.float16, generator=gen)
    o = cute_fa.sdpa(q, k, v, is_causal=causal, scale=0.1, backend=backend)
    assert o.shape == q.shape
    check_case(o.transpose(1, 2), None, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
               causal=causal, causal_offset=0, scale=0.1)
    if causal:  # torch's own is_causal is top-left
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.1)
        assert (o.float() - ref.float()).abs().max().item() < 2e-2


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_qkv_strides(backend):
    import cute_fa

    gen = torch.Generator(device="cuda").manual_seed(9)
    b, s, h, d = 2, 333, 4, 128
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    q, k, v = qkv.unbind(2)  # non-contiguous views into one buffer
    assert not q.is_contiguous()
    o, lse = cute_fa.forward(q, k, v, causal=True, return_lse=True, backend=backend)
    check_case(o, lse, q, k, v, causal=True, causal_offset=0, scale=1 / math.sqrt(d))
    o_contig = cute_fa.forward(q.contiguous(), k.contiguous(), v.contiguous(), causal=True,
                               backend=backend)
    assert torch.equal(o, o_contig)


@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_scale_and_non_contiguous_out(backend):
    import cute_fa

    gen = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(1, 80, 2, 64, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(1, 80, 2, 64, device="cuda", dtype=torch.float16, generator=gen)
    big = torch.full((1, 2, 64, 64), float("nan"), device="cuda", dtype=torch.float16)
    out = big.transpose(1, 2)  # (1, 64, 2, 64) view with head-major strides
    o = cute_fa.forward(q, k, v, softmax_scale=0.3, out=out, backend=backend)
    assert o.data_ptr() == big.data_ptr()
    check_case(o, None, q, k, v, causal=False, causal_offset=0, scale=0.3)


def test_bad_input_leaves_out_untouched():
    import cute_fa

    q = torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.float16)
    out = torch.full_like(q, 7.0)
    with pytest.raises(ValueError, match="v must have the shape of k"):
        cute_fa.forward(q, k, k[:, :8], out=out)
    with pytest.raises(TypeError, match="share a dtype"):
        cute_fa.forward(q, k, k.bfloat16(), out=out)
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        cute_fa.forward(q.cpu(), k, k, out=out)
    misaligned = torch.empty(q.numel() + 8, device="cuda", dtype=q.dtype)[1:1 + q.numel()]
    with pytest.raises(ValueError, match="16-byte"):
        cute_fa.forward(misaligned.view(q.shape), k, k, out=out)
    with pytest.raises(ValueError, match="backend must be one of 'sm80', 'tma', 'sm90', 'auto'"):
        cute_fa.forward(q, k, k, out=out, backend="cudnn")
    assert (out == 7.0).all()
