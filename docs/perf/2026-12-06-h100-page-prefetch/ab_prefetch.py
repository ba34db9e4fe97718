"""A/B of a paged decode ring reading its next block's pages a round ahead
(`Sm80Key.page_prefetch`, "ahead") against looking each row's page up as its load is issued
("at_issue"), on the lent GPU (this run: an H100), in one process, beside the dense call over
the same bytes ("dense"). Timed as `bench --decode` times (cold L2: a 256 MB write between
samples; the honest timer). Each method is the best of two passes in opposite orders; the two
paged forms' outputs are compared bit for bit.

The rule, written before run 1: DECODE_PAGE_PREFETCH ships (True) if, over all rows, the
geometric mean of ahead / at_issue (time) is at most 0.99 and no row is above 1.03; in each
page size's rows separately the geometric mean must be at most 1.0. Run 2 takes new shapes
(other batches and key lengths), new inputs and new page orders, and the same rule must hold
again for it to ship.

Run 1: the shapes of `bench --decode` up to 2 GB of K/V, pages of 16, 64 and 256 keys.
Run 2: batch 2 and 16, 4096, 16384 and 65536 keys, the same heads and head dims.

Usage: ab_prefetch.py OUT RUN (RUN 1 or 2)"""
import json
import math
import sys
from pathlib import Path

import torch

import cute_fa
from cute_fa import tuning
from cute_fa.bench import decode
from cute_fa.bench.common import time_each, warm_gpu
from cute_fa.runtime.plan import clear_plans

PAGES = (16, 64, 256)
RUN2 = dict(batches=(2, 16), seqlens_k=(4096, 16384, 65536))


def shapes(run):
    if run == 1:
        kept, _ = decode.decode_shapes()
    else:
        kept = [dict(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hk, head_dim=d,
                     kv_bytes=decode.kv_bytes(b, sk, hk, d))
                for d in decode.DECODE_HEAD_DIMS for hq, hk in decode.DECODE_HEADS
                for sq in decode.DECODE_SEQLENS_Q for b in RUN2["batches"]
                for sk in RUN2["seqlens_k"]]
    return [s for s in kept if s["kv_bytes"] <= 2**31]


def set_ahead(ahead):
    tuning.DECODE_PAGE_PREFETCH = ahead
    clear_plans()


def gmean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def decide(rows):
    ratios = [r["ahead_over_at_issue"] for r in rows]
    ok = gmean(ratios) <= 0.99 and max(ratios) <= 1.03
    print(f"all: {len(ratios)} rows, ahead/at_issue geomean {gmean(ratios):.3f}, "
          f"min {min(ratios):.3f}, max {max(ratios):.3f}", flush=True)
    for page in PAGES:
        mine = [r["ahead_over_at_issue"] for r in rows if r["page_size"] == page]
        ok &= gmean(mine) <= 1.0
        print(f"page {page}: {len(mine)} rows, geomean {gmean(mine):.3f}, "
              f"max {max(mine):.3f}", flush=True)
        for form in ("at_issue", "ahead"):
            vs_dense = [r["us"][form] / r["us"]["dense"] for r in rows if r["page_size"] == page]
            print(f"   {form} / dense: geomean {gmean(vs_dense):.3f}, max {max(vs_dense):.3f}, "
                  f"within 5%: {sum(x <= 1.05 for x in vs_dense)} of {len(vs_dense)}",
                  flush=True)
    print("ships" if ok else "does not ship", flush=True)
    return ok


def main(out, run):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = torch.bfloat16
    flush = torch.empty(decode.FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(run)
    warm_gpu(torch)
    rows = []
    for shape in shapes(run):
        b, sq, sk = shape["batch"], shape["seqlen_q"], shape["seqlen_k"]
        hq, hk, d = shape["heads_q"], shape["heads_kv"], shape["head_dim"]
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=gen)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=gen)
        v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=gen)
        seqused = torch.full((b,), sk, device="cuda", dtype=torch.int32)
        reps = decode.decode_reps(shape["kv_bytes"])
        dense_us = math.inf
        for page in PAGES:
            pages = b * sk // page
            table = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32)
            paged = (q, k.view(pages, page, hk, d), v.view(pages, page, hk, d))
            cache = dict(page_table=table.view(b, sk // page), seqused_k=seqused)
            methods = {"dense": (False, (q, k, v), {}), "at_issue": (False, paged, cache),
                       "ahead": (True, paged, cache)}
            best, outs = {}, {}
            for order in (("dense", "at_issue", "ahead"), ("ahead", "at_issue", "dense")):
                for name in order:
                    ahead, args, kw = methods[name]
                    set_ahead(ahead)
                    us, errors, got = time_each(
                        torch, {name: lambda: cute_fa.forward(*args, causal=True, **kw)},
                        reps=reps, between=flush.zero_, warmup_s=0.0, warmup_calls=3,
                        keep_outputs=True)
                    if errors:
                        raise RuntimeError(errors)
                    best[name] = min(best.get(name, math.inf), us[name])
                    outs.setdefault(name, got[name])
            dense_us = min(dense_us, best["dense"])
            row = dict(shape, page_size=page, us=dict(best, dense=dense_us),
                       ahead_over_at_issue=best["ahead"] / best["at_issue"],
                       bitwise_equal=bool(torch.equal(outs["ahead"], outs["at_issue"])))
            if not row["bitwise_equal"]:
                raise RuntimeError(f"the two paged forms differ: {row}")
            print(json.dumps(row), flush=True)
            rows.append(row)
            del outs
        del q, k, v
    ships = decide(rows)
    (out / f"ab_prefetch_run{run}.json").write_text(json.dumps(dict(run=run, rows=rows,
                                                                     ships=ships), indent=1))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
