"""Backward calls for compute-sanitizer: head_dim, deterministic, optional forced 192 entry."""
import sys
import torch
import cute_fa
import cute_fa.tuning as T
from cute_fa.runtime.plan import clear_plans

d, det = int(sys.argv[1]), sys.argv[2] == "1"
if len(sys.argv) > 3:
    T.BWD_SM90_TILES[192] = eval(sys.argv[3])
    clear_plans()
g = torch.Generator(device="cuda").manual_seed(3)
for b, s, hq, hk, causal in ((1, 300, 4, 2, True), (2, 200, 2, 1, False)):
    q, do = (torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    o, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True)
    dq, dk, dv = cute_fa.backward(do, q, k, v, o, lse, causal, deterministic=det, backend="sm90")
    torch.cuda.synchronize()
    assert all(torch.isfinite(x).all() for x in (dq, dk, dv))
print("ok", d, det, sys.argv[3:])
