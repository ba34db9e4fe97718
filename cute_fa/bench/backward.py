"""Backward-pass benchmark: cute_fa's backward next to torch SDPA (default, flash, cuDNN) and
flash-attn-4's, on the forward benchmark's grid and on training shapes.

python -m cute_fa bench --backward --out docs/perf/<date>  writes backward.json, backward.md and
backward.png. For each shape every method runs on the same inputs in one process:

- backward only, TFLOPs/s with FLOPs = 2.5 x the forward's (five GEMMs against two): cute_fa
  (`cute_fa.backward`, default and deterministic) and every peer (autograd.grad of its output,
  the graph kept);
- forward + backward (one training step's attention), TFLOPs/s with 3.5 x the forward's FLOPs.

Every time is `common.gpu_time_us`'s: GPU time, the host's launch path (Python's argument checks,
the autograd engine) hidden behind a spin for every method alike.

The grid: 16k tokens per batch, hidden 2048, head_dim 64 and 128, seqlen 1k-16k, causal and not
(bf16); the training shapes: GQA (32 or 64 query heads, 8 K/V heads, head_dim 128) at batch 1-4
and a ragged batch (cute_fa and flash-attn-4 only, which take one).
"""

from __future__ import annotations

import json
from pathlib import Path

from .common import (HEAD_DIMS, HIDDEN, PEERS, SEQLENS, TOKENS, cell, error_lines, fastest_peer,
                     first, flash_attn_4, flops, label, measured_row, methods_in, peer_fields,
                     plot_peak, ratio, ratio_summary, run_info, sdpa_peer, small_call_lines,
                     small_calls, tflops, time_each, timer_note, times_cell, versions_line,
                     vs_fastest_peer, warm_gpu, write_files)

REPS = 20
ORDER = ("cute_fa", "cute_fa_det") + PEERS
BACKWARD_WORK, STEP_WORK = 2.5, 3.5  # x the forward's FLOPs


def max_grad_diff(a, b) -> float:
    """The largest absolute difference between two methods' gradients (tuples of tensors)."""
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def autograd_pair(torch, forward, leaves, dout) -> tuple:
    """(backward only, forward + backward) of a peer's autograd function `forward()` (its
    output, or a tuple whose first item is it). Where `forward` fails, both raise its error
    when timed, so that the row reports it (not faked)."""
    def fwd():
        return first(forward())
    try:
        o = fwd()
    except Exception as exc:
        error = exc  # `exc` itself is unbound once the except block ends

        def failed():
            raise error
        return failed, failed
    return (lambda: torch.autograd.grad(o, leaves, dout, retain_graph=True),
            lambda: torch.autograd.grad(fwd(), leaves, dout))


def methods(torch, q, k, v, dout, causal) -> dict:
    """name -> (backward-only callable, forward+backward callable), on these inputs."""
    import cute_fa

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True)

    def cute_step(det):
        def step():
            o = cute_fa.forward(*leaves, causal=causal, deterministic=det)
            return torch.autograd.grad(o, leaves, dout)
        return step

    found = {
        "cute_fa": (lambda: cute_fa.backward(dout, q, k, v, out, lse, causal), cute_step(False)),
        "cute_fa_det": (lambda: cute_fa.backward(dout, q, k, v, out, lse, causal,
                                                 deterministic=True), cute_step(True)),
    }
    found.update(peer_pairs(torch, leaves, dout, causal))
    return found


def peer_pairs(torch, leaves, dout, causal) -> dict:
    """peer -> `autograd_pair` of each of SDPA's backends and (where installed) flash-attn-4,
    on leaves = (q, k, v) that require grad."""
    found = {}
    for name in PEERS[:3]:
        found[name] = autograd_pair(torch, lambda f=sdpa_peer(torch, name): f(*leaves, causal),
                                    leaves, dout)
    fa4 = flash_attn_4()
    if fa4 is not None:
        found["flash_attn_4"] = autograd_pair(torch, lambda: fa4[0](*leaves, causal=causal),
                                              leaves, dout)
    return found


