"""The built-in window backward with the plan's head splits ("split", `tuning_bwd.
bwd_head_splits` with a causal call's waves) against one CTA per K/V head's group ("unsplit",
the plan's splitting stood in by 1), the backward alone (autograd.grad of a kept forward's
output), in one process on the same inputs, timed by cute_fa.bench.common.time_each (host
launch hidden alike); full causal beside it as the rule's own case. bf16, 16k tokens a call
(batch 16384 // S), 16 query heads, 4 K/V heads, head_dim 128. Usage: ab_window_splits.py
OUT_DIR [SEQLENS, e.g. 4096,16384]"""
import json
import sys

import torch

import cute_fa
from cute_fa.bench.backward import autograd_pair, max_grad_diff
from cute_fa.bench.common import time_each, warm_gpu
from cute_fa.runtime.plan import splitting_heads

OUT = sys.argv[1]
HQ, HK, D = 16, 4, 128
CALLS = {"window_256": dict(causal=True, window_size=(255, 0)),
         "window_4096": dict(causal=True, window_size=(4095, 0)),
         "causal": dict(causal=True)}


def unsplit(fn):
    """fn with the plan's head splits stood in by 1 for its call."""
    def call():
        with splitting_heads(lambda *args: 1):
            return fn()
    return call


def main():
    warm_gpu(torch)
    rows = []
    seqlens = (4096, 16384) if len(sys.argv) < 3 else tuple(map(int, sys.argv[2].split(",")))
    for s in seqlens:
        batch = 16384 // s
        q = torch.randn(batch, s, HQ, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, s, HK, D, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        dout = torch.randn_like(q)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        for name, kwargs in CALLS.items():
            bwd = autograd_pair(torch, lambda: cute_fa.forward(*leaves, **kwargs), leaves,
                                dout)[0]
            us, errors, grads = time_each(torch, {"split": bwd, "unsplit": unsplit(bwd)},
                                          reps=10, keep_outputs=True)
            row = dict(seqlen=s, batch=batch, call=name, bwd_us=us, errors=errors)
            if len(grads) == 2:
                row["max_diff"] = max_grad_diff(grads["split"], grads["unsplit"])
            if us.get("split") and us.get("unsplit"):
                row["unsplit_speed_over_split"] = us["split"] / us["unsplit"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(f"{OUT}/ab_window_splits.json", "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
