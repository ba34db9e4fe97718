"""Median CUDA-event time of a call after at least 5 warm-up calls and 0.2 s (as the benchmark).
Factored out of abtile.py and abpipe.py after their runs; the same code."""
import statistics
import time

import torch


def tms(fn, reps=20):
    t = time.perf_counter(); n = 0
    while n < 5 or time.perf_counter() - t < 0.2:
        fn(); n += 1
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)
