"""`block_mask.WHOLE_TILES_BACKWARD` A/B, the backward alone (autograd.grad of a kept forward's
output), in one process on the same inputs, timed by cute_fa.bench.common.time_each (host
launch hidden alike): the backward's query tile lists with the tiles inside full blocks marked,
their mask skipped ("whole"), or every listed tile masked ("masked"); for causal and the window
the built-in's backward beside them. bf16, 16k tokens per call (batch 16384 // S), 16 query
heads, 4 K/V heads, head_dim 128, masks from torch's create_block_mask (those of
../2026-12-07-h100-bwd-mods/ab_switches.py). The gradients of each pair are compared.
Usage: ab_whole_backward.py OUT_DIR [SEQLENS, e.g. 4096,16384]"""
import importlib.util
import json
import sys
from pathlib import Path

import torch

import cute_fa
from cute_fa.bench.backward import autograd_pair
from cute_fa.bench.common import time_each, warm_gpu
from cute_fa.mods import block_mask as switches

OUT = sys.argv[1]
HQ, HK, D = 16, 4, 128
spec = importlib.util.spec_from_file_location(
    "ab_switches", Path(__file__).parents[1] / "2026-12-07-h100-bwd-mods" / "ab_switches.py")
ab = importlib.util.module_from_spec(spec)
sys.argv, argv = [sys.argv[0], OUT], sys.argv
spec.loader.exec_module(ab)
sys.argv = argv
BUILTIN = {"causal": dict(causal=True), "sliding_window_256": dict(causal=True,
                                                                   window_size=(255, 0))}


def main():
    from torch.nn.attention.flex_attention import create_block_mask

    warm_gpu(torch)
    rows = []
    seqlens = (1024, 4096, 16384) if len(sys.argv) < 3 else tuple(
        map(int, sys.argv[2].split(",")))
    for s in seqlens:
        batch = 16384 // s
        q = torch.randn(batch, s, HQ, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, s, HK, D, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        dout = torch.randn_like(q)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        for name, mask_mod in ab.masks(batch, s).items():
            bm = create_block_mask(mask_mod, batch, None, s, s, device="cuda")
            bwd_fn = autograd_pair(torch, lambda: cute_fa.forward(*leaves, block_mask=bm),
                                   leaves, dout)[0]
            bwd = {"whole": ab.under(switches, "WHOLE_TILES_BACKWARD", True, bwd_fn),
                   "masked": ab.under(switches, "WHOLE_TILES_BACKWARD", False, bwd_fn)}
            if name in BUILTIN:
                bwd["builtin"] = autograd_pair(torch, lambda: cute_fa.forward(
                    *leaves, **BUILTIN[name]), leaves, dout)[0]
            us, errors, grads = time_each(torch, bwd, reps=10, keep_outputs=True)
            row = dict(seqlen=s, batch=batch, mask=name, bwd_us=us, bwd_errors=errors)
            if "whole" in grads and "masked" in grads:
                row["max_diff"] = ab.diff(grads["whole"], grads["masked"])
            if us.get("whole") and us.get("masked"):
                row["whole_speed_over_masked"] = us["masked"] / us["whole"]
            if us.get("whole") and us.get("builtin"):
                row["whole_speed_over_builtin"] = us["builtin"] / us["whole"]
                row["masked_speed_over_builtin"] = us["builtin"] / us["masked"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            del grads, bwd, bwd_fn
    with open(f"{OUT}/ab_whole_backward.json", "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
