"""A/B of split-KV decode in one launch against two, on the H200, in one process: the split
kernel whose last CTA per query block merges the partials (`Sm80Key.fused_merge`, "one")
against the split kernel followed by the merge kernel ("two"), on every shape of `bench
--decode` (dense, and paged with 64-key pages) whose call the heuristic splits, timed as that
benchmark times (cold L2: a 256 MB write between samples; the honest timer). Each form is the
best of two passes in opposite orders, and the two forms' outputs are compared bit for bit.

Two runs, each rule written before its run:

- Run 1 (ab_merge_run1.json, seed 0), `decide_classes`: a head_dim class takes one launch
  where, over its rows, the geometric mean of one / two (time) is at most 0.99 and no row is
  above 1.03. Result: neither class (geomean 1.002 and 1.023, up to 1.59x), with a pattern:
  one launch won (0.92x-1.00x) where the last CTA merges its rows in one round of loads and
  the unsplit grid is smaller than the GPU, and lost where its merge takes several.
- Run 2 (ab_merge.json, seed 1), `decide_rule`: that pattern became `tuning.decode_fused_merge`
  before this run. It ships (DECODE_FUSED_MERGE = "rule") if, per head_dim class, over the rows
  where it picks one launch, the geometric mean of one / two is at most 0.99 and no row is
  above 1.03; else "never".

`ab_merge.py bench OUT` then runs `bench --decode` (into OUT/decode) with what the rule gave
(OUT/ab_merge.json's "chosen").

Usage: ab_merge.py OUT [SEED]; ab_merge.py bench OUT"""
import json
import math
import sys
from pathlib import Path

import torch

import cute_fa
from cute_fa import tuning
from cute_fa.api.checks import check_forward
from cute_fa.bench import decode
from cute_fa.bench.common import time_each, warm_gpu
from cute_fa.runtime.call import DENSE
from cute_fa.runtime.device import device
from cute_fa.runtime.plan import clear_plans, plan

FORMS = {"two": "never", "one": "always", "rule": "rule"}
PAGE = 64


def set_form(name):
    tuning.DECODE_FUSED_MERGE = FORMS[name]
    clear_plans()


def planned(q, k, v, **cache):
    """(num_splits, one launch) of the call under the current form."""
    call = check_forward(DENSE, q, k, v, causal=True, **cache)
    found = plan(call, device(q.get_device()), compile=False)
    return found.num_splits, found.key.fused_merge


def _summary(ratios):
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    return geo, f"{len(ratios)} rows, one/two geomean {geo:.3f}, min {min(ratios):.3f}, " \
        f"max {max(ratios):.3f}"


def decide_rule(rows):
    ships = True
    for cls in sorted({r["head_dim"] for r in rows}):
        taken = [r["one_over_two"] for r in rows if r["head_dim"] == cls and r["rule_one"]]
        left = [r["one_over_two"] for r in rows if r["head_dim"] == cls and not r["rule_one"]]
        geo, text = _summary(taken)
        ok = geo <= 0.99 and max(taken) <= 1.03
        ships &= ok
        print(f"head_dim {cls}, where the rule takes one launch: {text} -> "
              f"{'holds' if ok else 'fails'}", flush=True)
        if left:
            print(f"head_dim {cls}, where it keeps two: {_summary(left)[1]}", flush=True)
    return "rule" if ships else "never"


def decide_classes(rows):
    chosen = set()
    for cls in sorted({r["head_dim"] for r in rows}):
        ratios = [r["one_over_two"] for r in rows if r["head_dim"] == cls]
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        if geo <= 0.99 and max(ratios) <= 1.03:
            chosen.add(cls)
        print(f"head_dim {cls}: {len(ratios)} rows, one/two geomean {geo:.3f}, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f} -> "
              f"{'one launch' if cls in chosen else 'two launches'}", flush=True)
    return frozenset(chosen)


def main(out, seed):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = torch.bfloat16
    flush = torch.empty(decode.FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kept, _ = decode.decode_shapes()
    warm_gpu(torch)
    rows = []
    for shape in kept:
        b, sq, sk = shape["batch"], shape["seqlen_q"], shape["seqlen_k"]
        hq, hk, d = shape["heads_q"], shape["heads_kv"], shape["head_dim"]
        if shape["kv_bytes"] > 2**31:
            continue  # split calls are small-batch ones; this keeps the run short
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=gen)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=gen)
        v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=gen)
        pages = b * sk // PAGE
        table = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32)
        cache = dict(page_table=table.view(b, sk // PAGE),
                     seqused_k=torch.full((b,), sk, device="cuda", dtype=torch.int32))
        for layout, args, kw in (("dense", (q, k, v), {}),
                                 ("paged", (q, k.view(pages, PAGE, hk, d),
                                            v.view(pages, PAGE, hk, d)), cache)):
            set_form("rule")
            splits, rule_one = planned(*args, **kw)
            if splits == 1:
                continue
            best, outs = {}, {}
            for order in (("two", "one"), ("one", "two")):
                for name in order:
                    set_form(name)
                    us, errors, got = time_each(
                        torch, {name: lambda: cute_fa.forward(*args, causal=True, **kw)},
                        reps=decode.decode_reps(shape["kv_bytes"]), between=flush.zero_,
                        warmup_s=0.0, warmup_calls=3, keep_outputs=True)
                    if errors:
                        raise RuntimeError(errors)
                    best[name] = min(best.get(name, math.inf), us[name])
                    outs.setdefault(name, got[name])
            row = dict(shape, layout=layout, page_size=PAGE if kw else None,
                       num_splits=splits, rule_one=rule_one, us=best,
                       one_over_two=best["one"] / best["two"],
                       bitwise_equal=bool(torch.equal(outs["one"], outs["two"])))
            print(json.dumps(row), flush=True)
            rows.append(row)
            del outs
        del q, k, v
    decide_classes(rows)  # run 1's rule, for comparison
    chosen = decide_rule(rows)
    (out / "ab_merge.json").write_text(json.dumps(dict(seed=seed, rows=rows, chosen=chosen),
                                                  indent=1))


def bench(out):
    out = Path(out)
    tuning.DECODE_FUSED_MERGE = json.loads((out / "ab_merge.json").read_text())["chosen"]
    clear_plans()
    decode.main(str(out / "decode"))


if __name__ == "__main__":
    bench(sys.argv[2]) if sys.argv[1] == "bench" else main(sys.argv[1], int(sys.argv[2]))
