"""Forward-pass benchmark: cute_fa next to torch SDPA (default, flash, cuDNN) and flash-attn-4.

python -m cute_fa bench --out docs/perf/<date>  writes results.json, results.md and results.png
there. Shapes follow the FlashAttention papers: 16k tokens per batch (batch = 16384 / seqlen),
hidden 2048 (heads = 2048 / head_dim), head_dim 64 and 128 (fp16 and bf16) and 192 and 256
(bf16), seqlen 1k..16k, causal and not. Every method runs on the same inputs in one process, timed
by `common.gpu_time_us` (GPU time, the host's launch hidden behind a spin for every method
alike). Also: one small call's GPU time and host cost per method, and the first call of a new
process (cold and warm disk cache) for one configuration per head_dim class.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import (HEAD_DIMS, HIDDEN, LARGE_HEAD_DIMS, PEERS, SEQLENS, TOKENS, cell, dense_peers,
                     error_lines, fastest_peer, flops, label, measured_row, methods_in, plot_peak,
                     ratio, ratio_summary, run_info, small_call_lines, small_calls, tflops,
                     time_each, timer_note, times_cell, versions_line, vs_fastest_peer, warm_gpu,
                     write_files)

REPS = 20
# the cute_fa columns first (cute_fa_tma_eager: an older A/B's, shown where a run has it)
ORDER = ("cute_fa", "cute_fa_sm80", "cute_fa_tma", "cute_fa_tma_eager") + PEERS
# (a, b): a's speed over b's, columns of the table; best_peer is the row's fastest peer
RATIOS = (("cute_fa", "best_peer"), ("cute_fa", "sdpa_flash"), ("cute_fa", "cute_fa_tma"),
          ("cute_fa_tma", "cute_fa_sm80"), ("cute_fa_tma", "cute_fa_tma_eager"))


def methods(torch) -> dict:
    """name -> fn(q, k, v, causal) -> o: cute_fa's backends and every peer."""
    import cute_fa

    found = {
        "cute_fa": lambda q, k, v, causal: cute_fa.forward(q, k, v, causal=causal),
        "cute_fa_sm80": lambda q, k, v, causal: cute_fa.forward(q, k, v, causal=causal,
                                                                backend="sm80"),
    }
    if torch.cuda.get_device_capability()[0] >= 9:
        found["cute_fa_tma"] = lambda q, k, v, causal: cute_fa.forward(q, k, v, causal=causal,
                                                                       backend="tma")
    found.update(dense_peers(torch))
    return found


def grid_results(torch, dtypes=("bfloat16", "float16"), seqlens=SEQLENS,
                 head_dims=HEAD_DIMS) -> list:
    """One row per (dtype, head_dim, causal, seqlen): µs and TFLOPs/s per method
    (`common.measured_row`)."""
    fns = methods(torch)
    rows = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for causal in (False, True):
                for seqlen in seqlens:
                    batch, heads = TOKENS // seqlen, HIDDEN // head_dim
                    gen = torch.Generator(device="cuda").manual_seed(seqlen)
                    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda",
                                           dtype=getattr(torch, dtype), generator=gen)
                               for _ in range(3))
                    us, errors, _ = time_each(
                        torch, {n: (lambda f=f: f(q, k, v, causal)) for n, f in fns.items()},
                        reps=REPS)
                    row = measured_row(dict(dtype=dtype, head_dim=head_dim, causal=causal,
                                            seqlen=seqlen, batch=batch, heads=heads), us, errors,
                                       flops(batch, heads, seqlen, head_dim, causal))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    del q, k, v
    return rows


