"""A block mask's wgmma backward with its K/V groups' query heads split over CTAs as a causal
call's are ("split": `tuning_bwd.bwd_head_splits` asked as if causal, 8 CTAs per SM) against
the plan's (not causal: a grid that covers the SMs once is not split, "plan"), with the built-in
causal backward beside them. A causal or document block mask gives key blocks as unequal work
as causal does, but the call is not causal, so the plan does not split it; at S 4k that
backward ran 0.90x the built-in causal one's (H100, ../2026-12-07-h100-first-call/), which
splits its groups 4 ways there. The backward alone (autograd.grad of a kept forward's output),
one process, same inputs, cute_fa.bench.common.time_each (host launch hidden alike); bf16, 16k
tokens a call (batch 16384 // S), 16/4 heads, head_dim 128, masks from torch's
create_block_mask. Usage: ab_block_mask_splits.py OUT_DIR [SEQLENS, e.g. 4096,16384]"""
import json
import sys

import torch

import cute_fa
from cute_fa.bench.backward import autograd_pair, max_grad_diff
from cute_fa.bench.common import time_each, warm_gpu
from cute_fa.runtime.plan import splitting_heads
from cute_fa.tuning_bwd import bwd_head_splits

OUT = sys.argv[1]
HQ, HK, D = 16, 4, 128


def causal_mask(b, h, q, kv):
    return q >= kv


def as_causal(fn):
    """fn with the plan's head splits asked as if the call were causal."""
    def call():
        with splitting_heads(lambda *args: bwd_head_splits(*args[:-1], True)):
            return fn()
    return call


def main():
    from torch.nn.attention.flex_attention import create_block_mask

    warm_gpu(torch)
    rows = []
    seqlens = (4096, 16384) if len(sys.argv) < 3 else tuple(map(int, sys.argv[2].split(",")))
    for s in seqlens:
        batch = 16384 // s
        docs = torch.sort(torch.randint(0, 6, (batch, s), device="cuda"), dim=1).values

        def document(b, h, q, kv):
            return (docs[b, q] == docs[b, kv]) & (q >= kv)
        q = torch.randn(batch, s, HQ, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, s, HK, D, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        dout = torch.randn_like(q)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        for name, mask_mod in (("causal", causal_mask), ("document", document)):
            mask = create_block_mask(mask_mod, batch, None, s, s, device="cuda")
            bwd = autograd_pair(torch, lambda: cute_fa.forward(*leaves, block_mask=mask),
                                leaves, dout)[0]
            fns = {"plan": bwd, "split": as_causal(bwd)}
            if name == "causal":
                fns["builtin"] = autograd_pair(
                    torch, lambda: cute_fa.forward(*leaves, causal=True), leaves, dout)[0]
            us, errors, grads = time_each(torch, fns, reps=10, keep_outputs=True)
            row = dict(seqlen=s, batch=batch, mask=name, bwd_us=us, errors=errors)
            if "plan" in grads and "split" in grads:
                row["max_diff"] = max_grad_diff(grads["plan"], grads["split"])
            if us.get("plan") and us.get("split"):
                row["split_speed_over_plan"] = us["plan"] / us["split"]
            if us.get("builtin") and us.get("split"):
                row["split_speed_over_builtin"] = us["builtin"] / us["split"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(f"{OUT}/ab_block_mask_splits.json", "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
