"""A/B of head_dim 64 wgmma backward tiles, in one process (compiles warmed in a pool first)."""
import json, os, sys, time
import multiprocessing as mp
import torch

TILES = {"cur": (128, 2, 2, 1, False), "A64x1x2c2": (64, 1, 2, 2, False), "B64x1x3c2": (64, 1, 3, 2, False),
         "C128x1x2c1": (128, 1, 2, 1, False)}
SOFT = {"cur": (64, 2, 2, 1, False), "A64x1x2c2": (64, 1, 2, 2, False)}
# (kind, batch, heads_q, heads_kv, seqlen, causal, det, softcap)
SHAPES = []
for causal in (False, True):
    for s in (1024, 2048, 4096, 8192, 16384):
        SHAPES.append(("grid", 16384 // s, 32, 32, s, causal, False, 0.0))
SHAPES += [("gqa", 1, 32, 8, 4096, True, False, 0.0), ("gqa", 2, 64, 8, 4096, True, False, 0.0),
           ("det", 4, 32, 32, 4096, True, True, 0.0), ("det", 1, 32, 32, 16384, False, True, 0.0),
           ("softcap", 4, 32, 32, 4096, True, False, 30.0)]


def use(tile, soft):
    import cute_fa.tuning as t
    from cute_fa.runtime import plan
    t.BWD_SM90_TILES[64] = tile
    t.BWD_SM90_SOFTCAP_TILES[64] = soft
    plan.clear_plans()


def inputs(shape):
    kind, b, hq, hkv, s, causal, det, sc = shape
    g = torch.Generator(device="cuda").manual_seed(s + b + hq)
    q, do = (torch.randn(b, s, hq, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(b, s, hkv, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    import cute_fa
    o, lse = cute_fa.forward(q, k, v, causal=causal, softcap=sc, return_lse=True)
    return q, k, v, do, o, lse


def call(shape, t):
    import cute_fa
    kind, b, hq, hkv, s, causal, det, sc = shape
    q, k, v, do, o, lse = t
    return cute_fa.backward(do, q, k, v, o, lse, causal, softcap=sc, deterministic=det)


def warm(args):
    name, i = args
    use(TILES[name], SOFT.get(name, SOFT["cur"]))
    shape = SHAPES[i]
    if shape[0] == "softcap" and name not in SOFT:
        return
    call(shape, inputs(shape))
    torch.cuda.synchronize()
    from cute_fa.compile.cache import wait_for_saves
    wait_for_saves()


if __name__ == "__main__":
    out = sys.argv[1]
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(12) as pool:
        pool.map(warm, [(n, i) for n in TILES for i in range(len(SHAPES))], chunksize=1)
    print("warm", round(time.time() - t0), flush=True)
    from cute_fa.bench.common import gpu_time_us, warm_gpu, flash_attn_4
    warm_gpu(torch)
    fa4 = flash_attn_4()
    rows = []
    for shape in SHAPES:
        t = inputs(shape)
        kind, b, hq, hkv, s, causal, det, sc = shape
        row = dict(shape=shape, us={}, err={})
        ref = None
        names = [n for n in TILES if shape[0] != "softcap" or n in SOFT]
        for rep in range(2):
            for name in (names if rep == 0 else names[::-1]):
                use(TILES[name], SOFT.get(name, SOFT["cur"]))
                g = call(shape, t)
                if ref is None:
                    ref = g
                else:
                    row["err"][name] = max(float((a.float() - r.float()).abs().max()) for a, r in zip(g, ref))
                us = gpu_time_us(torch, lambda: call(shape, t), reps=20)
                row["us"][name] = min(us, row["us"].get(name, 1e30))
        if fa4 is not None and not det:
            q, k, v, do, o, lse = t
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            kw = dict(causal=causal)
            if sc:
                kw["softcap"] = sc
            try:
                of = fa4[0](*leaves, **kw)
                of = of[0] if isinstance(of, tuple) else of
                row["us"]["fa4"] = gpu_time_us(torch, lambda: torch.autograd.grad(of, leaves, do, retain_graph=True), reps=20)
            except Exception as e:
                row["err"]["fa4"] = str(e)[:200]
        base = row["us"]["cur"]
        row["vs_cur"] = {n: round(base / u, 3) for n, u in row["us"].items()}
        print(json.dumps(row), flush=True)
        rows.append(row)
        del t
    os.makedirs(out, exist_ok=True)
    json.dump(rows, open(f"{out}/ab_d64.json", "w"), indent=1)
