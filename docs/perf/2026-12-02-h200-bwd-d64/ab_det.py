"""A/B of the deterministic launch order (heads first vs key blocks first), one process."""
import json, os, sys, time
import multiprocessing as mp
import torch

VARIANTS = {"kb_first": False, "heads_first": True}
# (head_dim, batch, heads_q, heads_kv, seqlen, causal, backend)
SHAPES = []
for d in (128, 64):
    for causal in (False, True):
        for s in (1024, 4096, 16384):
            SHAPES.append((d, 16384 // s, 2048 // d, 2048 // d, s, causal, "auto"))
SHAPES += [(128, 1, 32, 8, 4096, True, "auto"), (128, 2, 64, 8, 4096, True, "auto"),
           (128, 1, 32, 8, 8192, False, "auto"),
           (128, 4, 16, 16, 4096, False, "sm80"), (128, 4, 16, 16, 4096, True, "sm80")]


def use(variant):
    from cute_fa.kernels.bwd.base import FlashBwdBase
    from cute_fa.compile import cache
    from cute_fa.runtime import plan
    FlashBwdBase.HEADS_FIRST = VARIANTS[variant]
    os.environ["CUTE_FA_CACHE_DIR"] = f"/tmp/cfa_{variant}"
    cache.compiled_kernels.clear()
    plan.clear_plans()


def inputs(shape):
    d, b, hq, hkv, s, causal, backend = shape
    g = torch.Generator(device="cuda").manual_seed(s + b + hq + d)
    q, do = (torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    import cute_fa
    o, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True)
    return q, k, v, do, o, lse


def call(shape, t, det):
    import cute_fa
    d, b, hq, hkv, s, causal, backend = shape
    q, k, v, do, o, lse = t
    return cute_fa.backward(do, q, k, v, o, lse, causal, deterministic=det, backend=backend)


def warm(args):
    variant, i = args
    use(variant)
    t = inputs(SHAPES[i])
    call(SHAPES[i], t, True)
    if variant == "kb_first":
        call(SHAPES[i], t, False)
    torch.cuda.synchronize()
    from cute_fa.compile.cache import wait_for_saves
    wait_for_saves()


if __name__ == "__main__":
    out = sys.argv[1]
    t0 = time.time()
    with mp.get_context("spawn").Pool(12) as pool:
        pool.map(warm, [(v, i) for v in VARIANTS for i in range(len(SHAPES))], chunksize=1)
    print("warm", round(time.time() - t0), flush=True)
    from cute_fa.bench.common import gpu_time_us, warm_gpu
    from cute_fa.runtime import plan
    snaps = {}
    for v in VARIANTS:  # load each variant's kernels into its own plans
        use(v)
        for shape in SHAPES:
            t = inputs(shape)
            call(shape, t, True)
            if v == "kb_first":
                call(shape, t, False)
        snaps[v] = (dict(plan._BACKWARD), dict(plan._BACKWARD_MAIN))

    def switch(v):
        plan._BACKWARD.clear(); plan._BACKWARD.update(snaps[v][0])
        plan._BACKWARD_MAIN.clear(); plan._BACKWARD_MAIN.update(snaps[v][1])

    warm_gpu(torch)
    rows = []
    for shape in SHAPES:
        t = inputs(shape)
        row = dict(shape=shape, us={}, same={})
        ref = None
        for rep in range(2):
            for v in (list(VARIANTS) + ["default"])[::(1 if rep == 0 else -1)]:
                switch("kb_first" if v == "default" else v)
                det = v != "default"
                g = call(shape, t, det)
                if det:
                    if ref is None:
                        ref = g
                    else:
                        row["same"][v] = all(bool(torch.equal(a, r)) for a, r in zip(g, ref))
                us = gpu_time_us(torch, lambda: call(shape, t, det), reps=20)
                row["us"][v] = min(us, row["us"].get(v, 1e30))
        base = row["us"]["default"]
        row["det_over_default"] = {v: round(base / row["us"][v], 3) for v in VARIANTS}
        print(json.dumps(row), flush=True)
        rows.append(row)
        del t
    os.makedirs(out, exist_ok=True)
    json.dump(rows, open(f"{out}/ab_det.json", "w"), indent=1)
