"""compute-sanitizer target: the packed wgmma forward ('auto' at head_dim 64: causal on the
two- and three-warpgroup tiles, non-causal on the 192-row tile; groups 4 and 8), with LSE,
queries that end mid-box and rows that see no key (more queries than keys, causal)."""
import torch

import cute_fa

for b, sq, sk, hq, hk, causal in [(2, 333, 333, 32, 8, True), (1, 2100, 2100, 16, 4, True),
                                  (2, 301, 300, 64, 8, False), (1, 500, 77, 16, 4, True)]:
    q = torch.randn(b, sq, hq, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, sk, hk, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True)
    torch.cuda.synchronize()
    print(b, sq, sk, hq, hk, causal, bool(torch.isfinite(o).all()), flush=True)
