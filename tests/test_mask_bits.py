"""The wgmma kernels' bit-mask form of the mask (`kernels.common.mask`): the shape of a thread's
column offsets, and the closed-form count of the columns a limit keeps, against counting them
one by one."""

import pytest

from cute_fa.kernels.common.mask import bit_mask_runs, count_at_most, run_shape


def _offsets(run, stride, n):
    return tuple(stride * (j // run) + j % run for j in range(n))


@pytest.mark.parametrize("run, stride, n", [(2, 8, 32), (2, 8, 44), (2, 8, 20), (2, 8, 2),
                                            (1, 1, 16), (1, 4, 8), (4, 16, 24)])
def test_count_at_most_counts_the_offsets_up_to_the_limit(run, stride, n):
    offsets = _offsets(run, stride, n)
    assert run_shape(offsets) is not None
    shape = run_shape(offsets)
    # the shape found describes the same offsets (a run of 1 every 1 is also runs of 2 every 2)
    assert _offsets(shape[0], shape[1], n) == offsets
    for limit in range(-3 * stride, offsets[-1] + 3 * stride):
        assert count_at_most(limit, shape, n) == sum(o <= limit for o in offsets), limit


def test_run_shape_refuses_other_offsets():
    assert run_shape((0, 1, 8, 10)) is None
    assert run_shape((0, 2, 1, 3)) is None
    assert run_shape((1, 2, 3)) is None


def test_the_bit_mask_form_refuses_other_offsets():
    """A kernel asking for the bit-mask form with columns not in runs fails at tracing, rather
    than getting another form of the mask silently."""
    assert bit_mask_runs(_offsets(2, 8, 32)) == (2, 8)
    with pytest.raises(ValueError,
                       match=r"runs of 1, 2, 4 or 8 at a fixed stride, got \(0, 1, 8, 10\)"):
        bit_mask_runs((0, 1, 8, 10))
