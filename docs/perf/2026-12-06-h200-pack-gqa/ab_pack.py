"""A/B of GQA packing in the wgmma forward (`Sm90Key.pack_gqa`) against the unpacked kernel,
next to every peer, in one process on the lent GPU, timed by `bench.common.gpu_time_us` (the
honest timer: GPU time behind a spin, host launch hidden for every method alike).

Methods per shape (bf16, GQA): 'unpacked', `cute_fa.forward(q, k, v, causal=...)` with
`overriding(pack_gqa=1)`; 'packed', the same plan with `overriding(pack_gqa=heads_q //
heads_kv)`; the peers SDPA default / flash / cuDNN and flash-attn-4. cute_fa's two forms are
each timed twice, in opposite orders, best of the two.

Protocol, written before either run:
- `ab_pack.py OUT warm`: compiles every kernel both runs use, in a pool of processes sharing
  $CUTE_FA_CACHE_DIR, so that no compile lands in a timed process.
- `ab_pack.py OUT 1`: the small-batch prefill shapes of `bench --prefill` (batch 1-4, S
  512-8k, 32/8 and 64/8 heads, head_dim 64 and 128), causal and not. `fit` then picks, per
  (head_dim class, causal), the range of query counts in which packing is taken: among the
  ranges of run 1's query counts whose rows have a packed/unpacked geometric mean of at most
  0.98 and no row above 1.02, the one with the most rows (ties: the lower mean); a range
  reaching run 1's shortest (longest) call is open below (above). Written to OUT/fit.json.
- `ab_pack.py OUT 2`: other shapes (S 512-6000, batches 1-8, groups 2, 6 and 8), fresh inputs,
  `tuning.SM90_PACK_GQA_SEQLEN` set to the fit. `decide`: a class's range ships only if, on
  run 2's rows where the rule packs, packed/unpacked has a geometric mean of at most 0.98 and
  no row above 1.03. Written to OUT/decision.json: the table `tuning` then holds.
"""
import json
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

RUN1 = [(b, s, hq, hk, d, c) for c in (True, False) for hq, hk, d in
        ((32, 8, 128), (64, 8, 128), (32, 8, 64), (64, 8, 64))
        for b, s in ((1, 512), (1, 2000), (1, 8192), (2, 1024), (4, 1024), (4, 4096))]
RUN2 = [(b, s, hq, hk, d, c) for c in (True, False) for hq, hk, d in
        ((32, 4, 128), (16, 8, 128), (48, 8, 64))
        for b, s in ((1, 768), (1, 1500), (1, 3000), (2, 6000), (3, 1500), (8, 512))]
# run 3, added after run 2 left causal head_dim 64 resting on one packed row (its only group,
# 6, divides the 192-row long tile alone): head_dim 64 again, groups 4, 8 and 16, other shapes;
# a class of decision.json stays only if `decide` holds on these rows too (confirm.json)
RUN3 = [(b, s, hq, hk, 64, c) for c in (True, False) for hq, hk in ((32, 8), (16, 4), (32, 2))
        for b, s in ((1, 768), (1, 1500), (1, 3000), (2, 2500), (3, 1200), (8, 600))]
REPS = 20
FIT_MEAN, FIT_WORST, SHIP_MEAN, SHIP_WORST = 0.98, 1.02, 0.98, 1.03


def forward(q, k, v, causal, pack):
    import cute_fa
    from cute_fa.runtime.plan import overriding

    with overriding(pack_gqa=pack):
        return cute_fa.forward(q, k, v, causal=causal)


def _warm(job):
    import torch

    from cute_fa.compile.cache import wait_for_saves

    s, hq, hk, d, causal, pack = job
    q = torch.randn(1, s, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, s, hk, d, device="cuda", dtype=torch.bfloat16)
    try:
        forward(q, k, k, causal, pack)
    except ValueError as exc:  # a group that does not divide the tile: the timed run says so
        print("not compiled:", job, exc, flush=True)
    torch.cuda.synchronize()
    wait_for_saves()


def warm():
    """One job per kernel: the long-tile flag depends on S, so S is kept, batch 1."""
    jobs = set()
    for b, s, hq, hk, d, c in RUN1 + RUN2:
        g = hq // hk
        for pack in {1, g}:
            jobs.add((s, hq, hk, d, c, pack))
    with mp.get_context("spawn").Pool(14) as pool:
        pool.map(_warm, sorted(jobs), chunksize=1)


