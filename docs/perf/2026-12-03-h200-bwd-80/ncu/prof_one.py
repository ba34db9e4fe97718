"""One backward call (after warm-up) inside the profiler range: prof_one.py WHO D CAUSAL [ENTRY]"""
import sys
import torch
import cute_fa
import cute_fa.tuning as T
from cute_fa.runtime.plan import clear_plans
from cute_fa.bench.common import flash_attn_4

who, d, causal = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
if len(sys.argv) > 4:
    T.BWD_SM90_TILES[d] = eval(sys.argv[4]); clear_plans()
b, s, h = (4, 4096, 16) if d == 128 else (4, 4096, 32)
g = torch.Generator(device="cuda").manual_seed(1)
q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
o, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True)
if who == "ours":
    fn = lambda: cute_fa.backward(do, q, k, v, o, lse, causal, backend="sm90")
else:
    fa4 = flash_attn_4()
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out4 = fa4[0](*leaves, causal=causal)
    out4 = out4[0] if isinstance(out4, tuple) else out4
    fn = lambda: torch.autograd.grad(out4, leaves, do, retain_graph=True)
for _ in range(3):
    fn()
torch.cuda.synchronize()
torch.cuda.profiler.start()
fn()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print("ok", who, d, causal)
