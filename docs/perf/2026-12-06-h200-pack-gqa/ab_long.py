"""A/B, after the packing decision: packed causal head_dim-64 calls of fewer than 2048 queries
on the three-warpgroup tile (192 x 128, `tuning.SM90_LONG_TILES`' tile) against the packed
two-warpgroup tile 'auto' now takes (flash-attn-4 runs 192 packed rows there: ncu_summary.txt).
Same timer and protocol as ab_pack.py: each form twice, opposite orders, best of two.

Rule, written before the run: the packed long tile is taken below 2048 queries from the
smallest S of the rows here such that every row at or above it has long/short <= 1.0 and their
geometric mean is <= 0.98; none if no such S. `ab_long.py OUT`."""
import json
import math
import sys
from pathlib import Path

import torch

import cute_fa
from cute_fa import tuning
from cute_fa.bench.common import fastest_peer, time_each, warm_gpu
from cute_fa.runtime.plan import overriding

SHAPES = [(b, s, hq, hk) for hq, hk in ((32, 8), (64, 8), (16, 4), (32, 2))
          for b, s in ((1, 512), (8, 600), (1, 768), (2, 1024), (4, 1024), (3, 1200),
                       (1, 1500), (1, 2000))]
REPS = 20


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    long_tile = tuning.sm90_tile("bfloat16", 64, True, long=True)
    warm_gpu(torch, 2.0)
    rows = []
    for b, s, hq, hk in SHAPES:
        g = hq // hk
        gen = torch.Generator("cuda").manual_seed(7 * b + s + hq)
        q, k, v = (torch.randn(b, s, h, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for h in (hq, hk, hk))

        def short():
            with overriding(pack_gqa=g):
                return cute_fa.forward(q, k, v, causal=True)

        def long():
            with overriding(pack_gqa=g, tile=long_tile):
                return cute_fa.forward(q, k, v, causal=True)
        fns = {"short": short, "long": long}
        us1, e1, outs = time_each(torch, fns, reps=REPS, keep_outputs=True)
        us2, e2, _ = time_each(torch, dict(reversed(list(fns.items()))), reps=REPS)
        us = {n: min(x for x in (us1[n], us2[n]) if x) for n in fns}
        row = dict(batch=b, seqlen=s, heads_q=hq, heads_kv=hk, us=us, errors={**e1, **e2},
                   long_over_short=us["long"] / us["short"],
                   max_diff=(outs["long"].float() - outs["short"].float()).abs().max().item())
        print(json.dumps(row), flush=True)
        rows.append(row)
    decision = None
    for s0 in sorted({r["seqlen"] for r in rows}):
        sel = [r["long_over_short"] for r in rows if r["seqlen"] >= s0]
        geo = math.exp(sum(map(math.log, sel)) / len(sel))
        if max(sel) <= 1.0 and geo <= 0.98:
            decision = dict(from_seqlen=s0, rows=len(sel), geomean=geo, worst=max(sel))
            break
    print(json.dumps(dict(decision=decision)), flush=True)
    (out / "ab_long.json").write_text(json.dumps(dict(
        device=torch.cuda.get_device_name(), rows=rows, decision=decision), indent=1))


if __name__ == "__main__":
    main()
