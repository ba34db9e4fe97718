"""Backward calls on the forced tables for compute-sanitizer: san.py HEAD_DIM DETERMINISTIC"""
import sys
import choice
choice.patch("forced")
import torch
import cute_fa

d, det = int(sys.argv[1]), sys.argv[2] == "1"
g = torch.Generator(device="cuda").manual_seed(3)
for b, s, hq, hk, causal in ((1, 300, 4, 2, True), (2, 200, 2, 1, False)):
    q, do = (torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    o, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True)
    dq, dk, dv = cute_fa.backward(do, q, k, v, o, lse, causal, deterministic=det, backend="sm90")
    torch.cuda.synchronize()
    assert all(torch.isfinite(x).all() for x in (dq, dk, dv))
print("ok", d, det)
