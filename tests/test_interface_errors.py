"""Bad input raises a clear error naming the argument, before any launch (CPU tensors suffice)."""

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402


def qkv(b=1, sq=16, sk=16, hq=2, hk=2, d=64, dtype=torch.float16):
    return (torch.randn(b, sq, hq, d, dtype=dtype), torch.randn(b, sk, hk, d, dtype=dtype),
            torch.randn(b, sk, hk, d, dtype=dtype))


def test_wrong_types():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        cute_fa.forward(q.numpy(), k, v)
    with pytest.raises(TypeError, match="k must be float16 or bfloat16"):
        cute_fa.forward(q, k.float(), v)
    with pytest.raises(TypeError, match="share a dtype"):
        cute_fa.forward(q, k, v.bfloat16())
    with pytest.raises(TypeError, match="causal must be a bool"):
        cute_fa.forward(q, k, v, causal=1)


@pytest.mark.parametrize("mutate, match", [
    (lambda q, k, v: (q[0], k, v), "q must be 4-D"),
    (lambda q, k, v: (q, k, v[:, :8]), "v must have the shape of k"),
    (lambda q, k, v: (q, k[..., :32], v[..., :32]), "k must have shape"),
    (lambda q, k, v: (q, torch.randn(1, 16, 2, 68, dtype=k.dtype)[..., :64], v),
     "k strides must be multiples of 8"),
    (lambda q, k, v: (q[..., :60], k[..., :60], v[..., :60]), "strides|head_dim"),
    (lambda q, k, v: (torch.randn(1, 16, 64, 2, dtype=q.dtype).transpose(-1, -2), k, v),
     "q must have a contiguous last dimension"),
])
def test_bad_shapes_and_strides(mutate, match):
    from cute_fa.api.checks import plain_call

    args = mutate(*qkv())
    assert plain_call(*args, None, None, False, False, "auto") is None  # the fast path never waves it on
    with pytest.raises(ValueError, match=match):
        cute_fa.forward(*args)


def test_head_dim_rules():
    with pytest.raises(ValueError, match="head_dim"):
        cute_fa.forward(*qkv(d=72 + 4))
    with pytest.raises(ValueError, match="head_dim"):
        cute_fa.forward(*qkv(d=264))


def test_gqa_ratio():
    with pytest.raises(ValueError, match="multiple of the number of key/value heads"):
        cute_fa.forward(*qkv(hq=6, hk=4))


def test_scale_and_out():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="softmax_scale"):
        cute_fa.forward(q, k, v, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="softmax_scale"):
        cute_fa.forward(q, k, v, softmax_scale=float("nan"))
    out = torch.full_like(q, 3.0)
    with pytest.raises(ValueError, match="out must have the shape of q"):
        cute_fa.forward(q, k, v, out=out[:, :8])
    with pytest.raises(TypeError, match="out must have dtype"):
        cute_fa.forward(q, k, v, out=out.bfloat16())
    assert (out == 3.0).all()


def test_cpu_tensors_and_no_gpu():
    q, k, v = qkv()
    out = torch.full_like(q, 3.0)
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        cute_fa.forward(q, k, v, out=out)
    assert (out == 3.0).all()
    with pytest.raises(ValueError, match="must be on a CUDA device"):
        cute_fa.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)


def test_argument_types_and_names():
    import numpy as np

    q, k, v = qkv()
    out = torch.full_like(q, 3.0)
    # numpy's bool passes the flag checks (the call then stops at the device check, on a CPU
    # tensor), and a wrong type names its module
    for flag in ("causal", "return_lse"):
        with pytest.raises(ValueError, match="q must be on a CUDA device"):
            cute_fa.forward(q, k, v, out=out, **{flag: np.bool_(True)})
    with pytest.raises(TypeError, match="causal must be a bool, got numpy.int64"):
        cute_fa.forward(q, k, v, causal=np.int64(1))
    with pytest.raises(TypeError, match="softmax_scale must be a positive finite float or None, "
                                        "got str 'a'"):
        cute_fa.forward(q, k, v, softmax_scale="a", out=out)
    with pytest.raises(TypeError, match="softmax_scale"):
        cute_fa.forward(q, k, v, softmax_scale=True)
    with pytest.raises(ValueError, match="q must be on a CUDA device"):  # numpy floats are numbers
        cute_fa.forward(q, k, v, softmax_scale=np.float32(0.1))
    # sdpa names its own arguments
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    with pytest.raises(TypeError, match="^is_causal must be a bool, got NoneType"):
        cute_fa.sdpa(qt, kt, vt, is_causal=None)
    with pytest.raises(TypeError, match="^scale must be"):
        cute_fa.sdpa(qt, kt, vt, scale="x")
    with pytest.raises(ValueError, match="^scale must be"):
        cute_fa.sdpa(qt, kt, vt, scale=-2.0)
    assert (out == 3.0).all()


def test_backend_checked_before_device():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="backend must be one of 'sm80', 'tma', 'sm90', 'auto', got 'foo'"):
        cute_fa.forward(q, k, v, backend="foo")
    with pytest.raises(ValueError, match="backend must be one of"):
        cute_fa.sdpa(q, k, v, backend=None)


def test_device_error_says_no_gpu():
    if torch.cuda.is_available():
        pytest.skip("checks the message on a machine without a GPU")
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"torch sees no CUDA GPU here"):
        cute_fa.forward(q, k, v)


def test_sdpa_errors_show_shapes_as_written():
    """sdpa takes (batch, heads, seqlen, head_dim); its checks run on (batch, seqlen, heads,
    head_dim) views, but the errors quote the caller's own shapes and strides."""
    q = torch.randn(2, 4, 16, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 4, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"k must have shape \(batch=2, heads_k>=1, seqlen_k>=1, "
                                         r"head_dim=64\), got \(2, 4, 16, 32\)"):
        cute_fa.sdpa(q, k[..., :32], k[..., :32])
    with pytest.raises(ValueError, match=r"v must have the shape of k, \(2, 4, 16, 64\), "
                                         r"got \(2, 4, 8, 64\)"):
        cute_fa.sdpa(q, k, k[:, :, :8])
    strided = torch.randn(2, 4, 16, 68, dtype=torch.bfloat16)[..., :64]
    with pytest.raises(ValueError, match=r"k strides must be multiples of 8 elements \(16 "
                                         r"bytes\), got \(4352, 1088, 68, 1\)"):
        cute_fa.sdpa(q, strided, strided)
    # forward's own layout is shown as is
    with pytest.raises(ValueError, match=r"k must have shape \(batch=2, seqlen_k>=1, heads_k>=1, "
                                         r"head_dim=64\), got \(2, 4, 16, 32\)"):
        cute_fa.forward(q, k[..., :32], k[..., :32])
