"""compute-sanitizer target: paged decode rings reading pages a round ahead
(`Sm80Key.page_prefetch` forced), page sizes that hold whole key blocks (64, 256) and that do
not (16, 48), entries of 0, 1 and many keys, split and not: no read past a page table's
used entries or a page."""
import torch

import cute_fa
from cute_fa import tuning

tuning.DECODE_PAGE_PREFETCH = True
for b, sq, sk, hq, hk, d, page, splits in [(3, 1, 2048, 32, 8, 128, 64, None),
                                           (3, 4, 3000, 16, 2, 64, 16, 3),
                                           (2, 1, 4096, 64, 8, 64, 256, None),
                                           (3, 2, 1200, 8, 8, 128, 48, 1)]:
    cap = -(-sk // page) * page
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b * cap // page, page, hk, d, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    table = torch.randperm(b * cap // page, device="cuda").to(torch.int32).view(b, cap // page)
    seqused = torch.tensor([0, 1, sk] + [sk] * (b - 3), device="cuda", dtype=torch.int32)[:b]
    o, lse = cute_fa.forward(q, k, v, causal=True, return_lse=True, page_table=table,
                             seqused_k=seqused, num_splits=splits)
    torch.cuda.synchronize()
    print(b, sq, sk, hq, hk, d, page, splits, bool(torch.isfinite(o).all()), flush=True)
