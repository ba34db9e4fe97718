"""ncu target: one paged decode call per page-lookup form (B1 Sq1 Sk32k 32/8 head_dim 64,
pages of 16 keys, shuffled; the split count the heuristic gives), after a warm-up that
compiles both outside the profile window (`cudaProfilerStart`)."""
import torch

import cute_fa
from cute_fa import tuning
from cute_fa.runtime.plan import clear_plans

b, sk, hq, hk, d, page = 1, 32768, 32, 8, 64, 16
gen = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
k, v = (torch.randn(b * sk // page, page, hk, d, device="cuda", dtype=torch.bfloat16,
                    generator=gen) for _ in range(2))
table = torch.randperm(b * sk // page, device="cuda", generator=gen).to(torch.int32).view(b, -1)
lens = torch.full((b,), sk, device="cuda", dtype=torch.int32)


def call(ahead):
    tuning.DECODE_PAGE_PREFETCH = ahead
    clear_plans()
    return cute_fa.forward(q, k, v, causal=True, page_table=table, seqused_k=lens)


for ahead in (False, True):
    call(ahead)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for ahead in (False, True):
    call(ahead)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
