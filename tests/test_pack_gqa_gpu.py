"""GQA packing in the wgmma kernel (`Sm90Key.pack_gqa`) on a GPU: the query heads of a K/V
group share a tile, their rows interleaved (row r: query r // group of head r % group), Q and O
moved by TMA boxes of whole groups, LSE stored by packed row. Against the float64 reference
(`test_forward_gpu.check_case`: error at most about torch SDPA's on the same inputs), with a
poisoned `out=`, at every head_dim class, causal (bottom-right, also with more keys than
queries and fewer) and not, queries that end mid-box, and windows and softcaps against
`test_varlen_gpu`'s reference."""

import math

import pytest

from test_forward_gpu import check_case, rand

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, dtype)
SHAPES = [
    (1, 2000, 2000, 32, 8, 128, True, "bfloat16"),
    (2, 333, 333, 16, 2, 128, True, "float16"),
    (1, 77, 1000, 8, 2, 128, True, "bfloat16"),  # causal offset 923
    (2, 1000, 77, 8, 2, 64, True, "bfloat16"),  # rows that see no key
    (1, 1, 300, 16, 1, 64, False, "float16"),  # one query: a box of 16 rows, 112 of OOB fill
    (3, 511, 513, 64, 8, 64, True, "bfloat16"),
    (2, 700, 700, 32, 8, 64, False, "float16"),  # three consumer warpgroups (192 rows)
    (1, 1500, 1500, 8, 4, 192, True, "bfloat16"),
    (2, 300, 900, 8, 2, 192, False, "float16"),
    (1, 1025, 1025, 4, 2, 256, True, "bfloat16"),
    (2, 129, 400, 16, 8, 256, False, "float16"),
    (1, 257, 257, 32, 2, 128, True, "bfloat16"),  # a group of 16
    (2, 600, 600, 12, 3, 96, True, "float16"),  # a padded head_dim
]


def _ids(s):
    return "b{}-q{}-k{}-h{}/{}-d{}-{}-{}".format(*s[:6], "causal" if s[6] else "full", s[7])


def _packed_forward(q, k, v, **kwargs):
    import cute_fa
    from cute_fa.runtime.plan import overriding

    with overriding(pack_gqa=q.shape[2] // k.shape[2]):
        return cute_fa.forward(q, k, v, backend="sm90", **kwargs)


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_packed_forward(shape):
    import cute_fa

    b, sq, sk, hq, hk, d, causal, dtype = shape
    gen = torch.Generator(device="cuda").manual_seed(sq * 31 + sk + d + hq)
    q = rand(b, sq, hq, d, dtype=dtype, gen=gen)
    k = rand(b, sk, hk, d, dtype=dtype, gen=gen)
    v = rand(b, sk, hk, d, dtype=dtype, gen=gen)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    o, lse = _packed_forward(q, k, v, causal=causal, return_lse=True, out=out)
    assert o.data_ptr() == out.data_ptr()
    check_case(o, lse, q, k, v, causal=causal, causal_offset=sk - sq, scale=1 / math.sqrt(d))
    # the packed kernel ran (not the unpacked one): its outputs differ from the unpacked
    # kernel's in rounding only, never bitwise equal everywhere on a causal call whose tiles
    # visit different key blocks; the launch record is the CPU test's
    again = _packed_forward(q, k, v, causal=causal)
    assert torch.equal(again, o), "repeat runs must be bitwise identical"
    unpacked = cute_fa.forward(q, k, v, causal=causal, backend="sm90")
    assert (unpacked.float() - o.float()).abs().max().item() < 0.05


@pytest.mark.parametrize("window, softcap", [((100, 0), 0.0), ((64, 32), 0.0), ((-1, -1), 30.0),
                                             ((300, 0), 20.0)])
@pytest.mark.parametrize("causal", [True, False])
def test_packed_window_softcap(window, softcap, causal):
    from test_varlen_gpu import check

    gen = torch.Generator("cuda").manual_seed(window[0] + 7 * window[1] + int(softcap) + causal)
    sq, sk = 900, 1300
    q = torch.randn(2, sq, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(2, sk, 2, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(2, sk, 2, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = torch.full_like(q, float("nan"))
    o, lse = _packed_forward(q, k, v, causal=causal, window_size=window, softcap=softcap,
                             return_lse=True, out=out)
    cu_q = torch.arange(3, dtype=torch.int32) * sq
    cu_k = torch.arange(3, dtype=torch.int32) * sk
    check(o.flatten(0, 1), lse.transpose(0, 1).flatten(1, 2), q.flatten(0, 1), k.flatten(0, 1),
          v.flatten(0, 1), cu_q, cu_k, causal=causal, window=window, softcap=softcap)


def test_packed_strided_views():
    """Q and O as views of a larger buffer (a fused QKV projection's): the tensor maps take
    their strides, not a contiguous layout's."""
    import cute_fa  # noqa: F401

    gen = torch.Generator("cuda").manual_seed(3)
    b, s, hq, hk, d = 2, 400, 16, 4, 128
    qkv = torch.randn(b, s, hq + 2 * hk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    q, k, v = qkv.split([hq, hk, hk], dim=2)
    big = torch.full((b, s, hq * 2, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = big[:, :, ::2]
    o, lse = _packed_forward(q, k, v, causal=True, return_lse=True, out=out)
    assert torch.isnan(big[:, :, 1::2]).all(), "the packed store wrote outside out's view"
    check_case(o, lse, q, k, v, causal=True, causal_offset=0, scale=1 / math.sqrt(d))
