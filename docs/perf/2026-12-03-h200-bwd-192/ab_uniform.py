"""A/B of the wgmma backward with its warpgroup index made warp-uniform (descriptors in uniform
registers) against the tree before (TREE argument), with the peers, one process per tree,
alternated by the caller. Usage: ab_uniform.py TREE NAME OUT [warm]"""
import json, os, sys, time
tree, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, tree)
import torch

SHAPES = [(b, s, 16, 16, 128, c, {}) for b, s in ((16, 1024), (4, 4096), (1, 16384)) for c in (False, True)]
SHAPES += [(1, 2048, 32, 8, 128, True, {}), (1, 8192, 32, 8, 128, True, {})]
SHAPES += [(4, 4096, 16, 16, 128, c, dict(deterministic=True)) for c in (False, True)]
SHAPES += [(4, 4096, 16, 16, 128, True, dict(softcap=30.0))]
SHAPES += [(4, 4096, 16, 16, 192, False, {}), (4, 4096, 16, 16, 192, True, {}), (1, 16384, 16, 16, 192, True, {})]
SHAPES += [(4, 4096, 8, 8, 256, False, {}), (4, 4096, 8, 8, 256, True, {}), (1, 16384, 8, 8, 256, True, {})]
SHAPES += [(4, 4096, 16, 16, 192, True, dict(deterministic=True))]
SHAPES += [(4, 4096, 32, 32, 64, True, {})]


def inputs(shape):
    b, s, hq, hkv, d, causal, kw = shape
    g = torch.Generator(device="cuda").manual_seed(s + b + hq + d)
    q, do = (torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    import cute_fa
    o, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True, softcap=kw.get("softcap", 0.0))
    return q, k, v, do, o, lse


def ours(shape, t):
    import cute_fa
    b, s, hq, hkv, d, causal, kw = shape
    q, k, v, do, o, lse = t
    return lambda: cute_fa.backward(do, q, k, v, o, lse, causal, backend="sm90", **kw)


def warm(i):
    shape = SHAPES[i]
    ours(shape, inputs(shape))()
    torch.cuda.synchronize()
    from cute_fa.compile.cache import wait_for_saves
    wait_for_saves()


if __name__ == "__main__":
    import cute_fa
    assert cute_fa.__file__.startswith(os.path.abspath(tree)), cute_fa.__file__
    if sys.argv[4:] == ["warm"]:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(7) as pool:
            pool.map(warm, range(len(SHAPES)), chunksize=1)
        sys.exit(0)
    from cute_fa.bench.common import time_each, warm_gpu, flash_attn_4, sdpa_peer, flops
    from cute_fa.bench.backward import autograd_pair
    warm_gpu(torch)
    fa4 = flash_attn_4()
    rows = []
    for shape in SHAPES:
        b, s, hq, hkv, d, causal, kw = shape
        t = inputs(shape)
        q, k, v, do, o, lse = t
        fns = {"cute_fa": ours(shape, t)}
        if not kw:
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            gqa = hq != hkv
            for p in ("sdpa_default", "sdpa_cudnn"):
                if not gqa:
                    fns[p] = autograd_pair(torch, lambda f=sdpa_peer(torch, p): f(*leaves, causal), leaves, do)[0]
            if fa4 is not None:
                fns["flash_attn_4"] = autograd_pair(torch, lambda: fa4[0](*leaves, causal=causal), leaves, do)[0]
        us, errors, outs = time_each(torch, fns, reps=10, keep_outputs=True)
        g = outs.get("cute_fa")
        sums = [float(x.float().abs().sum()) for x in g] if g else None
        rows.append(dict(shape=shape, us=us, errors=errors, grad_abs_sums=sums,
                         tflops={n: round(2.5 * flops(b, hq, s, d, causal) / u / 1e6, 1) for n, u in us.items() if u}))
        print(name, json.dumps(rows[-1]), flush=True)
        del t, fns, outs
        torch.cuda.empty_cache()
    json.dump(rows, open(out, "w"), indent=1)
