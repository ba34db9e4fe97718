"""python -m cute_fa [tour | layouts --tid N | probe]

With no command: on a machine with a CUDA GPU, run the one-tile probe there and
check it against torch; everywhere, print the per-lane tour of the walkthrough's
configuration.
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
    args = parser.parse_args(argv)

    try:
        if args.command == "layouts":
            _cmd_layouts(args)
            return 0
        if args.command == "probe":
            return _cmd_probe(args)
        if args.command is None:
            parser.set_defaults()
            args = parser.parse_args(["tour"])
            status = _cmd_probe(args)
            if status:
                return status
        from .tour import tour

        print(tour(_layouts(args)))
        return 0
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
