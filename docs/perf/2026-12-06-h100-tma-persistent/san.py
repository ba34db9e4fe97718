"""Persistent TMA forward calls for compute-sanitizer: san.py. 8 CTAs, so that each loops over
many tiles (its ring running on across tiles, the next tile's key blocks loaded by this one's
last rounds, Q reloaded behind the epilogue), with tiles that visit no key (Sq > Sk, causal),
a sliding window, and sm120's tiles."""
import torch

import cute_fa
from cute_fa.runtime.plan import overriding, tiles_of

g = torch.Generator(device="cuda").manual_seed(5)
for d, causal, tables, window in ((128, True, None, None), (64, False, None, None),
                                  (128, False, "sm_120a", None), (64, True, None, (100, 0))):
    for b, sq, sk, hq, hk in ((2, 300, 300, 8, 2), (1, 500, 100, 6, 3)):
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
                for _ in range(2))
        kwargs = dict(causal=causal, backend="tma")
        if window:
            kwargs["window_size"] = window
        with tiles_of(tables):
            single = cute_fa.forward(q, k, v, **kwargs)
            with overriding(persistent=8):
                o = cute_fa.forward(q, k, v, **kwargs)
        torch.cuda.synchronize()
        assert torch.equal(o, single), (d, causal, tables, window, b, sq, sk)
    print("ok", d, causal, tables, window, flush=True)
