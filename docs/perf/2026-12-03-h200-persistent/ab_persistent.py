"""A/B of the persistent wgmma forward (`Sm90Key.persistent`, `PersistentTileScheduler`: one CTA
per SM looping over tiles) against the one-CTA-per-tile kernel it would replace, and against
every peer, in one process, on the same inputs: the paper grid (16k tokens, hidden 2048,
head_dim 64 and 128, S 1k-16k, causal and not) and the small-batch causal GQA prefill shapes
of `bench --prefill`. Each row checks the two kernels' outputs for bitwise equality (a tile's
arithmetic is the same; only which CTA runs it changes). Usage: ab_persistent.py OUT"""
import json
import os
import sys

import torch

import cute_fa
from cute_fa.bench.common import (HEAD_DIMS, HIDDEN, SEQLENS, TOKENS, dense_peers, fastest_peer,
                                  flops, time_each, warm_gpu)
from cute_fa.bench.prefill import SMALL_HEADS, SMALL_SHAPES
from cute_fa.runtime.plan import overriding

SMS = torch.cuda.get_device_properties(0).multi_processor_count


def sm90(q, k, v, causal):
    return cute_fa.forward(q, k, v, causal=causal, backend="sm90")


def sm90_persistent(q, k, v, causal):
    with overriding(persistent=SMS):
        return cute_fa.forward(q, k, v, causal=causal, backend="sm90")


def shapes():
    for d in HEAD_DIMS:
        for causal in (False, True):
            for s in SEQLENS:
                yield "grid", TOKENS // s, s, HIDDEN // d, HIDDEN // d, d, causal
    for hq, hk, d in SMALL_HEADS:
        for b, s in SMALL_SHAPES:
            yield "small", b, s, hq, hk, d, True


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    methods = {"cute_fa": lambda q, k, v, c: cute_fa.forward(q, k, v, causal=c),
               "sm90": sm90, "sm90_persistent": sm90_persistent, **dense_peers(torch)}
    warm_gpu(torch)
    rows = []
    for kind, b, s, hq, hk, d, causal in shapes():
        g = torch.Generator(device="cuda").manual_seed(b * s + hq + d)
        q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
                for _ in range(2))
        fns = {n: (lambda f=f: f(q, k, v, causal)) for n, f in methods.items()}
        us, errors, outs = time_each(torch, fns, reps=20, keep_outputs=True)
        again, _, _ = time_each(torch, dict(reversed(list(fns.items()))), reps=20)
        us = {n: (min(u, again[n]) if u and again.get(n) else u) for n, u in us.items()}
        peer, peer_us = fastest_peer(us)
        row = dict(kind=kind, batch=b, seqlen=s, heads_q=hq, heads_kv=hk, head_dim=d,
                   causal=causal, us=us, errors=errors, fastest_peer=peer,
                   bitwise=bool(torch.equal(outs["sm90"], outs["sm90_persistent"])),
                   persistent_speedup=round(us["sm90"] / us["sm90_persistent"], 3),
                   vs_fastest={n: round(peer_us / us[n], 3)
                               for n in ("cute_fa", "sm90", "sm90_persistent") if us.get(n)},
                   tflops={n: round(flops(b, hq, s, d, causal) / u / 1e6, 1)
                           for n, u in us.items() if u})
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(os.path.join(out_dir, "ab_persistent.json"), "w") as f:
            json.dump(dict(sms=SMS, rows=rows), f, indent=1)
        del q, k, v, fns, outs


if __name__ == "__main__":
    main(sys.argv[1])
