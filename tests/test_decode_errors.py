"""Decode arguments (seqused_k, page_table, num_splits, a paged k/v) and merge_attention:
bad input raises a clear error naming the argument, before any launch (CPU tensors suffice).

Every argument rule runs before the device checks, so on CPU tensors a bad decode argument is
refused by name, and a good one gets as far as "q must be on a CUDA device". Each test below
therefore fails on code without the check it names: there, the call stops at the device check
(or at the dense shape rules), whose message names none of the decode arguments. Errors about
types and dtypes are TypeErrors, errors about shapes and values are ValueErrors, as for the
existing arguments (tests/test_interface_errors.py).
"""

from contextlib import contextmanager

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402
from cute_fa import tuning  # noqa: E402

DEVICE = "must be on a CUDA device"  # where a valid call on CPU tensors stops
# the largest page size forward takes (the issue asks for 512 at least)
MAX_PAGE_SIZE = tuning.MAX_PAGE_SIZE


@contextmanager
def refused(exc, name):
    """pytest.raises(exc, match=name), where Python's own 'unexpected keyword argument' (a
    forward without the argument at all) does not count as the check."""
    with pytest.raises(exc, match=name) as info:
        yield
    assert "unexpected keyword argument" not in str(info.value), str(info.value)


def qkv(b=2, sq=1, sk=64, hq=8, hk=2, d=64, dtype=torch.bfloat16):
    return (torch.randn(b, sq, hq, d, dtype=dtype), torch.randn(b, sk, hk, d, dtype=dtype),
            torch.randn(b, sk, hk, d, dtype=dtype))


def paged(b=2, sq=1, num_pages=7, page_size=64, pages_per_seq=3, hq=8, hk=2, d=64,
          dtype=torch.bfloat16):
    """q, a paged k/v pool (num_pages, page_size, hk, d) and an int32 page table."""
    q = torch.randn(b, sq, hq, d, dtype=dtype)
    k = torch.randn(num_pages, page_size, hk, d, dtype=dtype)
    v = torch.randn(num_pages, page_size, hk, d, dtype=dtype)
    table = torch.randperm(num_pages)[:b * pages_per_seq].view(b, pages_per_seq).to(torch.int32)
    return q, k, v, table


# --- valid calls reach the device check: the new rules refuse nothing they should accept ------

@pytest.mark.parametrize("page_size", sorted({16, 48, 64, 256, 512, MAX_PAGE_SIZE}))
def test_valid_paged_call_reaches_device_check(page_size):
    q, k, v, table = paged(page_size=page_size)
    with refused(ValueError, DEVICE):
        cute_fa.forward(q, k, v, causal=True, page_table=table)
    with refused(ValueError, DEVICE):
        cute_fa.forward(q, k, v, page_table=table, num_splits=3,
                        seqused_k=torch.tensor([0, 100], dtype=torch.int32))


def test_valid_dense_decode_call_reaches_device_check():
    import numpy as np

    q, k, v = qkv()
    seqused = torch.tensor([0, 64], dtype=torch.int32)
    for num_splits in (None, 1, 2, 16, np.int64(4)):  # numpy's ints are ints, like its floats
        with refused(ValueError, DEVICE):
            cute_fa.forward(q, k, v, causal=True, seqused_k=seqused, num_splits=num_splits)


def test_paged_pool_need_not_match_batch():
    """A paged pool's leading dimension is its page count, not the batch: the dense rule
    'k must have shape (batch, ...)' must not fire for it."""
    q, k, v, table = paged(b=3, num_pages=10, pages_per_seq=2)
    with refused(ValueError, DEVICE):
        cute_fa.forward(q, k, v, page_table=table)


# --- seqused_k --------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, exc", [
    ([0, 64], TypeError),                                       # not a tensor
    (torch.tensor([0, 64], dtype=torch.int64), TypeError),      # int64
    (torch.tensor([0.0, 64.0]), TypeError),                     # float
    (torch.tensor([0, 64, 5], dtype=torch.int32), ValueError),  # batch + 1 entries
    (torch.tensor([64], dtype=torch.int32), ValueError),        # batch - 1 entries
    (torch.tensor([[0], [64]], dtype=torch.int32), ValueError),  # (B, 1)
    (torch.tensor(64, dtype=torch.int32), ValueError),          # a scalar
])
def test_seqused_k_type_dtype_shape(bad, exc):
    q, k, v = qkv()
    out = torch.full_like(q, 3.0)
    with refused(exc, "seqused_k"):
        cute_fa.forward(q, k, v, seqused_k=bad, out=out)
    assert (out == 3.0).all()  # untouched
    q, k, v, table = paged()  # the same rules for a paged cache
    with refused(exc, "seqused_k"):
        cute_fa.forward(q, k, v, page_table=table, seqused_k=bad)


# --- page_table and the paged pool ------------------------------------------------------------

@pytest.mark.parametrize("mutate, exc", [
    (lambda t: t.tolist(), TypeError),                 # not a tensor
    (lambda t: t.to(torch.int64), TypeError),          # int64
    (lambda t: t.float(), TypeError),                  # float
    (lambda t: t.flatten(), ValueError),               # 1-D
    (lambda t: t[None], ValueError),                   # 3-D
    (lambda t: t[:1], ValueError),                     # batch - 1 rows
    (lambda t: torch.cat([t, t[:1]]), ValueError),     # batch + 1 rows
])
def test_page_table_type_dtype_shape(mutate, exc):
    q, k, v, table = paged()
    out = torch.full_like(q, 3.0)
    with refused(exc, "page_table"):
        cute_fa.forward(q, k, v, page_table=mutate(table), out=out)
    assert (out == 3.0).all()


