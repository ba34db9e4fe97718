"""The causal TMA kernel at head_dim 64 (bf16, S=8k, 16k tokens, hidden 2048) as shipped,
register-capped for three CTAs per SM, then with the cap removed; for the stall metrics of
stalls-tma64-causal-capped-vs-not.txt (same ncu command as stalls-*.txt, see profile.py)."""
import torch

import cute_fa
from cute_fa import interface, tuning

S, D = 8192, 64
q, k, v = (torch.randn(16384 // S, S, 2048 // D, D, device="cuda", dtype=torch.bfloat16)
           for _ in range(3))
cute_fa.forward(q, k, v, causal=True, backend="tma")
torch.cuda.synchronize()
print("ran capped", flush=True)
tuning.REGISTER_CAP_CTAS.clear()
interface._DISPATCH.clear()
cute_fa.forward(q, k, v, causal=True, backend="tma")
torch.cuda.synchronize()
print("ran uncapped", flush=True)
