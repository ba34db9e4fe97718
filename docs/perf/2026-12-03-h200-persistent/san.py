"""Persistent forward calls for compute-sanitizer: san.py HEAD_DIM CAUSAL. 8 CTAs, so that each
loops over many tiles (its ring, Q's barriers and the ping-pong's turns running on), with tiles
that visit no key (Sq > Sk, causal)."""
import sys

import torch

import cute_fa
from cute_fa.runtime.plan import overriding

d, causal = int(sys.argv[1]), sys.argv[2] == "1"
g = torch.Generator(device="cuda").manual_seed(5)
for b, sq, sk, hq, hk in ((2, 300, 300, 8, 2), (1, 500, 100, 6, 3)):
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    single = cute_fa.forward(q, k, v, causal=causal, backend="sm90")
    with overriding(persistent=8):
        o = cute_fa.forward(q, k, v, causal=causal, backend="sm90")
    torch.cuda.synchronize()
    assert torch.equal(o, single)
print("ok", d, causal)
