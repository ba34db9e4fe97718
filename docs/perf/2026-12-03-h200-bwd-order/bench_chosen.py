"""python bench_chosen.py OUT: `python -m cute_fa bench --backward` on the chosen tables, its
kernels compiled first in a pool of spawned processes (the shared on-disk cache)."""
import multiprocessing as mp, sys, time
import choice


def job(shape):
    import torch
    import cute_fa
    choice.patch("chosen")
    kind, d, causal, s, b, hq, hk = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    if kind == "varlen":  # bench.backward.varlen_results' cute_fa calls
        lens = torch.randint(256, 4097, (16,), generator=torch.Generator().manual_seed(0)).tolist()
        cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(16)], dtype=torch.int32,
                          device="cuda")
        n, m = sum(lens), max(lens)
        q, do = (torch.randn(n, 32, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(n, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        o, lse = cute_fa.forward_varlen(q, k, v, cu, cu, m, m, causal=True, return_lse=True)
        cute_fa.backward_varlen(do, q, k, v, o, lse, cu, cu, m, m, True)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        torch.autograd.grad(cute_fa.forward_varlen(*leaves, cu, cu, m, m, causal=True), leaves, do)
        torch.cuda.synchronize()
        from cute_fa.compile.cache import wait_for_saves
        wait_for_saves()
        return
    q, do = (torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    o, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True)
    for det in (False, True):
        cute_fa.backward(do, q, k, v, o, lse, causal, deterministic=det)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        torch.autograd.grad(cute_fa.forward(*leaves, causal=causal, deterministic=det), leaves, do)
    torch.cuda.synchronize()
    from cute_fa.compile.cache import wait_for_saves
    wait_for_saves()


if __name__ == "__main__":
    from cute_fa.bench.common import HEAD_DIMS, HIDDEN, SEQLENS, TOKENS
    from cute_fa.bench.backward import TRAINING_SHAPES
    shapes = [("grid", d, c, s, TOKENS // s, HIDDEN // d, HIDDEN // d)
              for d in HEAD_DIMS for c in (False, True) for s in SEQLENS]
    shapes += [("gqa", 128, True, s, b, h, 8) for h, b, s in TRAINING_SHAPES]
    shapes += [("varlen", 128, True, 0, 0, 0, 0), ("small", 128, False, 128, 1, 16, 16)]
    t = time.time()
    with mp.get_context("spawn").Pool(14) as pool:
        pool.map(job, shapes, chunksize=1)
    print("warm", round(time.time() - t), flush=True)
    print("chosen", choice.patch("chosen"), flush=True)
    from cute_fa.bench.backward import main
    main(sys.argv[1])