def small_call_table(torch) -> dict:
    """GPU time and host cost of one small call, B=1, H=16, S=128, D=128, bf16, per method."""
    q, k, v = (torch.randn(1, 128, 16, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    table = small_calls(torch, {n: (lambda f=f: f(q, k, v, False))
                                for n, f in methods(torch).items()})
    print(json.dumps(table), flush=True)
    return table


_PROBE = """
import time, sys
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import cute_fa
q, k, v = (torch.randn(1, 128, 16, {d}, device="cuda", dtype=torch.bfloat16) for _ in range(3))
torch.cuda.synchronize()
t2 = time.perf_counter()
o = cute_fa.forward(q, k, v, causal={causal})
torch.cuda.synchronize()
t3 = time.perf_counter()
print(t1 - t0, t3 - t1, t2 - t1)
"""


# one first-call probe per head_dim class (each compiles a different kernel)
START_CONFIGS = ((64, True), (128, False), (192, True), (256, False))


def _probe_env(kernel_cache: str, bytecode: str) -> dict:
    """The probes' environment: their own kernel cache, and Python's bytecode cache in
    `bytecode`, as an installed package has one (a machine whose Python writes none, as the
    lent GPU's, would otherwise compile every imported source in every probe: seconds)."""
    env = dict(os.environ, CUTE_FA_CACHE_DIR=kernel_cache, PYTHONPYCACHEPREFIX=bytecode)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def start_times(head_dim=128, causal=False, bytecode: str | None = None) -> dict:
    """First call in a new process, with a cold and then a warm on-disk cache (seconds).

    `after_torch` counts from after `import torch` (what cute_fa adds, and CUDA's start, which
    any first call pays: `cuda_start`) to the first result. bytecode: a bytecode cache folder
    shared by the probes (None: one of their own), filled by a first probe on a throwaway
    kernel cache before the two timed.
    """
    out = {}
    code = _PROBE.format(d=head_dim, causal=causal)
    with tempfile.TemporaryDirectory() as tmp:
        bytecode = bytecode or os.path.join(tmp, "pyc")
        subprocess.run([sys.executable, "-c", code], env=_probe_env(os.path.join(tmp, "fill"),
                       bytecode), capture_output=True, text=True, check=True)
        env = _probe_env(os.path.join(tmp, "kernels"), bytecode)
        for name in ("cold_cache", "warm_cache"):
            t = time.perf_counter()
            res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, check=True)
            total = time.perf_counter() - t
            torch_import, after_torch, cuda_start = (float(x) for x in res.stdout.split())
            out[name] = dict(process_total=total, import_torch=torch_import,
                             after_torch=after_torch, cuda_start=cuda_start)
    return out


# --- the report: plain functions of the results dict (they run, and are tested, on a CPU)

def _us(row, name):
    """µs of `name` on the row; best_peer: the row's fastest peer's."""
    return fastest_peer(row["us"])[1] if name == "best_peer" else row["us"].get(name)


def _column(name) -> str:
    return "fastest peer" if name == "best_peer" else label(name)


def _shape(r) -> str:
    return (f"{r['dtype']} D={r['head_dim']} {'causal' if r['causal'] else 'full'} "
            f"S={r['seqlen']}")


def _auto_note() -> str:
    """What 'auto' runs on Hopper, from the tables that decide it."""
    from .. import tuning
    note = "on Hopper the wgmma kernel, backend='sm90'"
    for (d, causal), (n, (m, bn, threads)) in sorted(tuning.SM90_LONG_TILES.items()):
        note += (f"; {'causal' if causal else 'non-causal'} head_dim {d} from {n} queries on "
                 f"{m}x{bn} tiles of {threads // 128} consumer warpgroups")
    return note


def grid_markdown(result: dict) -> str:
    rows = result["grid"]
    names = methods_in(rows, ORDER)
    ratios = [(a, b) for a, b in RATIOS if a in names and (b == "best_peer" or b in names)]
    lines = [f"# cute_fa forward, {result['device']}, {result['date']}", "",
             versions_line(result), "", timer_note(result.get("reps", REPS)), "",
             "TFLOPs/s from that time (forward FLOPs = 4·B·H·S²·D, halved when causal); "
             "batch·seqlen = 16384, heads·head_dim = 2048. cute_fa is backend='auto' (" +
             _auto_note() + "). fastest peer: the fastest on that row of SDPA "
             "default (no `sdpa_kernel` context), SDPA flash, SDPA cuDNN and flash-attn-4. "
             "Ratios: speed over speed (≥ 1.0: the first is at least as fast).", "",
             "| dtype | D | causal | S | " + " | ".join(names) + " | fastest peer | cute_fa µs "
             "| fastest peer µs | " + " | ".join(f"{a} / {_column(b)}" for a, b in ratios) + " |",
             "|" + "---|" * (len(names) + len(ratios) + 7)]
    for r in rows:
        peer, peer_us = fastest_peer(r["us"])
        vals = [cell(tflops(r.get("flops"), r["us"].get(n))) for n in names]
        vals += [label(peer), cell(r["us"].get("cute_fa"), ".1f"), cell(peer_us, ".1f")]
        vals += [times_cell(ratio(_us(r, b), _us(r, a))) for a, b in ratios]
        lines.append(f"| {r['dtype']} | {r['head_dim']} | {r['causal']} | {r['seqlen']} | "
                     + " | ".join(vals) + " |")
    lines += ["", ratio_summary(vs_fastest_peer(r["us"]) for r in rows), ""]
    if result.get("small_call"):
        lines += small_call_lines(result["small_call"], "## Small call (B=1, H=16, S=128, "
                                  "D=128, bf16)")
    if result.get("start"):
        lines += ["## New process, first result", "",
                  "B=1, H=16, S=128, bf16; seconds after `import torch` (in brackets: the whole "
                  "process), CUDA's start included; Python's bytecode cached, as an installed "
                  "package has it.", "",
                  "| head_dim | causal | cold cache (compiles) | warm disk cache |",
                  "|---|---|---|---|"]
        for v in result["start"]:
            cold, warm = v["cold_cache"], v["warm_cache"]
            lines.append(f"| {v['head_dim']} | {v['causal']} | {cold['after_torch']:.2f} s "
                         f"({cold['process_total']:.2f} s) | {warm['after_torch']:.2f} s "
                         f"({warm['process_total']:.2f} s) |")
        lines.append("")
    lines += error_lines(rows, _shape)
    return "\n".join(lines)


def _plot(result: dict, path: Path) -> None:
    """TFLOPs/s against seqlen, one panel per (dtype, head_dim, causal), one line per method,
    the row's fastest peer as a thick dashed line and the dense bf16 peak where it is known."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["grid"]
    names = methods_in(rows, ORDER)
    combos = sorted({(r["dtype"], r["head_dim"], r["causal"]) for r in rows})
    ncols = max(1, -(-len(combos) // 2))
    fig, axes = plt.subplots(2, ncols, figsize=(4.2 * ncols, 7), squeeze=False)
    for ax in axes.ravel()[len(combos):]:
        ax.set_visible(False)
    nan = float("nan")
    for ax, (dtype, d, causal) in zip(axes.ravel(), combos):
        sel = sorted((r for r in rows if (r["dtype"], r["head_dim"], r["causal"]) ==
                      (dtype, d, causal)), key=lambda r: r["seqlen"])
        x = [r["seqlen"] for r in sel]
        for n in names:
            ax.plot(x, [tflops(r.get("flops"), r["us"].get(n)) or nan for r in sel], marker="o",
                    label=n)
        ax.plot(x, [tflops(r.get("flops"), _us(r, "best_peer")) or nan for r in sel],
                color="black", ls="--", lw=2, alpha=0.6, marker="s", markersize=9,
                markerfacecolor="none", label="fastest peer")
        plot_peak(ax, result["device"], x[0])
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dtype} D={d} {'causal' if causal else 'full'}")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOPs/s")
    axes.ravel()[0].legend(fontsize=7)
    fig.suptitle(f"cute_fa forward on {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(result: dict, out_dir: Path) -> None:
    write_files(out_dir, "results", result, grid_markdown(result), _plot)


def main(out_dir: str, quick: bool = False) -> dict:
    import torch

    result = dict(run_info(torch), reps=REPS)
    configs = START_CONFIGS[1:2] if quick else START_CONFIGS
    # first: the probes run in new processes, on a GPU this one has not loaded yet
    with tempfile.TemporaryDirectory() as bytecode:
        result["start"] = [dict(head_dim=d, causal=c, **start_times(d, c, bytecode))
                           for d, c in configs]
    warm_gpu(torch)
    result["grid"] = grid_results(torch, seqlens=(1024, 8192) if quick else SEQLENS)
    if not quick:  # the larger head_dims, one dtype
        result["grid"] += grid_results(torch, dtypes=("bfloat16",), seqlens=(1024, 4096, 16384),
                                       head_dims=LARGE_HEAD_DIMS)
    result["small_call"] = small_call_table(torch)
    write_report(result, Path(out_dir))
    print((Path(out_dir) / "results.md").read_text())
    return result
