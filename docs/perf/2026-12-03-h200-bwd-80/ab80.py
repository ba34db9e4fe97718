"""A/B of the wgmma backward's tiles in one process, default and deterministic, with the peers
at S = 4k/8k and on the GQA rows: head_dim 128 on 80-query blocks (dQ computed transposed, dV
issued after dS: `WgmmaBwdTileConfig.dq_transposed`, `dv_after_ds`) against its 64-query
tile; head_dim 64 on 128 x 128 in two warpgroups with dV after dS, and on 80-query blocks of
one warpgroup, against the 64 x 64 tile shipped before (deterministic: the same 128 x 128
tile with dV before dS, serialized by ptxas). Usage: ab80.py OUT"""
import json, os, sys, time
import multiprocessing as mp
import torch

def grid(d, h, seqs=(1024, 4096, 16384)):
    return [(f"d{d}", 16384 // s, h, h, s, d, c) for c in (False, True) for s in seqs]


SHAPES = (grid(128, 16) + [("d128", 1, 32, 8, 2048, 128, True), ("d128", 1, 32, 8, 8192, 128, True),
                           ("d128", 2, 32, 8, 4096, 128, False)]
          + grid(64, 32) + [("d64", 1, 32, 8, 8192, 64, True)])
T, DT, ST = "BWD_SM90_TILES", "BWD_SM90_DETERMINISTIC_TILES", "BWD_SM90_SOFTCAP_TILES"
# name -> (group, table, entry, deterministic, softcap)
V = {
    "d128": ("d128", T, (64, 2, 3, 1, False, True), False, False),
    "d128_80": ("d128", T, (80, 2, 2, 1, False, True, 64, True), False, False),
    "d128_80nw3": ("d128", T, (80, 2, 3, 1, False, False, 64, True), False, False),
    "d128_det": ("d128", T, (64, 2, 3, 1, False, True), True, False),
    "d128_80_det": ("d128", T, (80, 2, 2, 1, False, True, 64, True), True, False),
    "d64_old": ("d64", T, (64, 1, 2, 2, False, True), False, False),
    "d64": ("d64", T, (128, 2, 2, 1, False, True, 64, True), False, False),
    "d64_80": ("d64", T, (80, 1, 2, 2, False, True), False, False),
    "d64_old_det": ("d64", DT, (128, 2, 2, 1, False, True), True, False),
    "d64_det": ("d64", DT, (128, 2, 2, 1, False, True, 64, True), True, False),
}
REF = {"d128": "d128", "d64": "d64_old"}  # the tiles shipped before
STATE = [None]


def set_variant(name):
    import cute_fa.tuning as T
    from cute_fa.runtime.plan import clear_plans
    if STATE[0] == name:
        return
    if not hasattr(T, "_ab_base"):
        T._ab_base = {n: dict(getattr(T, n)) for n in ("BWD_SM90_TILES", "BWD_SM90_DETERMINISTIC_TILES",
                                                       "BWD_SM90_SOFTCAP_TILES")}
    for n, d in T._ab_base.items():
        setattr(T, n, dict(d))
    group, table, entry, det, sc = V[name]
    getattr(T, table)[int(group[1:])] = entry
    clear_plans()
    STATE[0] = name


def inputs(shape):
    kind, b, hq, hkv, s, d, causal = shape
    g = torch.Generator(device="cuda").manual_seed(s + b + hq + d)
    q, do = (torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    import cute_fa
    o, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True)
    o2 = lse2 = None
    if any(v[4] and v[0] == kind for v in V.values()):
        o2, lse2 = cute_fa.forward(q, k, v, causal=causal, return_lse=True, softcap=30.0)
    return q, k, v, do, o, lse, o2, lse2


def ours(shape, t, name):
    import cute_fa
    causal = shape[6]
    q, k, v, do, o, lse, o2, lse2 = t
    det, sc = V[name][3], V[name][4]

    def f():
        set_variant(name)
        if sc:
            return cute_fa.backward(do, q, k, v, o2, lse2, causal, softcap=30.0, backend="sm90")
        return cute_fa.backward(do, q, k, v, o, lse, causal, deterministic=det, backend="sm90")
    return f


def warm(args):
    name, i = args
    shape = SHAPES[i]
    ours(shape, inputs(shape), name)()
    torch.cuda.synchronize()
    from cute_fa.compile.cache import wait_for_saves
    wait_for_saves()


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    ctx = mp.get_context("spawn")
    jobs = [(n, i) for i, s in enumerate(SHAPES) for n in V if V[n][0] == s[0] and s == min((x for x in SHAPES if x[0] == s[0] and x[6] == s[6]), key=lambda x: x[4])]
    with ctx.Pool(14) as pool:
        pool.map(warm, jobs, chunksize=1)
    print("warm", round(time.time() - t0), flush=True)
    from cute_fa.bench.common import time_each, warm_gpu, flash_attn_4, sdpa_peer, flops
    from cute_fa.bench.backward import autograd_pair
    warm_gpu(torch)
    fa4 = flash_attn_4()
    rows = []
    for shape in SHAPES:
        kind, b, hq, hkv, s, d, causal = shape
        t = inputs(shape)
        q, k, v, do, o, lse = t[:6]
        fns = {n: ours(shape, t, n) for n in V if V[n][0] == kind}
        if s in (4096, 8192) or hq != hkv:
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            for name in ("sdpa_default", "sdpa_flash", "sdpa_cudnn"):
                fns[name] = autograd_pair(torch, lambda f=sdpa_peer(torch, name): f(*leaves, causal),
                                          leaves, do)[0]
            if fa4 is not None:
                fns["flash_attn_4"] = autograd_pair(torch, lambda: fa4[0](*leaves, causal=causal), leaves, do)[0]
        us, errors, outs = time_each(torch, fns, reps=10, keep_outputs=True)
        us2, _, _ = time_each(torch, dict(reversed(list(fns.items()))), reps=10)
        us = {n: (min(u, us2[n]) if u and us2.get(n) else u) for n, u in us.items()}
        ref = outs.get(REF[kind])
        diff, bitwise = {}, {}
        for n in fns:
            if n in V and n in outs and ref is not None and not V[n][4]:
                diff[n] = max(float((a.float() - r.float()).abs().max()) for a, r in zip(outs[n], ref))
            if n in V and V[n][3]:
                a, b2 = fns[n](), fns[n]()
                bitwise[n] = all(torch.equal(x, y) for x, y in zip(a, b2))
        work = 2.5 * flops(b, hq, s, d, causal)
        peers = {n: u for n, u in us.items() if n not in V and u}
        best = min(peers, key=peers.get) if peers else None
        row = dict(shape=shape, us=us, errors=errors, diff_vs_ref=diff, det_bitwise=bitwise,
                   tflops={n: round(work / u / 1e6, 1) for n, u in us.items() if u},
                   fastest_peer=best,
                   speedup_vs_ref={n: round(us[REF[kind]] / us[n], 3) for n in fns
                                   if n in V and us.get(n) and us.get(REF[kind])},
                   vs_fastest={n: round(peers[best] / us[n], 3) for n in fns
                               if n in V and best and us.get(n)})
        print(json.dumps(row), flush=True)
        rows.append(row)
        del t, fns, outs
        torch.cuda.empty_cache()
        json.dump(rows, open(f"{out}/ab80.json", "w"), indent=1)
    print("done", round(time.time() - t0), flush=True)
