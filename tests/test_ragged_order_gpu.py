"""A ragged batch's forward with its tiles in the most-work-first list (`KernelKey.varlen_order`)
on a GPU, each backend, causal or not, GQA, empty and one-token entries: bitwise equal to the
plan's grid (each tile's arithmetic is the same, only the order CTAs start in differs), every
row written (outputs start poisoned), against the float64 reference per entry."""

import itertools
import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import cute_fa  # noqa: E402
from cute_fa.runtime.plan import overriding  # noqa: E402

LENS = [300, 0, 1, 4096, 77, 1000, 2049]


@pytest.mark.parametrize("backend", ["sm80", "tma", "sm90"])
@pytest.mark.parametrize("causal", [True, False])
def test_ordered_tiles_change_nothing(backend, causal):
    if backend == "sm90" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wgmma kernel runs on sm90 GPUs only")
    gen = torch.Generator(device="cuda").manual_seed(83)
    q = torch.randn(sum(LENS), 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(sum(LENS), 2, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    cu = torch.tensor([0, *itertools.accumulate(LENS)], device="cuda", dtype=torch.int32)
    plain = cute_fa.forward_varlen(q, k, v, cu, cu, max(LENS), max(LENS), causal=causal,
                                   backend=backend, return_lse=True)
    out = torch.full_like(q, math.nan)
    with overriding(varlen_order=True, lpt=False):
        ordered = cute_fa.forward_varlen(q, k, v, cu, cu, max(LENS), max(LENS), causal=causal,
                                         backend=backend, return_lse=True, out=out)
    assert torch.equal(ordered[0], plain[0]) and torch.equal(ordered[1], plain[1])
    for i, n in enumerate(LENS):
        if n == 0:
            continue
        rows = slice(sum(LENS[:i]), sum(LENS[:i + 1]))
        qd, kd, vd = (t[rows].double().transpose(0, 1) for t in (q, k, v))
        kd, vd = kd.repeat_interleave(4, 0), vd.repeat_interleave(4, 0)
        s = qd @ kd.transpose(1, 2) / math.sqrt(128)
        if causal:
            s = s.masked_fill(torch.ones(n, n, device="cuda", dtype=torch.bool).triu(1),
                              -math.inf)
        ref = (torch.softmax(s, -1) @ vd).transpose(0, 1)
        assert (ordered[0][rows].double() - ref).abs().max().item() < 2e-2, i