def timed_row(torch, base: dict, pairs: dict, forward_flops: float) -> dict:
    """Each method's backward (`us`, 2.5x the forward's FLOPs) and forward + backward
    (`step_us`, 3.5x), with the fastest peer of each (`best_peer`, `step_best_peer`)."""
    us, errors, _ = time_each(torch, {n: bwd for n, (bwd, _) in pairs.items()}, reps=REPS)
    step_us, step_errors, _ = time_each(torch, {n: step for n, (_, step) in pairs.items()},
                                        reps=REPS)
    row = measured_row(dict(base, forward_flops=forward_flops), us, errors,
                       BACKWARD_WORK * forward_flops)
    step = STEP_WORK * forward_flops
    row.update(step_us=step_us, step_errors=step_errors, step_flops=step,
               step_tflops={n: tflops(step, t) for n, t in step_us.items()},
               **peer_fields(step_us, prefix="step_"))
    print(json.dumps(row), flush=True)
    return row


def grid_results(torch, seqlens=SEQLENS, head_dims=HEAD_DIMS) -> list:
    rows = []
    for head_dim in head_dims:
        for causal in (False, True):
            for seqlen in seqlens:
                batch, heads = TOKENS // seqlen, HIDDEN // head_dim
                gen = torch.Generator(device="cuda").manual_seed(seqlen + head_dim)
                q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, device="cuda",
                                             dtype=torch.bfloat16, generator=gen)
                                 for _ in range(4))
                rows.append(timed_row(torch, dict(kind="grid", head_dim=head_dim, causal=causal,
                                                  seqlen=seqlen, batch=batch, heads=heads,
                                                  heads_kv=heads),
                                      methods(torch, q, k, v, dout, causal),
                                      flops(batch, heads, seqlen, head_dim, causal)))
                del q, k, v, dout
    return rows


# (query heads, batch, seqlen), 8 K/V heads: the GQA training shapes
TRAINING_SHAPES = ((32, 1, 2048), (32, 1, 4096), (32, 2, 4096), (32, 4, 2048), (32, 1, 8192),
                   (64, 1, 2048), (64, 2, 4096), (64, 1, 8192))


def training_results(torch) -> list:
    """GQA training shapes: 32 or 64 query heads over 8 K/V heads, head_dim 128, causal."""
    rows = []
    for heads, batch, seqlen in TRAINING_SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(seqlen + batch + heads)
        q, dout = (torch.randn(batch, seqlen, heads, 128, device="cuda", dtype=torch.bfloat16,
                               generator=gen) for _ in range(2))
        k, v = (torch.randn(batch, seqlen, 8, 128, device="cuda", dtype=torch.bfloat16,
                            generator=gen) for _ in range(2))
        rows.append(timed_row(torch, dict(kind="gqa", head_dim=128, causal=True, seqlen=seqlen,
                                          batch=batch, heads=heads, heads_kv=8),
                              methods(torch, q, k, v, dout, True),
                              flops(batch, heads, seqlen, 128, True)))
    return rows


