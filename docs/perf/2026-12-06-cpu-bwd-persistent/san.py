"""Persistent wgmma backward calls for compute-sanitizer: san.py. 8 CTAs, so that each walks
many tiles (its Q/dO ring running on across them, the next tile's K and V loaded once this
one's dK and dV have left their staging), at head_dim 64, 128 (a dQ writer warp) and 256
(split d), causal with Sq != Sk both ways (tiles without queries), a window and a softcap.
dK and dV must be bitwise equal to the one-tile kernel's."""
import torch

import cute_fa
from cute_fa.runtime import plan as plans
from cute_fa.runtime.plan import overriding_backward

plans.bwd_head_splits = lambda *args: 1  # GQA groups unsplit: the persistent key's
g = torch.Generator(device="cuda").manual_seed(7)
for d, kw in ((128, dict(causal=True)), (64, dict(causal=False)),
              (256, dict(causal=True, window_size=(60, 0), softcap=20.0))):
    for b, sq, sk, hq, hk in ((2, 300, 200, 4, 2), (1, 130, 520, 6, 3)):
        q, dout = (torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(2))
        k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
                for _ in range(2))
        out, lse = cute_fa.forward(q, k, v, return_lse=True, **kw)
        single = cute_fa.backward(dout, q, k, v, out, lse, backend="sm90", **kw)
        with overriding_backward(persistent=8):
            got = cute_fa.backward(dout, q, k, v, out, lse, backend="sm90", **kw)
        torch.cuda.synchronize()
        assert torch.equal(got[1], single[1]) and torch.equal(got[2], single[2]), (d, kw, sq, sk)
        assert torch.allclose(got[0].float(), single[0].float(), atol=1e-2, rtol=1e-2), (d, kw)
    print("ok", d, kw, flush=True)
