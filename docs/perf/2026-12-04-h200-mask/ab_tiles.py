"""A/B of what 'auto' runs for causal calls at head_dim 64 on the H200, once the wgmma kernel's
mask is a bit mask (`mask.apply_mask(..., bitmask=True)`): the wgmma kernel on its 128 x 128
tile of two consumer warpgroups (`sm90_2wg`), on the 192 x 128 tile of three (`sm90_3wg`), the
TMA kernel (`tma`, with its small-grid tile where the grid is small) and every peer, in one
process, on the same inputs: the paper grid's causal head_dim 64 rows (S 1k-16k) and the
small-batch causal GQA prefill rows of `bench --prefill` at head_dim 64. Each method is the
best of two passes in opposite orders. `decide()` is the rule, written before the run:

- SM90_LONG_TILES[(64, True)]: the smallest S of the grid from which sm90_3wg / sm90_2wg >= 1.01
  on every grid row of at least S queries and >= 0.99 on every prefill row of at least S
  queries; none if no S qualifies.
- AUTO_SHORT_CAUSAL[("sm_90a", 64)]: the largest S up to which tma / (the faster wgmma tile at
  that S under the first rule) >= 1.02 on every row of at most S queries; none if the shortest
  row already fails.

Usage: ab_tiles.py OUT"""
import json
import os
import sys

import torch

import cute_fa
from cute_fa.bench.common import (HIDDEN, SEQLENS, TOKENS, dense_peers, fastest_peer, flops,
                                  time_each, warm_gpu)
from cute_fa.bench.prefill import SMALL_HEADS, SMALL_SHAPES
from cute_fa.layouts import TileConfig
from cute_fa.runtime.plan import overriding

TILES = {"sm90_2wg": (128, 128, 256), "sm90_3wg": (192, 128, 384)}


def wgmma(name):
    block_m, block_n, threads = TILES[name]

    def run(q, k, v):
        tile = TileConfig(head_dim=64, block_m=block_m, block_n=block_n, num_threads=threads,
                          dtype="bfloat16", wgmma=True)
        with overriding(tile=tile):
            return cute_fa.forward(q, k, v, causal=True, backend="sm90")
    return run


def shapes():
    for s in SEQLENS:
        yield "grid", TOKENS // s, s, HIDDEN // 64, HIDDEN // 64
    for hq, hk, d in SMALL_HEADS:
        if d == 64:
            for b, s in SMALL_SHAPES:
                yield "prefill", b, s, hq, hk


def decide(rows):
    ratio = {id(r): r["us"]["sm90_2wg"] / r["us"]["sm90_3wg"] for r in rows}
    long_from = None
    for s in sorted({r["seqlen"] for r in rows if r["kind"] == "grid"}):
        if all(ratio[id(r)] >= (1.01 if r["kind"] == "grid" else 0.99)
               for r in rows if r["seqlen"] >= s):
            long_from = s
            break

    def wgmma_us(r):
        return r["us"]["sm90_3wg" if long_from is not None and r["seqlen"] >= long_from
                       else "sm90_2wg"]

    short_to = None
    for s in sorted({r["seqlen"] for r in rows}):
        if all(wgmma_us(r) / r["us"]["tma"] >= 1.02 for r in rows if r["seqlen"] <= s):
            short_to = s
        else:
            break
    return dict(long_tile_from=long_from, short_causal_tma_to=short_to,
                ratio_3wg_over_2wg={f"{r['kind']} B{r['batch']} S{r['seqlen']} "
                                    f"H{r['heads_q']}/{r['heads_kv']}": round(ratio[id(r)], 3)
                                    for r in rows})


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    methods = {"cute_fa": lambda q, k, v: cute_fa.forward(q, k, v, causal=True),
               "sm90_2wg": wgmma("sm90_2wg"), "sm90_3wg": wgmma("sm90_3wg"),
               "tma": lambda q, k, v: cute_fa.forward(q, k, v, causal=True, backend="tma"),
               **{n: (lambda q, k, v, f=f: f(q, k, v, True)) for n, f in dense_peers(torch).items()}}
    warm_gpu(torch)
    rows = []
    for kind, b, s, hq, hk in shapes():
        g = torch.Generator(device="cuda").manual_seed(b * s + hq)
        q = torch.randn(b, s, hq, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(b, s, hk, 64, device="cuda", dtype=torch.bfloat16, generator=g)
                for _ in range(2))
        fns = {n: (lambda f=f: f(q, k, v)) for n, f in methods.items()}
        us, errors, outs = time_each(torch, fns, reps=20, keep_outputs=True)
        again, _, _ = time_each(torch, dict(reversed(list(fns.items()))), reps=20)
        us = {n: (min(u, again[n]) if u and again.get(n) else u) for n, u in us.items()}
        ref = outs["sdpa_flash"].float() if "sdpa_flash" in outs else None
        peer, peer_us = fastest_peer(us)
        row = dict(kind=kind, batch=b, seqlen=s, heads_q=hq, heads_kv=hk, head_dim=64,
                   causal=True, us=us, errors=errors, fastest_peer=peer,
                   max_abs_vs_sdpa_flash={n: float((o.float() - ref).abs().max())
                                          for n, o in outs.items() if ref is not None
                                          and n in ("cute_fa", "sm90_2wg", "sm90_3wg", "tma")},
                   vs_fastest={n: round(peer_us / us[n], 3) for n in
                               ("cute_fa", "sm90_2wg", "sm90_3wg", "tma") if us.get(n)},
                   tflops={n: round(flops(b, hq, s, 64, True) / u / 1e6, 1)
                           for n, u in us.items() if u})
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(os.path.join(out_dir, "ab_tiles.json"), "w") as f:
            json.dump(dict(rows=rows), f, indent=1)
        del q, k, v, fns, outs
    decision = decide(rows)
    print(json.dumps(decision, indent=1))
    with open(os.path.join(out_dir, "ab_tiles.json"), "w") as f:
        json.dump(dict(rows=rows, decision=decision), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
