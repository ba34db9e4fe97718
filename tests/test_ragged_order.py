"""A ragged batch's tile order (`KernelKey.varlen_order`, `cute_fa.runtime.ragged_order`) on
the CPU: each tile's work against an enumeration written here, the order a stable sort of it
(most work first, ties in entry and query block order, every tile once), its packing the
kernels' (`kernels.sched.tile_scheduler.BLOCK_BITS`), the list kept while its tensors are
unchanged; the planned key and the list a call hands its kernel, with the launch stood in
(`launch_recording`); the keys' rules; and the ordered kernels compiled without spills."""

import dataclasses
import itertools

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402
from launch_recording import launches  # noqa: E402,F401  (a fixture)
from launch_recording import named_arguments  # noqa: E402

from cute_fa.runtime import ragged_order  # noqa: E402
from cute_fa.runtime.plan import overriding  # noqa: E402

LENS_Q, LENS_K = [100, 0, 1000, 300, 1, 513], [300, 50, 1000, 300, 129, 513]


def cu(lengths):
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def work_by_hand(lens_q, lens_k, max_q, block_m, block_n, causal):
    """{(entry, block): key blocks} of every tile, -1 past the entry's queries: a tile's last
    query sees keys up to its row + len_k - len_q under causal (bottom-right), all else."""
    out = {}
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        for m in range(-(-max_q // block_m)):
            if m * block_m >= lq:
                out[b, m] = -1
                continue
            keys = lk
            if causal:  # the block's last row, (m + 1) * block_m - 1, bounds what it visits
                keys = max(0, min(lk, (m + 1) * block_m + lk - lq))
            out[b, m] = -(-keys // block_n)
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tile", [(128, 128), (64, 176)])
@pytest.mark.parametrize("used", [False, True])
def test_tile_work_and_order(causal, tile, used):
    block_m, block_n = tile
    lens_k = LENS_K
    seqused = None
    if used:  # seqused_k counts each entry's keys instead of cu_seqlens_k
        lens_k = [7, 50, 999, 0, 129, 200]
        seqused = torch.tensor(lens_k, dtype=torch.int32)
    work = ragged_order.tile_work(cu(LENS_Q), cu(LENS_K), seqused, 0, 1000, block_m, block_n,
                                  causal)
    want = work_by_hand(LENS_Q, lens_k, 1000, block_m, block_n, causal)
    assert {(b, m): int(work[b, m]) for b, m in want} == want
    order = ragged_order.tile_order(work)
    assert order.dtype == torch.int32 and order.shape == (len(want),)
    bits = ragged_order.BLOCK_BITS
    tiles = [(int(e) >> bits, int(e) & ((1 << bits) - 1)) for e in order]
    assert tiles == sorted(want, key=lambda t: (-want[t], t))  # a stable sort, most work first


def test_one_length_for_every_entry():
    """No cu_seqlens_k nor seqused_k (a paged cache's capacity): every entry has seqlen_k."""
    work = ragged_order.tile_work(cu([5, 300]), None, None, 640, 300, 128, 128, False)
    assert work.tolist() == [[5, -1, -1], [5, 5, 5]]


def test_packing_is_the_kernels():
    from cute_fa.kernels.sched.tile_scheduler import BLOCK_BITS

    assert BLOCK_BITS == ragged_order.BLOCK_BITS


def test_order_is_kept_while_its_tensors_are_unchanged():
    cu_q, cu_k = cu(LENS_Q), cu(LENS_K)
    first = ragged_order.ragged_order(cu_q, cu_k, None, 0, 1000, 128, 128, True)
    assert ragged_order.ragged_order(cu_q, cu_k, None, 0, 1000, 128, 128, True) is first
    assert ragged_order.ragged_order(cu_q, cu_k, None, 0, 1000, 128, 128, False) is not first
    cu_q[-1] = cu_q[-2]  # in place: the last entry is now empty
    again = ragged_order.ragged_order(cu_q, cu_k, None, 0, 1000, 128, 128, True)
    assert again is not first and not torch.equal(again, first)


def test_too_large_a_batch_is_refused():
    with pytest.raises(ValueError, match="too large for an ordered grid"):
        ragged_order.tile_order(torch.zeros(1, 1 << 16, dtype=torch.int64))


@pytest.mark.parametrize("backend, kernel", [("auto", "sm90"), ("sm80", "sm80"), ("tma", "tma")])
def test_ordered_call_hands_its_kernel_the_list(launches, backend, kernel):
    recorded, _ = launches
    q = torch.randn(sum(LENS_Q), 4, 64, dtype=torch.bfloat16)
    k = torch.randn(sum(LENS_K), 2, 64, dtype=torch.bfloat16)
    with overriding(varlen_order=True, lpt=False):
        cute_fa.forward_varlen(q, k, k, cu(LENS_Q), cu(LENS_K), 1000, 1000, causal=True,
                               backend=backend)
    cute_fa.forward_varlen(q, k, k, cu(LENS_Q), cu(LENS_K), 1000, 1000, causal=True,
                           backend=backend)
    (key, args), (plain, plain_args) = recorded
    assert key.backend == kernel and key.varlen_order and not key.lpt
    assert not plain.varlen_order and named_arguments(plain, plain_args)["tile_order"] is None
    order = named_arguments(key, args)["tile_order"]
    want = work_by_hand(LENS_Q, LENS_K, 1000, key.tile.block_m, key.tile.block_n, True)
    bits = ragged_order.BLOCK_BITS
    assert [(int(e) >> bits, int(e) & ((1 << bits) - 1)) for e in order] == \
        sorted(want, key=lambda t: (-want[t], t))


def test_keys_refuse_what_the_order_cannot_hold():
    from cute_fa.tuning import kernel_key

    dense = kernel_key("sm_90a", "bfloat16", 128, False, "sm90")
    with pytest.raises(ValueError, match="varlen_order"):
        dataclasses.replace(dense, varlen_order=True)
    ragged = kernel_key("sm_90a", "bfloat16", 128, True, "sm90", varlen=True)
    assert ragged.lpt  # off by default (tuning.VARLEN_ORDER): lpt within each entry
    with pytest.raises(ValueError, match="no lpt"):
        dataclasses.replace(ragged, varlen_order=True)
    assert dataclasses.replace(ragged, varlen_order=True, lpt=False).varlen_order


@pytest.mark.parametrize("arch, backend, causal", [("sm_90a", "sm90", True),
                                                   ("sm_80", "sm80", False),
                                                   ("sm_120a", "tma", True)])
def test_ordered_kernels_compile(arch, backend, causal):
    """The ordered kernels read their tile from the list (entry >> 16, block & 0xffff) and
    compile without spills, as the plain ragged kernels do."""
    import re

    from cute_fa.compile.build import compile_kernel
    from cute_fa.compile.ptxas import ptxas_resources
    from cute_fa.tuning import kernel_key

    key = dataclasses.replace(kernel_key(arch, "bfloat16", 128, causal, backend, varlen=True),
                              lpt=False, varlen_order=True)
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    assert re.search(r"shr\.[su]32\s+%r\d+, %r\d+, 16;", ptx)
    res = ptxas_resources(ptx, arch)
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0, res["log"]
