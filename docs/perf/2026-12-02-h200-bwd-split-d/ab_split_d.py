"""A/B of the wgmma backward's split-d tile at head_dim 192/256 against the mma.sync backward
and the peers, in one process (compiles warmed in a pool first)."""
import json, os, sys, time
import multiprocessing as mp
import torch

# (kind, batch, heads_q, heads_kv, seqlen, head_dim, causal, softcap)
SHAPES = []
for d, seqs in ((256, (1024, 2048, 4096, 8192, 16384)), (192, (1024, 4096, 16384))):
    for causal in (False, True):
        for s in seqs:
            SHAPES.append(("grid", 16384 // s, 8, 8, s, d, causal, 0.0))
SHAPES += [("gqa", 1, 16, 8, 4096, 256, True, 0.0), ("gqa", 2, 32, 16, 4096, 256, True, 0.0),
           ("gqa", 1, 32, 8, 8192, 256, True, 0.0),
           ("softcap", 2, 16, 8, 4096, 256, True, 50.0)]
OURS = {"sm80": ("sm80", False), "sm90": ("sm90", False), "sm90_det": ("sm90", True),
        "sm80_det": ("sm80", True)}


def inputs(shape):
    kind, b, hq, hkv, s, d, causal, sc = shape
    g = torch.Generator(device="cuda").manual_seed(s + b + hq + d)
    q, do = (torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    import cute_fa
    o, lse = cute_fa.forward(q, k, v, causal=causal, softcap=sc, return_lse=True)
    return q, k, v, do, o, lse


def ours(shape, t, name):
    import cute_fa
    backend, det = OURS[name]
    kind, b, hq, hkv, s, d, causal, sc = shape
    q, k, v, do, o, lse = t
    return lambda: cute_fa.backward(do, q, k, v, o, lse, causal, softcap=sc, deterministic=det,
                                    backend=backend)


def warm(args):
    name, i = args
    shape = SHAPES[i]
    ours(shape, inputs(shape), name)()
    torch.cuda.synchronize()
    from cute_fa.compile.cache import wait_for_saves
    wait_for_saves()


if __name__ == "__main__":
    out = sys.argv[1]
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(12) as pool:
        pool.map(warm, [(n, i) for i in range(len(SHAPES)) for n in OURS], chunksize=1)
    print("warm", round(time.time() - t0), flush=True)
    from cute_fa.bench.common import time_each, warm_gpu, flash_attn_4, sdpa_peer, first, flops
    from cute_fa.bench.backward import autograd_pair
    warm_gpu(torch)
    fa4 = flash_attn_4()
    rows = []
    for shape in SHAPES:
        kind, b, hq, hkv, s, d, causal, sc = shape
        t = inputs(shape)
        q, k, v, do, o, lse = t
        fns = {n: ours(shape, t, n) for n in OURS}
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        if not sc:
            for name in ("sdpa_default", "sdpa_flash", "sdpa_cudnn"):
                fns[name] = autograd_pair(torch, lambda f=sdpa_peer(torch, name): f(*leaves, causal),
                                          leaves, do)[0]
        if fa4 is not None:
            kw = dict(causal=causal, softcap=sc) if sc else dict(causal=causal)
            fns["flash_attn_4"] = autograd_pair(torch, lambda: fa4[0](*leaves, **kw), leaves, do)[0]
        us, errors, outs = time_each(torch, fns, reps=10, keep_outputs=True)
        # and back in reverse order: the better of the two
        us2, _, _ = time_each(torch, dict(reversed(list(fns.items()))), reps=10)
        us = {n: (min(u, us2[n]) if u and us2.get(n) else u) for n, u in us.items()}
        ref = outs.get("sm80")
        diff = {}
        if ref is not None:
            for n in ("sm90", "sm90_det"):
                if n in outs:
                    diff[n] = max(float((a.float() - r.float()).abs().max()) for a, r in zip(outs[n], ref))
        work = 2.5 * flops(b, hq, s, d, causal)
        peers = {n: u for n, u in us.items() if n not in OURS and u}
        best = min(peers, key=peers.get) if peers else None
        row = dict(shape=shape, us=us, errors=errors, diff_vs_sm80=diff,
                   tflops={n: round(work / u / 1e6, 1) for n, u in us.items() if u},
                   fastest_peer=best,
                   sm90_vs_fastest=round(peers[best] / us["sm90"], 3) if best and us.get("sm90") else None,
                   sm90_vs_sm80=round(us["sm80"] / us["sm90"], 3) if us.get("sm90") and us.get("sm80") else None,
                   det_vs_default=round(us["sm90"] / us["sm90_det"], 3) if us.get("sm90_det") else None)
        print(json.dumps(row), flush=True)
        rows.append(row)
        del t, fns, outs
        torch.cuda.empty_cache()
    os.makedirs(out, exist_ok=True)
    json.dump(rows, open(f"{out}/ab_split_d.json", "w"), indent=1)
