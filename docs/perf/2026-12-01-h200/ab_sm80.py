"""A/B of the sm80 kernel before (cute_fa_old: commit 60ba6de, PTX of runs 16-17) and after the
skeleton refactor (cute_fa), same process, interleaved, same inputs; plus SDPA flash as a yardstick."""
import json, statistics, sys, time
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import cute_fa_old, cute_fa
from cute_fa_old import interface as old_if
from cute_fa import interface as new_if


def tms(fn, reps=30):
    t = time.perf_counter(); n = 0
    while n < 5 or time.perf_counter() - t < 0.2:
        fn(); n += 1
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)


rows = []
for rep in range(2):
    for d in (64, 128):
        for causal in (False, True):
            for S in (1024, 2048, 4096, 8192, 16384):
                B, H = 16384 // S, 2048 // d
                q, k, v = (torch.randn(B, S, H, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                run_old = lambda: old_if._run(q, k, v, causal=causal, bottom_right=True, softmax_scale=None, out=None, return_lse=False, backend="sm80")
                run_new = lambda: new_if._run(q, k, v, causal=causal, bottom_right=True, softmax_scale=None, out=None, return_lse=False, backend="sm80")
                o1, o2 = run_old(), run_new()
                same = torch.equal(o1, o2)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                def fl():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                order = (("old", run_old), ("new", run_new)) if rep == 0 else (("new", run_new), ("old", run_old))
                t = {name: tms(fn) for name, fn in order}
                t["flash"] = tms(fl)
                flops = 4 * B * H * S * S * d / (2 if causal else 1)
                row = dict(rep=rep, d=d, causal=causal, S=S, old_ms=round(t["old"], 4), new_ms=round(t["new"], 4),
                           flash_ms=round(t["flash"], 4), new_over_old=round(t["old"] / t["new"], 4),
                           new_tflops=round(flops / t["new"] / 1e9, 1), bitwise_equal=same)
                rows.append(row)
                print(json.dumps(row), flush=True)
r = [x["new_over_old"] for x in rows]
print(f"speed new/old: min {min(r):.3f} max {max(r):.3f} geomean {statistics.geometric_mean(r):.4f}; bitwise equal outputs: {sum(x['bitwise_equal'] for x in rows)}/{len(rows)}")
