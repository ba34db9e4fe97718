"""One method on one shape for `ncu --nvtx --nvtx-include "prof/"`: five calls outside the range
(they compile and warm), then one inside it, the call ncu profiles.
Usage: prof.py METHOD B S HQ HKV D CAUSAL   (METHOD: cute_fa or flash_attn_4)"""
import sys

import torch

import cute_fa
from cute_fa.bench.common import dense_peers

method, b, s, hq, hk, d, causal = sys.argv[1], *map(int, sys.argv[2:8])
fn = (lambda q, k, v: cute_fa.forward(q, k, v, causal=bool(causal))) if method == "cute_fa" \
    else (lambda q, k, v, f=dense_peers(torch)[method]: f(q, k, v, bool(causal)))
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
k, v = (torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
        for _ in range(2))
for _ in range(5):
    fn(q, k, v)
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("prof")
fn(q, k, v)
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
