"""GQA packing's global views in the wgmma forward (`Sm90Key.pack_gqa`), on the CPU: the TMA
view of Q and O (`layouts.tma.tma_view(t, group)`) and the LSE's (`kernels.sched.seqlen.
packed_lse`) put packed row r of K/V head h at query r // group of query head
h * group + r % group, checked element by element against offsets written out here from the
tensors' strides (odd strides, so that no two coordinates share an offset by accident)."""

import itertools

import pytest

cute = pytest.importorskip("cutlass.cute")

import cutlass  # noqa: E402
from cutlass.cute.runtime import make_fake_tensor  # noqa: E402

from cute_fa.kernels.sched.seqlen import packed_lse  # noqa: E402
from cute_fa.layouts.tma import tma_view  # noqa: E402


def _offsets(batch, seqlen, heads, head_dim, group, q_stride, lse_stride):
    """The views' offsets for every coordinate, read inside a traced function (static
    shapes: each evaluates to a Python int)."""
    got = {}

    @cute.jit
    def build(mQ: cute.Tensor, mLSE: cute.Tensor):
        view, lse = tma_view(mQ, group), packed_lse(mLSE, group)
        got["shape"] = (cute.size(view, mode=[0]), cute.size(view, mode=[2]))
        for r, d, h, b in itertools.product(range(group * seqlen), range(head_dim),
                                             range(heads // group), range(batch)):
            got[r, d, h, b] = view.layout((r, d, h, b))
            got["lse", r, h, b] = lse.layout((b, h, r))

    q = make_fake_tensor(cutlass.BFloat16, (batch, seqlen, heads, head_dim), stride=q_stride,
                         assumed_align=16)
    lse = make_fake_tensor(cutlass.Float32, (batch, heads, seqlen), stride=lse_stride,
                           assumed_align=16)
    cute.compile(build, q, lse, options="--gpu-arch=sm_90a")
    return got


@pytest.mark.parametrize("group", [1, 2, 3, 4])
def test_packed_rows_are_query_head_pairs(group):
    batch, seqlen, heads, head_dim = 2, 5, 12, 8
    sb, ss, sh, sd = 7 * 12 * 8 * 3, 12 * 8 * 3, 8 * 3 + 8, 1  # padded, as a sliced qkv is
    lb, lh, ls = 12 * 9 + 5, 9, 1
    got = _offsets(batch, seqlen, heads, head_dim, group, (sb, ss, sh, sd), (lb, lh, ls))
    assert got["shape"] == (group * seqlen, heads // group)
    for r, d, h, b in itertools.product(range(group * seqlen), range(head_dim),
                                        range(heads // group), range(batch)):
        query, head = r // group, h * group + r % group
        assert got[r, d, h, b] == b * sb + query * ss + head * sh + d * sd, (r, d, h, b)
        assert got["lse", r, h, b] == b * lb + head * lh + query * ls, (r, h, b)
