"""Eager decode call rate from Python (host-bound): calls per second over 300 calls, one sync."""
import time, torch, cute_fa
for b, sk, hq, hk, d in ((1, 4096, 32, 8, 128), (8, 4096, 32, 8, 128)):
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    lens = torch.full((b,), sk - 3, dtype=torch.int32, device="cuda")
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    fns = {"cute_fa": lambda: cute_fa.forward(q, k, v, causal=True),
           "cute_fa_seqused_k": lambda: cute_fa.forward(q, k, v, causal=True, seqused_k=lens),
           "sdpa_default": lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)}
    for name, fn in fns.items():
        for _ in range(50): fn()
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(300): fn()
        torch.cuda.synchronize()
        print(f"B={b} Sk={sk} {name}: {(time.perf_counter() - t) / 300 * 1e6:.1f} us per call (eager, back to back)", flush=True)