def varlen_results(torch) -> list:
    """A ragged batch of 16 sequences of 256-4096 tokens (32k in all), GQA 32/8, causal:
    cute_fa's and flash-attn-4's varlen backward (SDPA takes no ragged batch)."""
    import cute_fa

    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(256, 4097, (16,), generator=gen).tolist()
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(16)], dtype=torch.int32,
                      device="cuda")
    total, max_len = sum(lens), max(lens)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, dout = (torch.randn(total, 32, 128, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(2))
    k, v = (torch.randn(total, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    out, lse = cute_fa.forward_varlen(q, k, v, cu, cu, max_len, max_len, causal=True,
                                      return_lse=True)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    pairs = {"cute_fa": (
        lambda: cute_fa.backward_varlen(dout, q, k, v, out, lse, cu, cu, max_len, max_len, True),
        lambda: torch.autograd.grad(cute_fa.forward_varlen(*leaves, cu, cu, max_len, max_len,
                                                           causal=True), leaves, dout))}
    fa4 = flash_attn_4()
    if fa4 is not None:
        pairs["flash_attn_4"] = autograd_pair(
            torch, lambda: fa4[1](*leaves, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                  max_seqlen_q=max_len, max_seqlen_k=max_len, causal=True),
            leaves, dout)
    work = sum(flops(1, 32, n, 128, True) for n in lens)
    return [timed_row(torch, dict(kind="varlen", head_dim=128, causal=True, seqlen=max_len,
                                  batch=16, heads=32, heads_kv=8, tokens=total), pairs, work)]


def small_call_table(torch) -> dict:
    """GPU time and host cost of one small forward call (B=1, H=16, S=128, D=128): without grad
    (no dispatcher), with inputs that require grad (the forward alone, its graph recorded), and
    torch SDPA's default."""
    import cute_fa

    q, k, v = (torch.randn(1, 128, 16, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    sdpa = sdpa_peer(torch, "sdpa_default")
    table = small_calls(torch, {"cute_fa": lambda: cute_fa.forward(q, k, v),
                                "cute_fa_requires_grad": lambda: cute_fa.forward(qg, kg, vg),
                                "sdpa_default": lambda: sdpa(q, k, v)})
    print(json.dumps(table), flush=True)
    return table


# --- the report: plain functions of the results dict (they run, and are tested, on a CPU)

def _tf(r, name, step=False):
    if step:
        return tflops(r.get("step_flops"), r.get("step_us", {}).get(name))
    return tflops(r.get("flops"), r["us"].get(name))


def _shape(r) -> str:
    return (f"{r['kind']} B{r['batch']} S{r['seqlen']} H{r['heads']}/{r['heads_kv']} "
            f"D{r['head_dim']}")


def backward_markdown(result: dict) -> str:
    rows = result["rows"]
    names = [n for n in methods_in(rows, ORDER) if n != "cute_fa_det"]
    peers = [n for n in names if n in PEERS]
    lines = [f"# Backward pass, {result['device']}, {result['date']}", "",
             versions_line(result) + " bf16.", "", timer_note(result.get("reps", REPS)), "",
             "TFLOPs/s from that time, backward only (2.5x the forward's FLOPs) and forward + "
             "backward (3.5x). `det`: deterministic=True. fastest peer: the fastest on that row "
             "of SDPA default (no `sdpa_kernel` context), SDPA flash, SDPA cuDNN and "
             "flash-attn-4, for the backward and for the step each. Ratios: cute_fa's speed "
             "over each (≥ 1.0: cute_fa at least as fast).", ""]
    head = (["shape", "causal", "cute_fa", "det"] + [label(p) for p in peers]
            + ["fastest peer", "cute_fa µs", "fastest peer µs"]
            + [f"vs {label(p)}" for p in peers] + ["vs fastest peer", "det/default"]
            + [f"fwd+bwd {label(n)}" for n in names]
            + ["fwd+bwd fastest peer", "fwd+bwd vs fastest peer"])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        c = r["us"].get("cute_fa")
        peer, peer_us = fastest_peer(r["us"])
        step_us = r.get("step_us", {})
        lines.append("| " + " | ".join(
            [_shape(r), "yes" if r["causal"] else "no"]
            + [cell(_tf(r, n)) for n in ["cute_fa", "cute_fa_det"] + peers]
            + [label(peer), cell(c, ".1f"), cell(peer_us, ".1f")]
            + [times_cell(ratio(r["us"].get(p), c)) for p in peers]
            + [times_cell(vs_fastest_peer(r["us"])),
               cell(ratio(c, r["us"].get("cute_fa_det")), ".2f")]
            + [cell(_tf(r, n, step=True)) for n in names]
            + [label(fastest_peer(step_us)[0]), times_cell(vs_fastest_peer(step_us))]) + " |")
    lines += ["", "Backward: " + ratio_summary(vs_fastest_peer(r["us"]) for r in rows),
              "", "Forward + backward: " + ratio_summary(vs_fastest_peer(r.get("step_us", {}))
                                                         for r in rows)]
    grid = [r for r in rows if r["kind"] == "grid" and r["us"].get("cute_fa")]
    flash = [x for x in (ratio(r["us"].get("sdpa_flash"), r["us"]["cute_fa"]) for r in grid) if x]
    det = [x for x in (ratio(r["us"]["cute_fa"], r["us"].get("cute_fa_det")) for r in grid) if x]
    if flash:
        line = (f"Grid: cute_fa / SDPA flash {min(flash):.2f}x-{max(flash):.2f}x (target >= "
                f"1.15x on every shape: met on {sum(x >= 1.15 for x in flash)} of {len(flash)})")
        if det:
            line += (f"; deterministic / default {min(det):.2f}-{max(det):.2f} (target >= 0.85: "
                     f"met on {sum(x >= 0.85 for x in det)} of {len(det)})")
        lines += ["", line + "."]
    lines.append("")
    if result.get("small_call"):
        lines += small_call_lines(result["small_call"], "## Small forward call (B=1, H=16, "
                                  "S=128, D=128, bf16)")
    lines += error_lines(rows, _shape, keys=("errors", "step_errors"))
    return "\n".join(lines) + "\n"


def _plot(result: dict, path: Path) -> None:
    """Backward TFLOPs/s against seqlen on the grid, one panel per (head_dim, causal), the
    row's fastest peer as a thick dashed line and the dense bf16 peak where it is known."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [r for r in result["rows"] if r["kind"] == "grid"]
    panels = sorted({(r["head_dim"], r["causal"]) for r in grid})
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), sharey=True,
                             squeeze=False)
    axes = axes.ravel()
    nan = float("nan")
    for ax, (hd, causal) in zip(axes, panels):
        rows = sorted((r for r in grid if (r["head_dim"], r["causal"]) == (hd, causal)),
                      key=lambda r: r["seqlen"])
        xs = [r["seqlen"] for r in rows]
        for name in methods_in(rows, ORDER):
            ys = [_tf(r, name) for r in rows]
            if any(ys):
                ax.plot(xs, [y or nan for y in ys], marker="o", label=name)
        ax.plot(xs, [tflops(r.get("flops"), fastest_peer(r["us"])[1]) or nan for r in rows],
                color="black", ls="--", lw=2, alpha=0.6, marker="s", markersize=9,
                markerfacecolor="none", label="fastest peer")
        plot_peak(ax, result["device"], xs[0])
        ax.set_xscale("log", base=2)
        ax.set_title(f"head_dim {hd}, {'causal' if causal else 'non-causal'}", fontsize=9)
        ax.set_xlabel("seqlen")
    axes[0].set_ylim(bottom=0)  # once every panel is drawn: the shared axis fits them all
    axes[0].set_ylabel("backward TFLOPs/s (bf16)")
    axes[-1].legend(fontsize=7)
    fig.suptitle(f"Backward, {result['device']}, {result['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(result: dict, out_dir: Path) -> None:
    write_files(out_dir, "backward", result, backward_markdown(result), _plot)


def main(out_dir: str, quick: bool = False) -> dict:
    import torch

    result = dict(run_info(torch), reps=REPS, rows=[])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = [lambda: grid_results(torch, seqlens=(1024, 8192) if quick else SEQLENS)]
    if not quick:
        parts += [lambda: training_results(torch), lambda: varlen_results(torch)]
    warm_gpu(torch)
    for part in parts:  # each part's rows are on disk before the next starts
        result["rows"] += part()
        (out / "backward.json").write_text(json.dumps(result, indent=1))
    result["small_call"] = small_call_table(torch)
    write_report(result, out)
    print((out / "backward.md").read_text())
    return result
