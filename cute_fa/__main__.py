"""python -m cute_fa [demo | tour | layouts --tid N | probe | precompile | bench]

With no command: on a machine with a CUDA GPU, run cute_fa.forward on random
data and check it against torch SDPA (`demo`); without one, print the per-lane
tour of the walkthrough's configuration (`tour`).
"""

from __future__ import annotations

import argparse
import sys


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-m", type=int, default=64)
    p.add_argument("--block-n", type=int, default=64)
    p.add_argument("--num-threads", type=int, default=128)
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])


def _layouts(args):
    from .layouts import FlashLayouts

    return FlashLayouts(head_dim=args.head_dim, block_m=args.block_m, block_n=args.block_n,
                        num_threads=args.num_threads, dtype=args.dtype)


def _cmd_layouts(args) -> None:
    L = _layouts(args)
    print(L.describe_lane(args.tid))
    for name, fn in (("copy (Q tile)", L.copy_coords), ("Q (A of QK)", L.q_coords),
                     ("K (B of QK)", L.k_coords), ("S", L.s_coords), ("V (B of PV)", L.v_coords),
                     ("O", L.o_coords)):
        print(f"\n{name}: " + " ".join(f"({r},{c})" for r, c in fn(args.tid)))


def _cmd_probe(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("probe: no CUDA GPU here; nothing to run")
        return 0
    from .probe import run_probe_check

    report = run_probe_check(_layouts(args).config)
    print(report.summary())
    return 0 if report.ok else 1


def _cmd_demo(args) -> int:
    import time

    import torch

    import cute_fa

    b, s, h, d = args.batch, args.seqlen, args.heads, args.head_dim
    dtype = getattr(torch, args.dtype)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
    t = time.perf_counter()
    o = cute_fa.forward(q, k, v, causal=args.causal, backend=args.backend)
    torch.cuda.synchronize()
    first = time.perf_counter() - t
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=args.causal).transpose(1, 2)
    err = (o.float() - ref.float()).abs().max().item()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        cute_fa.forward(q, k, v, causal=args.causal, backend=args.backend)
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end) / 10
    flops = 4 * b * h * s * s * d / (2 if args.causal else 1)
    print(f"cute_fa.forward on {torch.cuda.get_device_name()}: B={b} S={s} H={h} D={d} "
          f"{args.dtype} causal={args.causal}")
    print(f"  first call {first:.2f} s (compile or cache load included), then {ms:.3f} ms "
          f"= {flops / ms / 1e9:.0f} TFLOPs/s; max |cute_fa - torch SDPA| = {err:.2e}")
    return 0 if err < 5e-2 else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cute_fa", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    p_tour = sub.add_parser("tour", help="print the per-lane tour")
    _config_args(p_tour)
    p_lay = sub.add_parser("layouts", help="everything one thread copies and holds")
    p_lay.add_argument("--tid", type=int, default=0)
    _config_args(p_lay)
    p_probe = sub.add_parser("probe", help="run the one-tile probe on the GPU and check it")
    _config_args(p_probe)
    p_demo = sub.add_parser("demo", help="cute_fa.forward on random data, checked against torch")
    p_demo.add_argument("--batch", type=int, default=4)
    p_demo.add_argument("--seqlen", type=int, default=4096)
    p_demo.add_argument("--heads", type=int, default=16)
    p_demo.add_argument("--head-dim", type=int, default=128)
    p_demo.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    p_demo.add_argument("--causal", action="store_true")
    p_demo.add_argument("--backend", default="auto", choices=["auto", "sm80", "tma"])
    p_pre = sub.add_parser("precompile", help="compile kernels into the on-disk cache")
    p_pre.add_argument("--head-dims", default="64,128")
    p_pre.add_argument("--dtypes", default="bfloat16,float16")
    p_pre.add_argument("--arch", default=None, help="e.g. sm_90a; default: this GPU")
    p_pre.add_argument("--backend", default="auto", choices=["auto", "sm80", "tma"])
    p_bench = sub.add_parser("bench", help="benchmark against torch SDPA and flash-attn-4")
    p_bench.add_argument("--out", default="docs/perf/latest")
    p_bench.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)

    try:
        if args.command == "layouts":
            _cmd_layouts(args)
            return 0
        if args.command == "probe":
            return _cmd_probe(args)
        if args.command == "precompile":
            from .precompile import precompile

            keys = precompile(head_dims=[int(x) for x in args.head_dims.split(",")],
                              dtypes=args.dtypes.split(","), arch=args.arch,
                              backend=args.backend)
            print(f"{len(keys)} kernels compiled or found in the cache")
            return 0
        if args.command == "bench":
            from .bench import main as bench_main

            bench_main(args.out, quick=args.quick)
            return 0
        if args.command is None:
            import torch

            if torch.cuda.is_available():
                return _cmd_demo(parser.parse_args(["demo"]))
            print("no CUDA GPU here: the per-lane tour of the walkthrough's configuration\n")
            args = parser.parse_args(["tour"])
        elif args.command == "demo":
            return _cmd_demo(args)
        from .tour import tour

        print(tour(_layouts(args)))
        return 0
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
