"""One backward call of cute_fa (sm90) and of flash-attn-4 per shape, inside the profiler range
(for ncu --profile-from-start off), after warm-up calls outside it."""
import sys
import torch
import cute_fa
from cute_fa.bench.common import flash_attn_4

SHAPES = [(4, 4096, 16, 128, False), (4, 4096, 32, 64, True)]
fa4 = flash_attn_4()
which = sys.argv[1:] or ["ours", "fa4"]
for b, s, h, d, causal in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    o, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    fns = {"ours": lambda: cute_fa.backward(do, q, k, v, o, lse, causal, backend="sm90")}
    if fa4 is not None:
        out4 = fa4[0](*leaves, causal=causal)
        out4 = out4[0] if isinstance(out4, tuple) else out4
        fns["fa4"] = lambda: torch.autograd.grad(out4, leaves, do, retain_graph=True)
    for n in which:
        for _ in range(3):
            fns[n]()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fns[n]()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
