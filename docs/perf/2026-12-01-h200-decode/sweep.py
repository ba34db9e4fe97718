# As it ran on the H200 against commit 7b8eff9 (later commits changed _decode_plan to return
# (kernel, num_splits)).
"""Decode tuning sweep on the H200: K/V ring stages (0 = single buffers, 2, 3) with the
heuristic's split count, and a num_splits sweep at the default stages."""
import json, sys, torch, cute_fa
import cute_fa.tuning as tuning
from cute_fa.compiler import memory_cache
from cute_fa.interface import _decode_plan
from cute_fa.bench import _time_ms

SHAPES = [(1, 32768, 32, 8, 128), (8, 4096, 32, 8, 128), (32, 2048, 32, 8, 128), (1, 131072, 32, 8, 128),
          (64, 8192, 32, 8, 128), (8, 32768, 64, 8, 64), (4, 8192, 32, 8, 128, 4), (1, 32768, 16, 16, 128),
          (64, 2048, 16, 16, 64), (32, 32768, 32, 8, 128)]
flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")

def inputs(b, sk, hq, hk, d, sq=1):
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
    return q, k, torch.randn_like(k)

def us(fn):
    return round(_time_ms(torch, fn, before=flush.zero_) * 1000, 1)

def tbps(shape, t):
    b, sk, hq, hk, d = shape[:5]
    return round(2 * b * sk * hk * d * 2 / (t * 1e-6) / 1e12, 2)

mode = sys.argv[1]
for shape in SHAPES:
    q, k, v = inputs(*shape)
    row = dict(shape=shape)
    if mode == "variants":
        sys.path.insert(0, ".dbg")
        from variants import VARIANTS, apply
        for name in VARIANTS:
            apply(tuning, name)
            memory_cache.clear()
            t = us(lambda: cute_fa.forward(q, k, v, causal=True))
            row[name] = (t, tbps(shape, t))
        memory_cache.clear()
    else:
        row["auto_splits"] = _decode_plan(0, q, k, True, "auto", None, None, None).num_splits
        for s in (1, 2, 4, 8, 16, 32, 64, 128):
            if shape[0] * s <= 65535:
                row[s] = us(lambda: cute_fa.forward(q, k, v, causal=True, num_splits=s))
        t = us(lambda: cute_fa.forward(q, k, v, causal=True))
        row["heuristic"] = (t, tbps(shape, t))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        t = us(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=shape[2] != shape[3]))
        row["sdpa"] = (t, tbps(shape, t))
    print(json.dumps(row), flush=True)
    del q, k, v