def measure(shapes, seed, out: Path, name: str):
    import torch

    from cute_fa.bench.common import dense_peers, fastest_peer, time_each

    peers = dense_peers(torch)
    rows = []
    for b, s, hq, hk, d, causal in shapes:
        g = hq // hk
        gen = torch.Generator("cuda").manual_seed(seed * 100003 + b * s + hq + d + causal)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for h in (hq, hk, hk))
        fns = {"unpacked": lambda: forward(q, k, v, causal, 1),
               "packed": lambda: forward(q, k, v, causal, g)}
        us1, err1, outs = time_each(torch, fns, reps=REPS, keep_outputs=True)
        us2, err2, _ = time_each(torch, dict(reversed(list(fns.items()))), reps=REPS)
        us = {n: min((x for x in (us1.get(n), us2.get(n)) if x), default=None) for n in fns}
        pus, perr, _ = time_each(torch, {n: (lambda f=f: f(q, k, v, causal))
                                         for n, f in peers.items()}, reps=REPS)
        us.update(pus)
        diff = None
        if "packed" in outs and "unpacked" in outs:
            diff = (outs["packed"].float() - outs["unpacked"].float()).abs().max().item()
        peer, peer_us = fastest_peer(us)
        ratio = us["packed"] / us["unpacked"] if us["packed"] and us["unpacked"] else None
        row = dict(batch=b, seqlen=s, heads_q=hq, heads_kv=hk, head_dim=d, causal=causal,
                   us=us, errors={**err1, **err2, **perr}, max_diff_packed_unpacked=diff,
                   fastest_peer=peer, packed_over_unpacked=ratio,
                   vs_peer={n: (peer_us / us[n] if us.get(n) and peer_us else None)
                            for n in fns})
        print(json.dumps(row), flush=True)
        rows.append(row)
        (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
        del q, k, v, outs
    return rows


def _geo(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def fit(rows) -> dict:
    """`tuning.SM90_PACK_GQA_SEQLEN` from run 1's rows (the rule in the module docstring)."""
    from cute_fa.tuning import head_dim_class

    table, detail = {}, {}
    for cls, causal in sorted({(head_dim_class(r["head_dim"]), r["causal"]) for r in rows}):
        mine = [r for r in rows if head_dim_class(r["head_dim"]) == cls and r["causal"] == causal]
        seqs = sorted({r["seqlen"] for r in mine})
        best = None
        for i in range(len(seqs)):
            for j in range(i, len(seqs)):
                ratios = [r["packed_over_unpacked"] for r in mine
                          if seqs[i] <= r["seqlen"] <= seqs[j]]
                if None in ratios:
                    continue
                geo, worst = _geo(ratios), max(ratios)
                if geo <= FIT_MEAN and worst <= FIT_WORST:
                    cand = (len(ratios), -geo, i, j)
                    best = cand if best is None or cand[:2] > best[:2] else best
        if best is not None:
            _, neg_geo, i, j = best
            lo = 1 if i == 0 else seqs[i]
            hi = 2 ** 31 - 1 if j == len(seqs) - 1 else seqs[j]
            table[f"{cls},{int(causal)}"] = [lo, hi]
            detail[f"{cls},{int(causal)}"] = dict(rows=best[0], geomean=-neg_geo,
                                                  measured=[seqs[i], seqs[j]])
    return dict(table=table, detail=detail)


def as_table(fitted: dict) -> dict:
    return {(int(c.split(",")[0]), bool(int(c.split(",")[1]))): tuple(v)
            for c, v in fitted.items()}


def decide(rows, fitted: dict) -> dict:
    """Run 2's check of the fitted rule, per class."""
    from cute_fa import tuning

    table = as_table(fitted["table"])
    tuning.SM90_PACK_GQA_SEQLEN = table
    per_class, shipped = {}, {}
    for key, rng in table.items():
        taken = [r["packed_over_unpacked"] for r in rows
                 if (tuning.head_dim_class(r["head_dim"]), r["causal"]) == key
                 and tuning.sm90_pack_gqa(r["head_dim"], r["causal"], r["seqlen"],
                                          r["heads_q"], r["heads_kv"]) > 1]
        taken = [x for x in taken if x is not None]
        name = f"{key[0]},{int(key[1])}"
        if not taken:
            per_class[name] = dict(rows_packed=0, ships=False)
            continue
        ok = _geo(taken) <= SHIP_MEAN and max(taken) <= SHIP_WORST
        per_class[name] = dict(rows_packed=len(taken), geomean=_geo(taken), worst=max(taken),
                               best=min(taken), ships=ok)
        if ok:
            shipped[name] = list(rng)
    return dict(per_class=per_class, table=shipped)


def main():
    out, step = Path(sys.argv[1]), sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    if step == "warm":
        warm()
        print("warm", round(time.time() - start), "s,", len(os.listdir(
            os.environ["CUTE_FA_CACHE_DIR"])), "files", flush=True)
        return
    import torch

    from cute_fa import tuning
    from cute_fa.bench.common import warm_gpu

    info = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                date=time.strftime("%Y-%m-%d"))
    warm_gpu(torch, 2.0)
    if step == "1":
        rows = measure(RUN1, 1, out, "run1")
        fitted = fit(rows)
        (out / "fit.json").write_text(json.dumps(dict(info, **fitted), indent=1))
        print(json.dumps(fitted), flush=True)
    else:  # run 2 checks run 1's fit, run 3 run 2's decision, on their own shapes
        source, shapes, result = {"2": ("fit", RUN2, "decision"),
                                  "3": ("decision", RUN3, "confirm")}[step]
        rule = json.loads((out / f"{source}.json").read_text())
        tuning.SM90_PACK_GQA_SEQLEN = as_table(rule["table"])
        decision = decide(measure(shapes, int(step), out, f"run{step}"), rule)
        (out / f"{result}.json").write_text(json.dumps(dict(info, **decision), indent=1))
        print(json.dumps(decision), flush=True)
    print("done", round(time.time() - start), "s", flush=True)


if __name__ == "__main__":
    main()
