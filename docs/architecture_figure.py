"""Draws docs/architecture.png: the package's layers and how a call flows through them
(python docs/architecture_figure.py)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

HOST, DEVICE, EXPLAIN, BENCH = "#f6f1e7", "#e8f0fb", "#eef7ea", "#f3e9f5"
W, H = 4.9, 1.55
BOXES = {  # name: (x, y, colour, title, lines)
    "api": (0.2, 10.2, HOST, "cute_fa.api: the public functions",
            ["forward, sdpa, forward_varlen, merge_attention,", "backward, backward_varlen,",
             "precompile (enumerates calls, plans each)"]),
    "checks": (0.2, 8.2, HOST, "api/checks.py: every argument rule, once",
               ["dense | ragged, paged or not; with or without grad,", "eager or traced",
                "-> AttentionCall | BackwardCall (runtime/call.py)"]),
    "eager": (6.3, 10.2, HOST, "three routes, one implementation",
              ["no grad: straight to runtime.run", "grad, eager: api/autograd.py Function",
               "torch.compile: api/ops.py custom ops"]),
    "plan": (0.2, 6.2, HOST, "runtime/plan.py: plan(call, device)",
             ["the one decision: kernel keys (tuning.py's", "tables), split count, merge;",
              "tiles_of / overriding; cached by route"]),
    "run": (6.3, 6.2, HOST, "runtime/run.py + launch.py",
            ["outputs, split partials, dq's sums;", "typed argument records, None where",
             "a key takes no argument; TVM FFI launch"]),
    "compile": (0.2, 4.2, HOST, "cute_fa.compile",
                ["keys, registry (kernels, arguments),", "fake arguments, cute.compile,",
                 "memory + disk cache, fingerprint, ptxas"]),
    "kernels": (6.3, 4.2, DEVICE, "cute_fa.kernels",
                ["fwd/: base, sm80, tma, sm90, merge", "bwd/: preprocess, sm80, postprocess",
                 "sched/: tile scheduler, seqlen, block info"]),
    "common": (6.3, 2.2, DEVICE, "kernels/common: shared device pieces",
               ["thread_mma, thread_wgmma, gemm, softmax,", "mask (+ visibility.py), loads,",
                "epilogue, launch options"]),
    "layouts": (12.4, 3.2, DEVICE, "cute_fa.layouts",
                ["config, smem, copies, mma, wgmma,", "tma, ring, bwd: every layout,",
                 "copy and MMA a kernel builds"]),
    "explain": (12.4, 6.2, EXPLAIN, "cute_fa.explain",
                ["FlashLayouts, WgmmaLayouts, BwdLayouts,", "figures, tour, walkthrough:",
                 "the same builders, read on the CPU"]),
    "bench": (12.4, 10.2, BENCH, "cute_fa.bench (python -m cute_fa bench)",
              ["grid, prefill, decode, backward, host;", "common: one timer for every method,",
               "fastest peer per row"]),
}
ARROWS = [("api", "checks", ""), ("checks", "plan", ""), ("api", "eager", ""),
          ("eager", "run", ""), ("plan", "compile", ""), ("plan", "run", ""),
          ("compile", "kernels", "build(key)"), ("kernels", "common", ""),
          ("kernels", "layouts", ""), ("common", "layouts", ""), ("explain", "layouts", ""),
          ("bench", "eager", "public API"), ("run", "kernels", "")]


def _side(box, towards):
    """The middle of the side of `box` that faces the point `towards`."""
    x, y = box[:2]
    cx, cy = x + W / 2, y + H / 2
    tx, ty = towards
    if abs(tx - cx) * H > abs(ty - cy) * W:
        return (x + W, cy) if tx > cx else (x, cy)
    return (cx, y + H) if ty > cy else (cx, y)


def main(out: Path) -> None:
    fig, ax = plt.subplots(figsize=(13, 9.2))
    for name, (x, y, colour, title, lines) in BOXES.items():
        ax.add_patch(FancyBboxPatch((x, y), W, H, boxstyle="round,pad=0.05", fc=colour,
                                    ec="#444", lw=1))
        ax.text(x + 0.12, y + H - 0.27, title, fontsize=9.5, weight="bold", va="center")
        for i, line in enumerate(lines):
            ax.text(x + 0.12, y + H - 0.62 - 0.3 * i, line, fontsize=7.8, family="monospace",
                    va="center")
    for a, b, label in ARROWS:
        ba, bb = BOXES[a], BOXES[b]
        centre = lambda box: (box[0] + W / 2, box[1] + H / 2)  # noqa: E731
        start, end = _side(ba, centre(bb)), _side(bb, centre(ba))
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14,
                                     color="#333", lw=1.1))
        if label:
            ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.12, label,
                    fontsize=7, color="#555", ha="center", va="bottom")
    ax.text(0.2, 1.5, "host, per call: checks, plan lookup, launch (no dispatcher without\n"
                      "grad); first call of a key: trace + compile, then the disk cache",
            fontsize=8.5, color="#7a5c1e")
    ax.text(12.4, 1.8, "blue: device code, traced by the CuTe DSL\ngreen: reads it, shapes "
                       "nothing\nviolet: measures it through the public API", fontsize=8.5,
            color="#1f4e8c")
    ax.set_xlim(0, 17.5)
    ax.set_ylim(1.0, 12.2)
    ax.axis("off")
    ax.set_title("cute_fa: the layers, and one call through them", fontsize=12)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(Path(__file__).resolve().parent / "architecture.png")
