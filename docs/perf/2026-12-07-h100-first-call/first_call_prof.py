"""cProfile of a first forward call in a new process (the disk cache as it is): where its
seconds go outside the compile. Usage: first_call_prof.py HEAD_DIM CAUSAL(0/1)"""
import cProfile
import pstats
import sys
import time

import torch

import cute_fa

d, causal = int(sys.argv[1]), sys.argv[2] == "1"
q, k, v = (torch.randn(1, 128, 16, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
torch.cuda.synchronize()
pr = cProfile.Profile()
t = time.perf_counter()
pr.enable()
o = cute_fa.forward(q, k, v, causal=causal)
torch.cuda.synchronize()
pr.disable()
print("first call s", time.perf_counter() - t)
pstats.Stats(pr).sort_stats("cumulative").print_stats(45)
pstats.Stats(pr).sort_stats("tottime").print_stats(15)
