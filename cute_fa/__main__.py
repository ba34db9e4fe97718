"""python -m cute_fa [demo | tour | layouts | probe | precompile | bench] (also: cute-fa ...)

With no command: on a machine with a CUDA GPU, run cute_fa.forward on random
data and check it against torch SDPA (`demo`); without one, print the per-lane
tour of the configuration that docs/walkthrough.md follows (`tour`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

_FORMATTER = argparse.ArgumentDefaultsHelpFormatter


class _UsageError(Exception):
    """A command that cannot run here or with these values: printed, exit status 2."""


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head-dim", type=int, default=64, help="head dimension D of Q, K, V")
    p.add_argument("--block-m", type=int, default=64, help="query rows per CTA (tile M)")
    p.add_argument("--block-n", type=int, default=64, help="key/value rows per round (tile N)")
    p.add_argument("--num-threads", type=int, default=128,
                   help="threads per CTA (a multiple of 32)")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"],
                   help="element type of Q, K, V")


def _layouts(args):
    from .explain import FlashLayouts

    return FlashLayouts(head_dim=args.head_dim, block_m=args.block_m, block_n=args.block_n,
                        num_threads=args.num_threads, dtype=args.dtype)


def _need_gpu(command: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise _UsageError(f"{command} needs a CUDA GPU (sm80 or newer) and torch sees none here "
                          f"(torch.cuda.is_available() is False); without a GPU, "
                          f"`python -m cute_fa tour` and `layouts` run on the CPU")


def _cmd_layouts(args) -> int:
    L = _layouts(args)
    print(L.describe_lane(args.tid))
    for name, fn in (("copy (Q tile)", L.copy_coords), ("Q (A of QK)", L.q_coords),
                     ("K (B of QK)", L.k_coords), ("S", L.s_coords), ("V (B of PV)", L.v_coords),
                     ("O", L.o_coords)):
        print(f"\n{name}: " + " ".join(f"({r},{c})" for r, c in fn(args.tid)))
    return 0


def _cmd_probe(args) -> int:
    config = _layouts(args).config  # bad tile values are refused before the GPU is looked for
    _need_gpu("probe")
    from .explain.probe import run_probe_check

    report = run_probe_check(config)
    print(report.summary())
    return 0 if report.ok else 1


def _cmd_demo(args) -> int:
    from .layouts.config import check_head_dim

    for name in ("batch", "seqlen", "heads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1, got {getattr(args, name)}")
    check_head_dim("--head-dim", args.head_dim)
    _need_gpu("demo")
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


_PRECOMPILE_FLAGS = ("head_dims", "dtypes", "causal", "arch", "backend", "decode_groups",
                     "page_sizes")


def _flag_names(message: str) -> str:
    """An error of precompile's, its parameters named as the command's flags."""
    return re.sub(r"\b(" + "|".join(_PRECOMPILE_FLAGS) + r")\b",
                  lambda m: "--" + m.group(1).replace("_", "-"), message)


def _cmd_precompile(args) -> int:
    from .api.precompile import parse_head_dims, precompile

    head_dims = parse_head_dims(args.head_dims, "--head-dims")
    dtypes = tuple(x.strip() for x in args.dtypes.split(",") if x.strip())
    arch = getattr(args, "arch", None)
    if arch is None:
        import torch

        if not torch.cuda.is_available():
            raise _UsageError("precompile needs --arch (e.g. --arch sm_90a) when no CUDA GPU is "
                              "visible; torch.cuda.is_available() is False here")
    if args.deterministic and not args.backward:
        raise _UsageError("--deterministic needs --backward (it adds the deterministic mode's "
                          "backward kernels)")
    ints = {}
    for name in ("decode_groups", "page_sizes"):
        text = getattr(args, name)
        try:
            ints[name] = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise _UsageError(f"--{name.replace('_', '-')} must be comma-separated ints, "
                              f"got {text!r}") from None
    counts: dict = {}

    def progress(step) -> None:
        counts[step.where] = counts.get(step.where, 0) + 1
        print(step, file=sys.stderr, flush=True)

    try:
        keys = precompile(head_dims=head_dims, dtypes=dtypes, arch=arch, backend=args.backend,
                          varlen=args.varlen, windows=args.windows, softcap=args.softcap,
                          backward=args.backward, deterministic=args.deterministic,
                          progress=progress, **ints)
    except (ValueError, TypeError) as exc:
        raise type(exc)(_flag_names(str(exc))) from None
    print(f"{len(keys)} kernels: " + ", ".join(f"{n} {where}" for where, n in counts.items()))
    return 0


def _cmd_bench(args) -> int:
    _need_gpu("bench")  # before anything is written under --out
    import importlib

    # one module per benchmark, each with main(out_dir, quick); without a flag: the paper grid
    name = next((n for n in ("decode", "prefill", "backward", "host") if getattr(args, n)),
                "grid")
    importlib.import_module(f"{__package__}.bench.{name}").main(args.out, quick=args.quick)
    return 0


def _cmd_tour(args) -> int:
    from .explain.tour import tour

    print(tour(_layouts(args)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    invoked = Path(sys.argv[0]).name
    prog = "python -m cute_fa" if invoked in ("__main__.py", "-m", "") else invoked
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="command")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, formatter_class=_FORMATTER)

    _config_args(command("tour", "print the per-lane tour of one tile configuration (CPU)"))
    p_lay = command("layouts", "everything one thread copies, holds and combines (CPU)")
    p_lay.add_argument("--tid", type=int, default=0, help="thread index within the CTA")
    _config_args(p_lay)
    _config_args(command("probe", "run the one-tile probe kernel on the GPU and check it"))
    p_demo = command("demo", "cute_fa.forward on random data, checked against torch SDPA (GPU)")
    p_demo.add_argument("--batch", type=int, default=4, help="batch size")
    p_demo.add_argument("--seqlen", type=int, default=4096, help="query and key length")
    p_demo.add_argument("--heads", type=int, default=16, help="attention heads")
    p_demo.add_argument("--head-dim", type=int, default=128, help="head dimension")
    p_demo.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"],
                        help="element type")
    p_demo.add_argument("--causal", action="store_true", help="causal (bottom-right) masking")
    p_demo.add_argument("--backend", default="auto", choices=["auto", "sm80", "tma", "sm90"],
                        help="kernel: cp.async (sm80), TMA (sm90+), or the measured choice")
    p_pre = command("precompile", "compile kernels into the on-disk cache (CPU or GPU)")
    p_pre.add_argument("--head-dims", default="64,128",
                       help="comma-separated head dims, each a multiple of 8 up to 256")
    p_pre.add_argument("--dtypes", default="bfloat16,float16",
                       help="comma-separated element types: bfloat16, float16")
    p_pre.add_argument("--arch", default=argparse.SUPPRESS,
                       help="target GPU, e.g. sm_80, sm_86, sm_90a, sm_120a (default: the GPU "
                            "at hand; required without one)")
    p_pre.add_argument("--backend", default="auto", choices=["auto", "sm80", "tma", "sm90"],
                       help="which kernel to compile; auto: what forward() picks on that arch")
    p_pre.add_argument("--decode-groups", default="",
                       help="comma-separated GQA ratios (query heads per K/V head) whose decode "
                            "kernels (and packed GQA prefill kernels) to compile too, e.g. 4,8")
    p_pre.add_argument("--page-sizes", default="",
                       help="with --decode-groups: comma-separated page sizes of a paged KV "
                            "cache, e.g. 64,256")
    for flag, what in (("--backward", "the backward's kernels (training)"),
                       ("--varlen", "forward_varlen's kernels (ragged batches)"),
                       ("--windows", "the kernels of sliding windows (window_size)"),
                       ("--softcap", "the kernels of a softcap"),
                       ("--deterministic", "with --backward, the deterministic mode's "
                                           "backward kernels")):
        p_pre.add_argument(flag, action="store_true", help=f"also {what}")
    p_bench = command("bench", "benchmark against torch SDPA and flash-attn-4 (GPU)")
    p_bench.add_argument("--out", default="docs/perf/latest",
                         help="directory for results.json, results.md and results.png "
                              "(with --decode: decode.json, .md, .png; with --prefill: "
                              "prefill.json, .md, .png; with --backward: backward.json, .md, "
                              ".png; with --host: host.json and host.md)")
    p_bench.add_argument("--quick", action="store_true",
                         help="a smoke test: two sequence lengths only (with --decode: 8 shapes "
                              "of one head configuration; with --prefill: a few small shapes, no "
                              "HF model; with --host: a quarter of the calls)")
    which = p_bench.add_mutually_exclusive_group()
    which.add_argument("--decode", action="store_true",
                       help="the decode benchmark instead (Sq 1 and 4 against KV caches of "
                            "2k-128k keys, dense and paged)")
    which.add_argument("--prefill", action="store_true",
                       help="the prefill benchmark of real clients' shapes instead (small "
                            "batches, a ragged batch, a sliding window, an HF model)")
    which.add_argument("--backward", action="store_true",
                       help="the backward benchmark instead (the grid and GQA training "
                            "shapes, backward and forward + backward)")
    which.add_argument("--host", action="store_true",
                       help="the host cost per call instead (one small call without grad, with "
                            "inputs that require grad, and a forward + backward step)")
    return parser


_COMMANDS = {"layouts": _cmd_layouts, "probe": _cmd_probe, "demo": _cmd_demo,
             "precompile": _cmd_precompile, "bench": _cmd_bench, "tour": _cmd_tour}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command is None:
            import torch

            if torch.cuda.is_available():
                return _cmd_demo(parser.parse_args(["demo"]))
            print("no CUDA GPU here: the per-lane tour of the configuration of "
                  "docs/walkthrough.md\n")
            return _cmd_tour(parser.parse_args(["tour"]))
        return _COMMANDS[args.command](args)
    except (ValueError, TypeError, _UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader stopped early (`cute-fa layouts | head -1`)
        # what is still buffered for stdout would raise again at exit: point it at nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # as a process killed by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