@pytest.mark.parametrize("page_size", [8, 24, 40, 100, MAX_PAGE_SIZE + 16, 2 * MAX_PAGE_SIZE])
def test_unsupported_page_size(page_size):
    """Pages hold a multiple of 16 keys, at most MAX_PAGE_SIZE: anything else is refused by
    name."""
    q, k, v, table = paged(page_size=page_size)
    out = torch.full_like(q, 3.0)
    with refused(ValueError, "page_size|page size"):
        cute_fa.forward(q, k, v, page_table=table, out=out)
    assert (out == 3.0).all()


def test_paged_k_v_shapes():
    q, k, v, table = paged()
    with refused(ValueError, "v must have the shape of k"):
        cute_fa.forward(q, k, v[:-1], page_table=table)
    with refused(ValueError, "v must have the shape of k"):
        cute_fa.forward(q, k, v[:, :32], page_table=table)
    with refused(ValueError, r"\bk\b"):  # a pool of another head_dim than q's
        cute_fa.forward(q, k[..., :32], v[..., :32], page_table=table)
    with refused(ValueError, "multiple of the number of key/value heads"):
        q3 = torch.randn(2, 1, 3, 64, dtype=q.dtype)
        cute_fa.forward(q3, k, v, page_table=table)
    with refused(TypeError, "share a dtype"):
        cute_fa.forward(q, k, v.half(), page_table=table)


# --- num_splits ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, exc", [
    (0, ValueError), (-1, ValueError), (-16, ValueError),
    (2.0, TypeError), ("2", TypeError), (True, TypeError),  # bool is not a split count
])
def test_num_splits(bad, exc):
    q, k, v = qkv()
    out = torch.full_like(q, 3.0)
    with refused(exc, "num_splits"):
        cute_fa.forward(q, k, v, num_splits=bad, out=out)
    assert (out == 3.0).all()
    q, k, v, table = paged()
    with refused(exc, "num_splits"):
        cute_fa.forward(q, k, v, page_table=table, num_splits=bad)


def test_decode_arguments_are_keyword_only():
    q, k, v = qkv()
    seqused = torch.tensor([1, 1], dtype=torch.int32)
    with refused(ValueError, DEVICE):
        cute_fa.forward(q, k, v, False, None, False, None, "auto", seqused_k=seqused)
    with pytest.raises(TypeError, match="positional"):
        cute_fa.forward(q, k, v, False, None, False, None, "auto", seqused)


def test_tma_backend_takes_no_decode_arguments():
    """The cp.async kernel runs decode: backend='tma' with a KV-cache argument or a split is
    refused by name rather than silently run on another kernel."""
    q, k, v = qkv()
    k_pages, v_pages, table = paged()[1:]
    seqused = torch.tensor([0, 64], dtype=torch.int32)
    for kv, kwargs in (((k_pages, v_pages), dict(page_table=table)),
                       ((k, v), dict(seqused_k=seqused)), ((k, v), dict(num_splits=2))):
        with refused(ValueError, "backend"):
            cute_fa.forward(q, *kv, backend="tma", **kwargs)
    with refused(ValueError, DEVICE):  # one split is no split
        cute_fa.forward(q, k, v, backend="tma", num_splits=1)


# --- merge_attention ------------------------------------------------------------------------

def parts(p=3, b=2, s=4, h=5, d=64, dtype=torch.float32):
    return torch.randn(p, b, s, h, d, dtype=dtype), torch.randn(p, b, h, s)


def test_merge_valid_cpu_call_reaches_device_check():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        o, lse = parts(dtype=dtype)
        with refused(ValueError, DEVICE):
            cute_fa.merge_attention(o, lse)


@pytest.mark.parametrize("mutate, exc, name", [
    (lambda o, l: (o.numpy(), l), TypeError, "o_parts"),
    (lambda o, l: (o, l.tolist()), TypeError, "lse_parts"),
    (lambda o, l: (o.double(), l), TypeError, "o_parts"),          # float64 o
    (lambda o, l: (o.to(torch.int32), l), TypeError, "o_parts"),
    (lambda o, l: (o, l.half()), TypeError, "lse_parts"),           # lse must be float32
    (lambda o, l: (o, l.double()), TypeError, "lse_parts"),
    (lambda o, l: (o[0], l), ValueError, "o_parts"),                 # 4-D o: no parts axis
    (lambda o, l: (o, l[0]), ValueError, "lse_parts"),               # 3-D lse
    (lambda o, l: (o, l.transpose(2, 3)), ValueError, "lse_parts"),  # S and H swapped
    (lambda o, l: (o, l[:2]), ValueError, "lse_parts"),              # fewer parts than o
    (lambda o, l: (o, l[:, :1]), ValueError, "lse_parts"),           # another batch
    (lambda o, l: (o, l[..., :3]), ValueError, "lse_parts"),         # another seqlen
])
def test_merge_argument_checks(mutate, exc, name):
    o, lse = mutate(*parts())
    with refused(exc, name):
        cute_fa.merge_attention(o, lse)
