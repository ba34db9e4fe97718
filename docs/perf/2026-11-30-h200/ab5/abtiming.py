"""Timing shared by abtile.py and abpipe.py (factored out of them after their runs; the same
code). tms is the benchmark's _time_ms (median CUDA-event time after at least 5 warm-up calls
and 0.2 s) without its synchronize every 10 warm-up calls."""
import statistics
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


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


def vs_flash(run, d, dtype, causal, S):
    """TFLOPs/s of run(q, k, v, causal), of SDPA flash, and the time ratio flash / run, on the
    benchmark's shape (batch = 16384 / S, heads = 2048 / d), fresh random inputs."""
    B, H = 16384 // S, 2048 // d
    q, k, v = (torch.randn(B, S, H, d, device="cuda", dtype=dtype) for _ in range(3))
    fl = 4 * B * H * S * S * d / (2 if causal else 1)
    t1 = tms(lambda: run(q, k, v, causal))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        t2 = tms(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt,
                                                                           is_causal=causal))
    return fl / t1 / 1e9, fl / t2 / 1e9, t2 / t1
