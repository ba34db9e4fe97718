"""One method on one shape for `ncu --nvtx --nvtx-include "prof/"`: five calls outside the range
(they compile and warm), then one inside it, the call ncu profiles.
Usage: prof.py METHOD B S HQ HKV D CAUSAL   (METHOD: cute_fa or flash_attn_4; packed or
unpacked: cute_fa with its GQA group packed into the wgmma tiles or not, 2026-12-06)"""
import sys

import torch

import cute_fa
from cute_fa.bench.common import dense_peers

method, b, s, hq, hk, d, causal = sys.argv[1], *map(int, sys.argv[2:8])
if method in ("packed", "unpacked"):
    from cute_fa.runtime.plan import overriding

    def fn(q, k, v):
        with overriding(pack_gqa=hq // hk if method == "packed" else 1):
            return cute_fa.forward(q, k, v, causal=bool(causal))
elif method == "cute_fa":
    def fn(q, k, v):
        return cute_fa.forward(q, k, v, causal=bool(causal))
else:
    def fn(q, k, v, f=dense_peers(torch)[method]):
        return f(q, k, v, bool(causal))

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
