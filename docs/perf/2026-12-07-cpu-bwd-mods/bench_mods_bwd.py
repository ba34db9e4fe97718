"""The backward with score_mod / block_mask against torch's FlexAttention (torch.compile of
flex_attention, its default Triton kernels, block masks from create_block_mask) and against the
built-in feature a mod equals, bf16, side by side in one process on the same inputs, timed by
cute_fa.bench.common.time_each (host launch hidden for every method alike). Two timings per
method: the backward alone (autograd.grad of a kept forward's output) and forward + backward.
cute_fa twice: its backward on the mma.sync kernel and on the wgmma kernel
(`tuning_bwd.SM90_MODS` off and on). Shapes as ../2026-12-06-mods/bench_mods.py: 16k tokens
per call (batch 16384 // S), 16 query heads, 4 K/V heads, head_dim 128. The mods are that
script's (`cases`); masks run with their block mask. dq/dk/dv of cute_fa are compared with
FlexAttention's (max |diff|).
Usage: bench_mods_bwd.py OUT_DIR [SEQLENS, e.g. 4096,16384]; ONLY=softcap (environment) runs
the mods whose names contain it."""
import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
import torch._dynamo
import torch._functorch.config

# FlexAttention's compiled backward is timed again and again on one forward's graph, which
# donated buffers forbid
torch._functorch.config.donated_buffer = False

import cute_fa
from cute_fa import tuning_bwd
from cute_fa.bench.backward import autograd_pair
from cute_fa.bench.common import time_each, warm_gpu

OUT = sys.argv[1]
HQ, HK, D = 16, 4, 128


def _bench_mods():
    """../2026-12-06-mods/bench_mods.py as a module (it reads OUT from sys.argv at import),
    registered in sys.modules: torch.compile looks its score_mods' module up there."""
    spec = importlib.util.spec_from_file_location(
        "bench_mods", Path(__file__).parents[1] / "2026-12-06-mods" / "bench_mods.py")
    module = sys.modules["bench_mods"] = importlib.util.module_from_spec(spec)
    sys.argv, argv = [sys.argv[0], OUT], sys.argv
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv = argv
    return module


mods_cases = _bench_mods().cases  # (batch, seqlen) -> {name: (score_mod, mask_mod, builtin)}


def mods_backward(fn, sm90: bool):
    """fn with the mods' backward on the wgmma kernel (sm90) or the mma.sync one
    (`tuning_bwd.SM90_MODS` set for its call)."""
    def call():
        saved, tuning_bwd.SM90_MODS = tuning_bwd.SM90_MODS, sm90
        try:
            return fn()
        finally:
            tuning_bwd.SM90_MODS = saved
    return call


def main():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.config.cache_size_limit = 256
    torch._dynamo.config.accumulated_cache_size_limit = 4096
    flex = torch.compile(flex_attention)
    warm_gpu(torch)
    rows = []
    seqlens = (1024, 4096, 16384) if len(sys.argv) < 3 else tuple(map(int, sys.argv[2].split(",")))
    for s in seqlens:
        batch = 16384 // s
        q = torch.randn(batch, s, HQ, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, s, HK, D, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        dout = torch.randn_like(q)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        lt = [t.transpose(1, 2) for t in leaves]

        def cute_pair(score_mod, bm, sm90: bool) -> tuple:
            """autograd_pair of cute_fa's call, its forward and both timings run with the
            mods' backward on the wgmma kernel (sm90) or the mma.sync one."""
            pair = mods_backward(lambda: autograd_pair(torch, lambda: cute_fa.forward(
                *leaves, score_mod=score_mod, block_mask=bm), leaves, dout), sm90)()
            return tuple(mods_backward(f, sm90) for f in pair)

        for name, (score_mod, mask_mod, builtin) in mods_cases(batch, s).items():
            if os.environ.get("ONLY", "") not in name:
                continue
            bm = None if mask_mod is None else create_block_mask(mask_mod, batch, HQ, s, s,
                                                                 device="cuda")
            pairs = {
                "cute_fa": cute_pair(score_mod, bm, False),
                "cute_fa_wgmma": cute_pair(score_mod, bm, True),
                "flex": autograd_pair(torch, lambda: flex(
                    *lt, score_mod=score_mod, block_mask=bm, enable_gqa=True).transpose(1, 2),
                    leaves, dout)}
            if builtin is not None:
                pairs["builtin"] = autograd_pair(
                    torch, lambda: cute_fa.forward(*leaves, **builtin), leaves, dout)
            us, errors, grads = time_each(torch, {n: p[0] for n, p in pairs.items()}, reps=10,
                                          keep_outputs=True)
            step_us, step_errors, _ = time_each(torch, {n: p[1] for n, p in pairs.items()},
                                                reps=10)
            row = dict(seqlen=s, batch=batch, mod=name, bwd_us=us, step_us=step_us,
                       errors=errors, step_errors=step_errors)
            for method in ("cute_fa", "cute_fa_wgmma"):
                if method in grads and "flex" in grads:
                    row[f"{method}_grad_max_diff_vs_flex"] = [
                        (a.float() - b.float()).abs().max().item()
                        for a, b in zip(grads[method], grads["flex"])]
                for key, table in (("bwd", us), ("step", step_us)):
                    if table.get(method) and table.get("flex"):
                        row[f"{method}_{key}_vs_flex"] = table["flex"] / table[method]
                    if table.get(method) and table.get("builtin"):
                        row[f"{method}_{key}_vs_builtin"] = table["builtin"] / table[method]
            rows.append(row)
            print(json.dumps(row), flush=True)
            del grads, pairs
    with open(f"{OUT}/bench_mods_bwd.json", "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
