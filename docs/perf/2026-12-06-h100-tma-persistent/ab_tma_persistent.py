"""A/B of the persistent TMA forward (`TmaKey.persistent`: SMs x CTAs-per-SM CTAs, each looping
over tiles, its ring's last rounds loading the next tile's first key blocks) against the
one-CTA-per-tile TMA kernel, in one process, on the same inputs, with this GPU's (sm_90a)
tiles and with sm120's tiles (`tiles_of("sm_120a")`, the kernel an sm120 GPU gets, compiled
for this one). Each row checks the two forms' outputs for bitwise equality.

Usage: ab_tma_persistent.py OUT RUN   (RUN 1: the paper grid at head_dim 64 and 128 and the
24 small-batch causal GQA prefill shapes; RUN 2: shapes run 1 did not have)

The rule, written before run 1: for each (tables, head_dim class, causal), the speedup is
the geometric mean over the rows of t(one tile) / t(persistent). A class counts as a win
where the speedup is >= 1.02 in run 1 and again >= 1.02 in run 2, and no row of either run
is below 0.97. Only a win would let `kernel_key(backend="tma")` plan the persistent form
for that class; without one the TMA kernel stays one CTA per tile.
"""
import dataclasses
import json
import math
import os
import re
import sys

import torch
from cuda.bindings import driver

import cute_fa
from cute_fa.bench.common import HEAD_DIMS, HIDDEN, SEQLENS, TOKENS, time_each, warm_gpu
from cute_fa.bench.prefill import SMALL_HEADS, SMALL_SHAPES
from cute_fa.api.checks import check_forward
from cute_fa.runtime.call import DENSE
from cute_fa.runtime.device import device
from cute_fa.runtime.plan import overriding, plan, tiles_of
from cute_fa.compile.build import compile_kernel
from cute_fa.tuning import decode_ctas_per_sm, tma_persistent

SMS = torch.cuda.get_device_properties(0).multi_processor_count
TABLES = (None, "sm_120a")


def shapes(run):
    if run == 1:
        for d in HEAD_DIMS:
            for causal in (False, True):
                for s in SEQLENS:
                    yield "grid", TOKENS // s, s, HIDDEN // d, HIDDEN // d, d, causal
        for hq, hk, d in SMALL_HEADS:
            for b, s in SMALL_SHAPES:
                yield "small", b, s, hq, hk, d, True
    else:
        for d in HEAD_DIMS:
            for causal in (False, True):
                for b, s in ((1, 3000), (2, 1536), (3, 6000), (8, 768), (1, 12288)):
                    yield "new", b, s, 2048 // d, 2048 // d // 4, d, causal


def persistent_key(q, k, v, causal, tables):
    """The one-tile TMA key this call plans, and its persistent form (`tuning.tma_persistent`)
    on SMs x the CTAs of it one SM holds: its shared memory and threads as
    `tuning.decode_ctas_per_sm` counts them (a formula for any mma.sync kernel's key), its
    registers as the compiled cubin says (the driver's NUM_REGS, in 256-register warp units)."""
    with tiles_of(tables):
        key = plan(check_forward(DENSE, q, k, v, causal=causal, backend="tma"),
                   device(q.get_device()), compile=False).key
    form = tma_persistent(key, 1)
    if form not in _REGS:
        compiled = compile_kernel(form, keep_ptx=True)
        name = re.search(r"\.entry\s+([A-Za-z0-9_$]+)", compiled.__ptx__).group(1)
        _, module = driver.cuModuleLoadData(compiled.__cubin__)
        _, fn = driver.cuModuleGetFunction(module, name.encode())
        _, _REGS[form] = driver.cuFuncGetAttribute(
            driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, fn)
    warp_regs = -(-_REGS[form] * 32 // 256) * 256
    by_regs = 65536 // (warp_regs * (key.tile.num_threads // 32))
    per_sm = decode_ctas_per_sm(dataclasses.replace(key, ctas_per_sm=by_regs), "sm_90a")
    return key, tma_persistent(key, SMS * per_sm), _REGS[form], per_sm


_REGS: dict = {}


def main(out_dir, run):
    os.makedirs(out_dir, exist_ok=True)
    warm_gpu(torch)
    rows = []
    for kind, b, s, hq, hk, d, causal in shapes(run):
        g = torch.Generator(device="cuda").manual_seed(b * s + hq + d + run)
        q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
                for _ in range(2))
        fns, forms = {}, {}
        for tables in TABLES:
            name = tables or "sm_90a"
            key, form, regs, per_sm = persistent_key(q, k, v, causal, tables)
            forms[name] = dict(tile=[key.tile.block_m, key.tile.block_n, key.tile.num_threads],
                               registers=regs, ctas_per_sm=per_sm, ctas=form.persistent,
                               s_gemm_fine=form.s_gemm_fine)

            def single(t=tables):
                with tiles_of(t):
                    return cute_fa.forward(q, k, v, causal=causal, backend="tma")

            def persistent(t=tables, f=form):
                with tiles_of(t), overriding(persistent=f.persistent,
                                             s_gemm_fine=f.s_gemm_fine):
                    return cute_fa.forward(q, k, v, causal=causal, backend="tma")

            fns[f"{name}/single"], fns[f"{name}/persistent"] = single, persistent
        us, errors, outs = time_each(torch, fns, reps=20, keep_outputs=True)
        again, _, _ = time_each(torch, dict(reversed(list(fns.items()))), reps=20)
        us = {n: (min(u, again[n]) if u and again.get(n) else u) for n, u in us.items()}
        row = dict(kind=kind, batch=b, seqlen=s, heads_q=hq, heads_kv=hk, head_dim=d,
                   causal=causal, us=us, errors=errors, forms=forms)
        for name in forms:
            a, p = f"{name}/single", f"{name}/persistent"
            row[name] = dict(speedup=round(us[a] / us[p], 4) if us.get(a) and us.get(p)
                             else None,
                             bitwise=bool(outs.get(a) is not None and outs.get(p) is not None
                                          and torch.equal(outs[a], outs[p])))
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(os.path.join(out_dir, f"ab_tma_persistent_run{run}.json"), "w") as f:
            json.dump(dict(sms=SMS, device=torch.cuda.get_device_name(), run=run, rows=rows),
                      f, indent=1)
        del q, k, v, fns, outs
    summary(rows)


def summary(rows):
    """Per (tables, head_dim, causal): geometric mean, min and max speedup, rows, bitwise."""
    groups = {}
    for r in rows:
        for name in ("sm_90a", "sm_120a"):
            if r.get(name, {}).get("speedup"):
                groups.setdefault((name, r["head_dim"], r["causal"]), []).append(r[name])
    for (name, d, causal), cells in sorted(groups.items()):
        sp = [c["speedup"] for c in cells]
        gm = math.exp(sum(map(math.log, sp)) / len(sp))
        print(f"{name} d{d} {'causal' if causal else 'full  '} rows {len(sp):2d} geomean "
              f"{gm:.3f} min {min(sp):.3f} max {max(sp):.3f} bitwise "
              f"{sum(c['bitwise'] for c in cells)}/{len(cells)}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
