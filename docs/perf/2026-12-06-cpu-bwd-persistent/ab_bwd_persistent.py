"""A/B of the persistent wgmma backward (`BwdSm90Key.persistent`: SMs x the tile's CTAs per SM,
each looping over (key block, K/V head, batch entry) tiles, the next tile's Q and dO loads
under this tile's last query blocks and its dK/dV epilogue) against the backward `auto` plans
(one CTA per tile; a small GQA batch splits its groups' query heads over CTAs, `kv_accum`), in
one process, on the same inputs. The persistent form takes no kv_accum: its GQA groups are
unsplit (persistence is the other way to fill the GPU with few K/V heads).

Usage: ab_bwd_persistent.py OUT RUN   (RUN 1: the paper grid at head_dim 64 and 128 and the
GQA training shapes of `bench --backward`; RUN 2: shapes run 1 did not have)

The rule, written before run 1: per (head_dim, causal, MHA or GQA) class the speedup is the
geometric mean over its rows of t(auto) / t(persistent). A class counts as a win where that is
>= 1.02 in run 1 and again in run 2, with no row of either run below 0.97. Only a win would
let the plan take the persistent form for that class; without one the backward stays as it is.
Each MHA row also checks dK and dV bitwise equal between the two (same products per tile); a
GQA row reports the largest difference (auto's split groups add dK and dV in float32).
"""
import json
import math
import os
import sys

import torch

import cute_fa
from cute_fa.api.checks import check_backward
from cute_fa.bench.backward import TRAINING_SHAPES
from cute_fa.bench.common import HEAD_DIMS, HIDDEN, SEQLENS, TOKENS, time_each, warm_gpu
from cute_fa.runtime import plan as plans
from cute_fa.runtime.device import device
from cute_fa.runtime.plan import overriding_backward, plan

SMS = torch.cuda.get_device_properties(0).multi_processor_count


def shapes(run):
    """(kind, batch, seqlen, heads_q, heads_kv, head_dim, causal)."""
    if run == 1:
        for d in HEAD_DIMS:
            for causal in (False, True):
                for s in SEQLENS:
                    yield "mha", TOKENS // s, s, HIDDEN // d, HIDDEN // d, d, causal
        for hq, b, s in TRAINING_SHAPES:
            yield "gqa", b, s, hq, 8, 128, True
    else:
        for d in HEAD_DIMS:
            for causal in (False, True):
                for b, s in ((3, 1536), (1, 3000), (6, 1024), (1, 12288)):
                    yield "mha", b, s, 2048 // d, 2048 // d, d, causal
        for hq, b, s in ((32, 3, 2048), (64, 1, 4096), (32, 2, 8192)):
            yield "gqa", b, s, hq, 8, 128, True


class unsplit:
    """GQA groups on one CTA each (the plan's `bwd_head_splits` replaced by 1)."""

    def __enter__(self):
        self.saved = plans.bwd_head_splits
        plans.bwd_head_splits = lambda *args: 1

    def __exit__(self, *exc):
        plans.bwd_head_splits = self.saved


def main(out_dir, run):
    os.makedirs(out_dir, exist_ok=True)
    warm_gpu(torch)
    rows = []
    for kind, b, s, hq, hk, d, causal in shapes(run):
        g = torch.Generator(device="cuda").manual_seed(b * s + hq + d + run + causal)
        q, dout = (torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(2))
        k, v = (torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
                for _ in range(2))
        out, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True)
        call = check_backward("dense", dout, q, k, v, out, lse, causal=causal)
        auto = plan(call, device(0), compile=False)
        ctas = SMS * auto.keys[1].tile.ctas_per_sm

        def auto_bwd():
            return cute_fa.backward(dout, q, k, v, out, lse, causal)

        def persistent_bwd():
            with unsplit(), overriding_backward(persistent=ctas):
                return cute_fa.backward(dout, q, k, v, out, lse, causal)

        fns = dict(auto=auto_bwd, persistent=persistent_bwd)
        us, errors, outs = time_each(torch, fns, reps=20, keep_outputs=True)
        again, _, _ = time_each(torch, dict(reversed(list(fns.items()))), reps=20)
        us = {n: (min(u, again[n]) if u and again.get(n) else u) for n, u in us.items()}
        row = dict(kind=kind, batch=b, seqlen=s, heads_q=hq, heads_kv=hk, head_dim=d,
                   causal=causal, us=us, errors=errors, ctas=ctas,
                   auto_head_splits=auto.head_splits, tile=str(auto.keys[1].tile),
                   speedup=round(us["auto"] / us["persistent"], 4)
                   if us.get("auto") and us.get("persistent") else None)
        if "auto" in outs and "persistent" in outs:
            a, p = outs["auto"], outs["persistent"]
            row["dkdv_bitwise"] = bool(torch.equal(a[1], p[1]) and torch.equal(a[2], p[2]))
            row["max_diff"] = [float((x.float() - y.float()).abs().max()) for x, y in zip(a, p)]
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(os.path.join(out_dir, f"ab_bwd_persistent_run{run}.json"), "w") as f:
            json.dump(dict(sms=SMS, device=torch.cuda.get_device_name(), run=run, rows=rows),
                      f, indent=1)
        del q, k, v, dout, out, lse, outs
    summary(rows)


def summary(rows):
    """Per (head_dim, causal, kind): geometric mean, min and max speedup, rows, bitwise."""
    groups = {}
    for r in rows:
        if r["speedup"]:
            groups.setdefault((r["head_dim"], r["causal"], r["kind"]), []).append(r)
    for (d, causal, kind), cells in sorted(groups.items()):
        sp = [c["speedup"] for c in cells]
        gm = math.exp(sum(map(math.log, sp)) / len(sp))
        print(f"d{d} {'causal' if causal else 'full  '} {kind} rows {len(sp):2d} geomean "
              f"{gm:.3f} min {min(sp):.3f} max {max(sp):.3f} dK/dV bitwise "
              f"{sum(c.get('dkdv_bitwise', False) for c in cells)}/{len(cells)}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
