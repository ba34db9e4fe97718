"""What `forward` hands each kernel, recorded on the CPU (the compiler and the launch stood in):
one argument per entry of the kernel's registered argument list, in that order, for the
prefill kernels, an unsplit decode call, and a split one with its merge; None exactly where
the kernel's key does not take the argument (as it was compiled), a value everywhere else."""

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402
from launch_recording import launches  # noqa: E402,F401  (a fixture)
from launch_recording import named_arguments as _named  # noqa: E402

from cute_fa.compile.registry import used_arguments  # noqa: E402


def _takes_exactly_what_its_key_uses(key, args):
    for arg, used in zip(args, used_arguments(key)):
        assert (arg is not None) == used, (key, args)


def qkv(b=2, sq=300, sk=300, hq=8, hk=2, d=64):
    return (torch.randn(b, sq, hq, d, dtype=torch.bfloat16),
            torch.randn(b, sk, hk, d, dtype=torch.bfloat16),
            torch.randn(b, sk, hk, d, dtype=torch.bfloat16))


@pytest.mark.parametrize("backend", ["sm80", "tma", "sm90"])
def test_prefill(launches, backend):
    recorded, held = launches
    q, k, v = qkv()
    out = cute_fa.forward(q, k, v, causal=True, backend=backend)
    (key, args), = recorded
    assert key.backend == backend
    _takes_exactly_what_its_key_uses(key, args)
    named = _named(key, args)
    assert named["q"] is q and named["out"] is out and named["lse"] is held
    assert named["causal_offset"] == 0 and named["write_lse"] == 0
    assert named["window_left"] is None and named["softcap"] is None
    assert named["cu_seqlens_q"] is None and named["max_seqlen_q"] is None
    if backend == "sm80":
        assert named["seqused_k"] is None and named["page_table"] is None
        assert named["num_splits"] is None
    else:  # the TMA-fed kernels have no decode arguments at all
        assert not {"seqused_k", "page_table", "num_splits"} & set(named)


def test_decode_unsplit_paged(launches):
    recorded, held = launches
    q, _, _ = qkv(sq=1)
    pages = torch.randn(20, 64, 2, 64, dtype=torch.bfloat16)
    table = torch.zeros(2, 4, dtype=torch.int32)
    lens = torch.tensor([5, 200], dtype=torch.int32)
    out, lse = cute_fa.forward(q, pages, pages, causal=True, page_table=table, seqused_k=lens,
                               num_splits=1, return_lse=True)
    (key, args), = recorded
    _takes_exactly_what_its_key_uses(key, args)
    named = _named(key, args)
    assert key.page_size == 64 and key.seqused_k and key.pack_gqa == 4 and not key.split_kv
    assert named["out"] is out and named["lse"] is lse and named["write_lse"] == 1
    assert named["seqused_k"] is lens and named["page_table"] is table
    assert named["num_splits"] is None


def test_decode_split_then_merge(launches):
    recorded, held = launches
    q, k, v = qkv(sq=1, sk=4096)
    user_out = torch.empty_like(q)
    cute_fa.forward(q, k, v, causal=True, num_splits=5, out=user_out)
    (split_key, split_args), (merge_key, merge_args) = recorded
    _takes_exactly_what_its_key_uses(split_key, split_args)
    named = _named(split_key, split_args)
    assert split_key.split_kv and named["num_splits"] == 5 and named["write_lse"] == 1
    assert named["out"].dtype == torch.float32 and named["out"].shape == (5 * 2, 1, 8, 64)
    assert named["lse"].shape == (5 * 2, 8, 1)
    assert named["seqused_k"] is None and named["page_table"] is None
    merged = _named(merge_key, merge_args)
    assert merge_key.in_dtype == "float32" and merge_key.out_dtype == "bfloat16"
    assert merged["o_parts"].shape == (5, 2, 1, 8, 64)
    assert merged["out"] is user_out and merged["lse"] is held and merged["write_lse"] == 0
