"""Draws docs/architecture.png: how a call flows through cute_fa (python docs/architecture_figure.py)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

BOXES = {  # name: (x, y, title, lines)
    "api": (0.5, 9.0, "cute_fa.forward / sdpa", ["interface.py"]),
    "checks": (0.5, 7.4, "argument checks", ["interface._check_args: types, shapes,",
                                             "values, devices; nothing launched yet"]),
    "choice": (0.5, 5.6, "kernel choice", ["tuning.kernel_key: Arch (arch.py) ->",
                                           "backend, tile, K/V stages, register cap",
                                           "-> Sm80Key | TmaKey (backends.py)"]),
    "cache": (0.5, 3.6, "compiled kernel", ["compiler.get_kernel: memory -> disk",
                                            "(key digest + source fingerprint)",
                                            "-> cute.compile(fake_arguments)"]),
    "registry": (6.2, 3.6, "backend registry", ["backends.REGISTRY[key.backend]",
                                                ".build(key) -> kernel object",
                                                "ARGUMENTS: the kernel's argument list"]),
    "kernels": (6.2, 5.6, "one module per kernel", ["kernels/fwd_sm80.py (cp.async)",
                                                    "kernels/fwd_tma.py (TMA ring)",
                                                    "grid, prologue, K/V rounds, epilogue"]),
    "helpers": (6.2, 7.6, "device helpers, shared", ["thread_mma, gemm, softmax,",
                                                     "mask (+ visibility.py), epilogue,",
                                                     "launch"]),
    "layouts": (6.2, 9.4, "cute_fa.layouts", ["config, smem, copies, mma, tma, ring:",
                                              "every layout, copy and MMA"]),
    "explain": (11.6, 9.4, "cute_fa.explain", ["FlashLayouts, figures, tour,",
                                               "probe, walkthrough: read the same",
                                               "builders on the CPU"]),
    "launch": (0.5, 1.6, "launch", ["kernel(q, k, v, out, lse, scale,",
                                    "causal_offset, write_lse) on the",
                                    "current stream (TVM FFI)"]),
}
ARROWS = [("api", "checks"), ("checks", "choice"), ("choice", "cache"), ("cache", "registry"),
          ("registry", "kernels"), ("kernels", "helpers"), ("helpers", "layouts"),
          ("explain", "layouts"), ("cache", "launch")]
W, H = 4.6, 1.35


def main(out: Path) -> None:
    fig, ax = plt.subplots(figsize=(11.5, 7.6))
    for name, (x, y, title, lines) in BOXES.items():
        colour = "#e8f0fb" if name in ("kernels", "helpers", "layouts") else (
            "#eef7ea" if name == "explain" else "#f6f1e7")
        ax.add_patch(FancyBboxPatch((x, y), W, H, boxstyle="round,pad=0.05", fc=colour,
                                    ec="#444", lw=1))
        ax.text(x + 0.12, y + H - 0.28, title, fontsize=10, weight="bold", va="center")
        for i, line in enumerate(lines):
            ax.text(x + 0.12, y + H - 0.62 - 0.3 * i, line, fontsize=8, family="monospace",
                    va="center")
    for a, b in ARROWS:
        xa, ya = BOXES[a][:2]
        xb, yb = BOXES[b][:2]
        if abs(xa - xb) < 1e-6:  # vertical
            start, end = (xa + W / 2, ya) if ya > yb else (xa + W / 2, ya + H), \
                (xb + W / 2, yb + H) if ya > yb else (xb + W / 2, yb)
        elif abs(ya - yb) < 1e-6:  # horizontal
            start, end = (xa + W, ya + H / 2) if xa < xb else (xa, ya + H / 2), \
                (xb, yb + H / 2) if xa < xb else (xb + W, yb + H / 2)
        else:
            start, end = (xa + W, ya + H / 2), (xb, yb + H / 2)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14,
                                     color="#333", lw=1.2))
    ax.text(0.5, 0.7, "host (Python, per call: checks, key lookup; first call: trace + compile)",
            fontsize=9, color="#7a5c1e")
    ax.text(11.6, 6.6, "blue: device code,\ntraced by the CuTe DSL", fontsize=9, color="#1f4e8c")
    ax.set_xlim(0, 16.6)
    ax.set_ylim(0.3, 11.2)
    ax.axis("off")
    ax.set_title("How a call flows through cute_fa", fontsize=12)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(Path(__file__).resolve().parent / "architecture.png")
