"""Warp-split decode sweep: variants of the decode tables, warmed (compiled) in parallel
processes, then timed in one process with bench._DecodeTimer."""
import json, sys, math, torch, cute_fa
import cute_fa.tuning as tuning
from cute_fa.compiler import memory_cache
from cute_fa.bench import _DecodeTimer

SHAPES = [(64, 2048, 64, 8, 128, 4), (8, 8192, 64, 8, 128, 4), (1, 32768, 64, 8, 128, 4), (32, 32768, 64, 8, 64, 4),
          (4, 8192, 64, 8, 64, 4), (1, 8192, 64, 8, 128, 4), (8, 32768, 32, 8, 128, 8), (64, 8192, 64, 8, 128, 4)]
import cute_fa.interface as iface
REAL_OCC = iface.decode_ctas_per_sm
VARIANTS = {
    "new": dict(),
    "rows64": dict(only16=True),
}
FULL = {k: list(v) for k, v in tuning.DECODE_WARP_SPLIT_TILES.items()}

def apply(name):
    v = VARIANTS[name]
    for k, tiles in FULL.items():
        tuning.DECODE_WARP_SPLIT_TILES[k] = [t for t in tiles if t[0] == 16] if v.get("only16") else list(tiles)
    tuning.num_splits_heuristic.cache_clear()
    memory_cache.clear()

def inputs(b, sk, hq, hk, d, sq=1):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, torch.randn(k.shape, device="cuda", dtype=torch.bfloat16, generator=g)

def ref(q, k, v):
    qt, kt, vt = (x.transpose(1, 2).float() for x in (q, k, v))
    sq, sk = q.shape[1], k.shape[1]
    mask = torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(sk - sq)
    return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True).transpose(1, 2)

mode = sys.argv[1]
if mode == "splits":
    timer = _DecodeTimer(torch)
    from cute_fa.interface import _decode_plan
    for shape, counts in [((1, 32768, 32, 8, 128), (16, 24, 33, 45, 64, 90)), ((64, 8192, 32, 8, 128), (1, 2, 3, 4, 6)),
                          ((8, 4096, 32, 8, 128), (3, 4, 6, 9, 12)), ((1, 2048, 64, 8, 64), (2, 4, 8, 16)),
                          ((32, 32768, 32, 8, 128), (1, 2, 3, 4, 6)), ((1, 131072, 32, 8, 128), (24, 33, 45, 64, 128))]:
        q, k, v = inputs(*shape)
        row = dict(shape=shape, auto=_decode_plan(0, q, k, True, None, None, None)[1])
        for c in counts:
            row[c] = round(timer.ms(lambda: cute_fa.forward(q, k, v, causal=True, num_splits=c), 4 * k.numel()) * 1000, 1)
        print(json.dumps(row), flush=True)
        del q, k, v
elif mode == "warm":
    for name in sys.argv[2:]:
        apply(name)
        for shape in SHAPES:
            q, k, v = inputs(*shape)
            o = cute_fa.forward(q, k, v, causal=True)
            if shape[0] * shape[1] <= 65536:
                err = (o.float() - ref(q, k, v)).abs().max().item()
                if err > 0.03: print(json.dumps(dict(variant=name, shape=shape, BAD_ERR=err)), flush=True)
            del q, k, v, o
    print("warm done", sys.argv[2:], flush=True)
else:
    timer = _DecodeTimer(torch)
    names = sys.argv[2:] or list(VARIANTS)
    res = {}
    for shape in SHAPES:
        q, k, v = inputs(*shape)
        nbytes = 2 * k.numel() * 2
        row = dict(shape=shape)
        for name in names:
            apply(name)
            t = timer.ms(lambda: cute_fa.forward(q, k, v, causal=True), nbytes) * 1000
            row[name] = round(t, 1)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        if shape[5:] in ((), (1,)):
            row["sdpa"] = round(timer.ms(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True), nbytes) * 1000, 1)
        row["TBps_best"] = round(nbytes / (min(row[n] for n in names) * 1e-6) / 1e12, 2)
        print(json.dumps(row), flush=True)
        for name in names: res.setdefault(name, []).append(row[name])
        del q, k, v
    for name in names:
        print(name, "geomean us", round(math.exp(sum(map(math.log, res[name])) / len(res[name])), 2))
