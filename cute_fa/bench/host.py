"""Host cost per call: what the host spends to launch one small attention call, next to the
call's GPU time, for cute_fa, torch SDPA (default) and flash-attn-4.

python -m cute_fa bench --host --out DIR  writes host.json and host.md. One shape, B=1, H=16,
S=128, D=128, bf16 (a small call, whose kernel is shorter than its host path), in three modes:

- no_grad: the forward on inputs that do not require grad (cute_fa's direct route to its
  kernels, no dispatcher);
- requires_grad: the forward alone on inputs that require grad (autograd records the graph);
- step: forward + backward, `torch.autograd.grad` of the output with a given dout.

host µs per call is `common.host_us` (calls back to back, timed on the host while a GPU spin
outlasts them, so the GPU never holds the host up); GPU µs per call is `common.gpu_time_us` (the
host's launch hidden behind a spin), the same timer as every other benchmark's.
"""

from __future__ import annotations

import json
from pathlib import Path

from .common import (PEERS, cell, error_text, first, flash_attn_4, gpu_time_us, host_us, label,
                     peer_fields, ratio_summary, run_info, sdpa_peer, timer_note, times_cell,
                     versions_line, vs_fastest_peer, warm_gpu, write_files)

SHAPE = dict(batch=1, seqlen=128, heads=16, head_dim=128, dtype="bfloat16")
MODES = ("no_grad", "requires_grad", "step")
MODE_TEXT = {"no_grad": "forward, inputs without grad",
             "requires_grad": "forward, inputs that require grad (graph recorded)",
             "step": "forward + backward (autograd.grad)"}
# host_us's calls and gpu_time_us's samples per mode: a step launches several kernels, and the
# CUDA launch queue (~1000 entries) must hold all of them while the spin holds the GPU
CALLS = {"no_grad": 200, "requires_grad": 200, "step": 50}
REPS = {"no_grad": 50, "requires_grad": 50, "step": 20}
METHODS = ("cute_fa", "sdpa_default", "flash_attn_4")


def forwards(torch) -> dict:
    """name -> fn(q, k, v) -> o, non-causal, in flash-attn's layout."""
    import cute_fa

    found = {"cute_fa": lambda q, k, v: cute_fa.forward(q, k, v),
             "sdpa_default": sdpa_peer(torch, "sdpa_default")}
    fa4 = flash_attn_4()
    if fa4 is not None:
        found["flash_attn_4"] = lambda q, k, v: first(fa4[0](q, k, v))
    return found


def calls_by_mode(torch) -> dict:
    """mode -> {name: fn()} on one set of inputs."""
    s = SHAPE
    q, k, v, dout = (torch.randn(s["batch"], s["seqlen"], s["heads"], s["head_dim"],
                                 device="cuda", dtype=getattr(torch, s["dtype"]))
                     for _ in range(4))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    modes: dict = {mode: {} for mode in MODES}
    for name, f in forwards(torch).items():
        modes["no_grad"][name] = lambda f=f: f(q, k, v)
        modes["requires_grad"][name] = lambda f=f: f(*leaves)
        modes["step"][name] = lambda f=f: torch.autograd.grad(f(*leaves), leaves, dout)
    return modes


def host_results(torch, quick: bool = False) -> list:
    """One row per mode: `host_us` and `gpu_us` by method (None where the call failed, its
    message in `errors`), with the fastest peer of each (`host_best_peer`, `gpu_best_peer`)."""
    scale = 4 if quick else 1
    rows = []
    for mode, fns in calls_by_mode(torch).items():
        calls, reps = CALLS[mode] // scale, REPS[mode] // scale
        row = dict(SHAPE, mode=mode, calls=calls, reps=reps, host_us={}, gpu_us={}, errors={})
        for name, fn in fns.items():
            try:
                fn()  # the first call compiles, outside both timings
                row["gpu_us"][name] = gpu_time_us(torch, fn, reps=reps)
                row["host_us"][name] = host_us(torch, fn, calls=calls)
            except Exception as exc:
                row["gpu_us"][name] = row["host_us"][name] = None
                row["errors"][name] = error_text(exc)
        row.update(peer_fields(row["host_us"], prefix="host_"))
        row.update(peer_fields(row["gpu_us"], prefix="gpu_"))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# --- the report: plain functions of the results dict (they run, and are tested, on a CPU)

def host_markdown(result: dict) -> str:
    rows = result["rows"]
    names = [n for n in METHODS if any(n in r["host_us"] for r in rows)]
    reps = "-".join(str(n) for n in sorted({r["reps"] for r in rows})) or "no"
    s = SHAPE
    lines = [f"# Host cost per call, {result['device']}, {result['date']}", "",
             versions_line(result), "", timer_note(reps), "",
             f"B={s['batch']}, H={s['heads']}, S={s['seqlen']}, D={s['head_dim']}, "
             f"{s['dtype']}, non-causal. Host µs per call: `calls` calls back to back, timed on "
             "the host with the GPU held by a spin that outlasts them (no sync inside), ÷ calls. "
             "fastest peer: the fastest of SDPA default and flash-attn-4 in that column; "
             "ratios: cute_fa's speed over its (≥ 1.0: cute_fa at least as fast).", ""]
    head = (["mode", "calls"] + [f"{label(n)} host µs" for n in names]
            + ["fastest peer (host)", "cute_fa vs it (host)"]
            + [f"{label(n)} GPU µs" for n in names]
            + ["fastest peer (GPU)", "cute_fa vs it (GPU)"])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = ([MODE_TEXT.get(r["mode"], r["mode"]), str(r["calls"])]
                 + [cell(r["host_us"].get(n), ".1f") for n in names]
                 + [label(r.get("host_best_peer")), times_cell(vs_fastest_peer(r["host_us"]))]
                 + [cell(r["gpu_us"].get(n), ".1f") for n in names]
                 + [label(r.get("gpu_best_peer")), times_cell(vs_fastest_peer(r["gpu_us"]))])
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Host: " + ratio_summary(vs_fastest_peer(r["host_us"]) for r in rows),
              "", "GPU: " + ratio_summary(vs_fastest_peer(r["gpu_us"]) for r in rows), ""]
    failed = [(r["mode"], n, m) for r in rows for n, m in r.get("errors", {}).items()]
    if failed:
        lines += ["## Failed calls", ""]
        lines += [f"- {label(n)}, {MODE_TEXT.get(mode, mode)}: `{m}`" for mode, n, m in failed]
        lines.append("")
    if result.get("flash_attn_4_error") and "flash_attn_4" not in names:
        lines += [f"flash-attn-4 not measured: {result['flash_attn_4_error']}", ""]
    return "\n".join(lines)


def write_report(result: dict, out_dir: Path) -> None:
    write_files(out_dir, "host", result, host_markdown(result))


def main(out_dir: str, quick: bool = False) -> dict:
    """quick: a quarter of the calls and samples."""
    import torch

    result = dict(run_info(torch), peers=[n for n in PEERS if n in METHODS])
    warm_gpu(torch)
    result["rows"] = host_results(torch, quick)
    write_report(result, Path(out_dir))
    print((Path(out_dir) / "host.md").read_text())
    return result
