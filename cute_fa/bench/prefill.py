"""Prefill as real clients send it: small batches, ragged batches, sliding windows, and a whole
HF transformers model, next to torch SDPA (default, flash, cuDNN) and flash-attn-4.

python -m cute_fa bench --prefill --out DIR  writes prefill.json, prefill.md and prefill.png.
Every method runs on the same inputs in one process, timed by `common.gpu_time_us` (GPU time per
call, the host's launch hidden behind a spin for every method alike); TFLOPs/s count the work the
masks leave (4·Sq·Sk·D per head, halved under causal masking of a square, the visible pairs
under a window or a ragged batch).

- small: causal GQA prefill at batch 1-4 (the shapes an inference server prefills), and the
  same methods on the paper grid's large batches (16k tokens) at the same head_dim, which the
  small shapes are measured against.
- varlen: 16 prompts of 100-4000 tokens packed end to end (~32k tokens): cute_fa.forward_varlen
  and flash-attn-4's flash_attn_varlen_func, SDPA on the same prompts right-padded to the
  longest (causal masking then hides the padding from every real query), and the dense
  kernels on a uniform batch of the same token count.
- window: one 32k-token sequence, causal, full and with a 4k sliding window.
- model: a randomly initialised Llama-style model (8 layers, hidden 2048, 16/4 heads, bf16):
  prefill of a 2000-token prompt and per-token greedy decode, per attention implementation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .common import (HIDDEN, PEERS, TOKENS, HostBound, cell, dense_peers, error_lines, error_text,
                     fastest_peer, first, flash_attn_4, gpu_time_us, label, measured_row,
                     methods_in, package_version, plot_peak, ratio, ratio_summary, run_info,
                     sdpa_peer, tflops, time_each, timer_note, times_cell, versions_line,
                     vs_fastest_peer, warm_gpu, write_files)

REPS = 20
SMALL_SHAPES = ((1, 512), (1, 2000), (1, 8192), (2, 1024), (4, 1024), (4, 4096))
SMALL_HEADS = ((32, 8, 128), (64, 8, 128), (32, 8, 64), (64, 8, 64))  # (Hq, Hkv, D)
LARGE_SEQLENS = (1024, 2048, 4096, 8192)  # the paper grid's: batch = 16384 / S, H = 2048 / D
VARLEN_PROMPTS, VARLEN_MIN, VARLEN_MAX = 16, 100, 4000
WINDOW_SEQLEN, WINDOW = 32768, 4096
ORDER = ("cute_fa", "cute_fa_sm90_64", "cute_fa_tma", "cute_fa_sm80") + PEERS
MODEL_IMPLS = ("sdpa", "cute_fa", "flash_attention_4", "eager", "flash_attention_2")


def _sm90_rows64():
    """fn(q, k, v, causal) of the wgmma kernel on a 64 x 128 tile (one consumer warpgroup,
    twice the CTAs of the 128-row tile 'auto' takes): the small-grid A/B, a variant the public
    API does not pick, run through it with `runtime.plan.overriding`."""
    import cute_fa
    from cute_fa.layouts import TileConfig
    from cute_fa.runtime.plan import overriding

    tiles: dict = {}

    def fn(q, k, v, causal):
        d = q.shape[-1]
        dtype = str(q.dtype).removeprefix("torch.")
        tile = tiles.get((d, dtype))
        if tile is None:
            tile = tiles[(d, dtype)] = TileConfig(head_dim=d, block_m=64, block_n=128,
                                                  num_threads=128, dtype=dtype, wgmma=True)
        with overriding(tile=tile):
            return cute_fa.forward(q, k, v, causal=causal, backend="sm90")
    return fn


def dense_methods(torch) -> dict:
    """name -> fn(q, k, v, causal) -> o: cute_fa's backends, the 64-row wgmma A/B on Hopper,
    and every peer."""
    import cute_fa

    found = {
        "cute_fa": lambda q, k, v, c: cute_fa.forward(q, k, v, causal=c),
        "cute_fa_sm80": lambda q, k, v, c: cute_fa.forward(q, k, v, causal=c, backend="sm80"),
    }
    if torch.cuda.get_device_capability()[0] == 9:
        # the kernel 'auto' took on Hopper before the wgmma one, and the 64-row wgmma tile
        found["cute_fa_tma"] = lambda q, k, v, c: cute_fa.forward(q, k, v, causal=c,
                                                                  backend="tma")
        found["cute_fa_sm90_64"] = _sm90_rows64()
    found.update(dense_peers(torch))
    return found


def _randn(torch, *shape, gen):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)


def _row(torch, base: dict, fns: dict, work: float) -> dict:
    us, errors, _ = time_each(torch, fns, reps=REPS)
    row = measured_row(base, us, errors, work)
    print(json.dumps(row), flush=True)
    return row


def small_results(torch, quick: bool = False) -> list:
    methods = dense_methods(torch)
    rows = []
    heads = SMALL_HEADS[:1] if quick else SMALL_HEADS
    for hq, hk, d in heads:
        for b, s in SMALL_SHAPES[:2] if quick else SMALL_SHAPES:
            gen = torch.Generator("cuda").manual_seed(b * s + hq + d)
            q, k, v = _randn(torch, b, s, hq, d, gen=gen), _randn(torch, b, s, hk, d, gen=gen), \
                _randn(torch, b, s, hk, d, gen=gen)
            rows.append(_row(torch, dict(kind="small", batch=b, seqlen=s, heads_q=hq,
                                         heads_kv=hk, head_dim=d),
                             {n: (lambda f=f: f(q, k, v, True)) for n, f in methods.items()},
                             2 * b * hq * s * s * d))
    for d in sorted({d for _, _, d in heads}):
        for s in LARGE_SEQLENS[::3] if quick else LARGE_SEQLENS:
            b, h = TOKENS // s, HIDDEN // d
            gen = torch.Generator("cuda").manual_seed(s + d)
            q, k, v = (_randn(torch, b, s, h, d, gen=gen) for _ in range(3))
            rows.append(_row(torch, dict(kind="large", batch=b, seqlen=s, heads_q=h, heads_kv=h,
                                         head_dim=d),
                             {n: (lambda f=f: f(q, k, v, True)) for n, f in methods.items()},
                             2 * b * h * s * s * d))
    return rows


def varlen_results(torch) -> list:
    import cute_fa

    hq, hk, d = 32, 8, 128
    lens = torch.randint(VARLEN_MIN, VARLEN_MAX + 1, (VARLEN_PROMPTS,),
                         generator=torch.Generator().manual_seed(0)).tolist()
    total, longest = sum(lens), max(lens)
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    gen = torch.Generator("cuda").manual_seed(1)
    q, k, v = _randn(torch, total, hq, d, gen=gen), _randn(torch, total, hk, d, gen=gen), \
        _randn(torch, total, hk, d, gen=gen)
    work = sum(2 * hq * n * n * d for n in lens)  # causal, per prompt
    # the same prompts right-padded into (B, longest, H, D), SDPA's way of taking them
    padded = [torch.zeros(len(lens), longest, h, d, device="cuda", dtype=torch.bfloat16)
              for h in (hq, hk, hk)]
    for i, n in enumerate(lens):
        for dst, src in zip(padded, (q, k, v)):
            dst[i, :n] = src[int(cu[i]):int(cu[i]) + n]

    def varlen(backend="auto"):
        return lambda: cute_fa.forward_varlen(q, k, v, cu, cu, longest, longest, causal=True,
                                              backend=backend)

    fns = {"cute_fa": varlen(), "cute_fa_sm80": varlen("sm80")}
    if torch.cuda.get_device_capability()[0] >= 9:
        fns["cute_fa_tma"] = varlen("tma")
    for name in PEERS[:3]:
        fns[name] = lambda f=sdpa_peer(torch, name): f(*padded, True)
    fa4 = flash_attn_4()
    if fa4:
        fns["flash_attn_4"] = lambda: first(fa4[1](q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                   max_seqlen_q=longest, max_seqlen_k=longest,
                                                   causal=True))
    rows = [_row(torch, dict(kind="varlen", prompts=len(lens), tokens=total, longest=longest,
                             lengths=lens, heads_q=hq, heads_kv=hk, head_dim=d,
                             sdpa_inputs="right-padded to the longest prompt"), fns, work)]
    # the dense kernels on a uniform batch of the same token count (the varlen target)
    s = 2048
    b = total // s
    qd, kd, vd = _randn(torch, b, s, hq, d, gen=gen), _randn(torch, b, s, hk, d, gen=gen), \
        _randn(torch, b, s, hk, d, gen=gen)
    rows.append(_row(torch, dict(kind="varlen_dense", batch=b, seqlen=s, heads_q=hq, heads_kv=hk,
                                 head_dim=d),
                     {n: (lambda f=f: f(qd, kd, vd, True))
                      for n, f in dense_methods(torch).items()}, 2 * b * hq * s * s * d))
    return rows


def window_pairs(s: int, left: int) -> int:
    """(query, key) pairs a causal window of `left` keys back leaves in an s x s square."""
    return sum(min(i, left) + 1 for i in range(s))


def window_results(torch) -> list:
    import cute_fa

    hq, hk, d, s = 32, 8, 128, WINDOW_SEQLEN
    gen = torch.Generator("cuda").manual_seed(2)
    q, k, v = _randn(torch, 1, s, hq, d, gen=gen), _randn(torch, 1, s, hk, d, gen=gen), \
        _randn(torch, 1, s, hk, d, gen=gen)
    fa4 = flash_attn_4()
    rows = []
    for window in (None, WINDOW):
        size = (-1, -1) if window is None else (window - 1, 0)  # window keys, itself included
        pairs = s * (s + 1) // 2 if window is None else window_pairs(s, window - 1)
        fns = {"cute_fa": lambda size=size: cute_fa.forward(q, k, v, causal=True,
                                                            window_size=size),
               "cute_fa_sm80": lambda size=size: cute_fa.forward(q, k, v, causal=True,
                                                                 window_size=size,
                                                                 backend="sm80")}
        if fa4:
            fns["flash_attn_4"] = lambda size=size: first(fa4[0](q, k, v, causal=True,
                                                                 window_size=size))
        if window is None:  # SDPA has no sliding window short of a (32k, 32k) mask
            for name in PEERS[:3]:
                fns[name] = lambda f=sdpa_peer(torch, name): f(q, k, v, True)
        rows.append(_row(torch, dict(kind="window", seqlen=s, window=window, heads_q=hq,
                                     heads_kv=hk, head_dim=d), fns, 4 * hq * pairs * d))
    return rows


def model_results(torch, prompt: int = 2000, new_tokens: int = 32) -> list:
    """Prefill and per-token decode of a random-init Llama-style model, per attention
    implementation available here. `prefill_ms` and `decode_ms_per_token` are end to end, the
    host's time inside (hide_host=False; generate() synchronizes every token), the same way for
    every implementation; `prefill_gpu_ms` is the prefill's GPU time behind the spin, where the
    model's forward lets the host run ahead (no sync inside, the launch queue not full)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM

        import cute_fa.integrations.transformers  # noqa: F401  registers "cute_fa"
    except Exception as exc:
        print(f"transformers not importable: {exc}", file=sys.stderr)
        return []
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                      max_position_embeddings=8192)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, prompt), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(3))

    def generate(n):
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)

    rows: dict = {}
    # two rounds over the implementations, the faster of each one's two medians kept: the
    # first implementation timed would otherwise also pay for the GPU's clocks ramping up
    for _ in range(2):
        for impl in MODEL_IMPLS:
            row = rows.setdefault(impl, dict(kind="model", impl=impl, prompt=prompt,
                                             new_tokens=new_tokens,
                                             transformers=package_version("transformers")))
            if "error" in row:
                continue
            try:
                model.set_attn_implementation(impl)
                with torch.no_grad():
                    prefill = gpu_time_us(torch, lambda: model(ids), reps=10, warmup_calls=3,
                                          hide_host=False)
                    try:
                        # 5 samples: a forward is ~100 launches, the queue holds ~1000
                        prefill_gpu = gpu_time_us(torch, lambda: model(ids), reps=5,
                                                  warmup_calls=3) / 1e3
                    except HostBound:
                        prefill_gpu = None
                    # a step: generating new_tokens + 1 tokens less generating 1 (the prefill
                    # and generate()'s fixed costs), median of 5 each
                    one = gpu_time_us(torch, lambda: generate(1), reps=5, warmup_calls=2,
                                      warmup_s=0.0, hide_host=False)
                    many = gpu_time_us(torch, lambda: generate(new_tokens + 1), reps=5,
                                       warmup_calls=1, warmup_s=0.0, hide_host=False)
                step = (many - one) / new_tokens / 1e3
                row["prefill_ms"] = min(prefill / 1e3, row.get("prefill_ms", prefill / 1e3))
                if prefill_gpu is not None:
                    row["prefill_gpu_ms"] = min(prefill_gpu,
                                                row.get("prefill_gpu_ms") or prefill_gpu)
                row["decode_ms_per_token"] = min(step, row.get("decode_ms_per_token", step))
            except Exception as exc:
                row["error"] = error_text(exc, 200)
            print(json.dumps(row), flush=True)
    return list(rows.values())


# --- the report: plain functions of the results dict (they run, and are tested, on a CPU)

def _tf(r, name):
    return tflops(r.get("flops"), r["us"].get(name))


def _large_means(rows) -> dict:
    """head_dim -> cute_fa's TFLOPs/s on each large row (the small shapes' reference)."""
    large: dict = {}
    for r in rows:
        if r["kind"] == "large" and _tf(r, "cute_fa"):
            large.setdefault(r["head_dim"], []).append(_tf(r, "cute_fa"))
    return large


def _table(rows, names, large=None) -> list:
    """| B | S | Hq/Hkv | D | TFLOPs/s by method | fastest peer | cute_fa µs | its µs | ratios |,
    with cute_fa / large (the large rows' mean at that head_dim) where `large` is given."""
    ratios = ["cute_fa / large"] if large is not None else []
    ratios += ["cute_fa / SDPA flash", "cute_fa / SDPA cuDNN", "cute_fa / fastest peer"]
    lines = ["| B | S | Hq/Hkv | D | " + " | ".join(names) + " | fastest peer | cute_fa µs | "
             "fastest peer µs | " + " | ".join(ratios) + " |",
             "|" + "---|" * (len(names) + len(ratios) + 7)]
    for r in rows:
        peer, peer_us = fastest_peer(r["us"])
        cf = r["us"].get("cute_fa")
        cells = [cell(_tf(r, n)) for n in names] + [label(peer), cell(cf, ".1f"),
                                                    cell(peer_us, ".1f")]
        if large is not None:
            ref = large.get(r["head_dim"])
            cells.append(cell(ratio(_tf(r, "cute_fa"), ref and sum(ref) / len(ref)), ".2f"))
        cells += [times_cell(ratio(r["us"].get(p), cf)) for p in ("sdpa_flash", "sdpa_cudnn")]
        cells.append(times_cell(vs_fastest_peer(r["us"])))
        lines.append(f"| {r['batch']} | {r['seqlen']} | {r['heads_q']}/{r['heads_kv']} | "
                     f"{r['head_dim']} | " + " | ".join(cells) + " |")
    return lines


def _describe(r) -> str:
    keys = ("prompts", "tokens", "longest", "batch", "seqlen", "window", "heads_q", "heads_kv",
            "head_dim")
    return f"{r['kind']} " + ", ".join(f"{k}={r[k]}" for k in keys if k in r)


def prefill_markdown(result: dict) -> str:
    rows = result["rows"]
    lines = [f"# cute_fa prefill as clients send it, {result['device']}, {result['date']}", "",
             versions_line(result) + " bf16.", "",
             timer_note(result.get("reps", REPS), host_column=False), "",
             "TFLOPs/s of the work the mask leaves, from that time. cute_fa is backend='auto'. "
             "fastest peer: the fastest on that row of SDPA default (no `sdpa_kernel` context), "
             "SDPA flash, SDPA cuDNN and flash-attn-4; ratios are speed over speed (≥ 1.0: "
             "cute_fa at least as fast).", ""]
    if result.get("note"):
        lines += [f"Note: {result['note']}.", ""]
    small = [r for r in rows if r["kind"] == "small"]
    large_rows = [r for r in rows if r["kind"] == "large"]
    large = _large_means(rows)
    if small:
        lines += ["## Small-batch causal prefill (GQA)", "",
                  "cute_fa / large: cute_fa's TFLOPs/s over its mean on the paper grid's large "
                  "batches (16k tokens, S = 1k-8k, hidden 2048) at the same head_dim, causal.",
                  ""] + _table(small, methods_in(small, ORDER), large)
        lines += ["", ratio_summary(vs_fastest_peer(r["us"]) for r in small), ""]
    if large_rows:
        lines += ["## Paper-grid batches, causal (the reference)", ""]
        lines += _table(large_rows, methods_in(large_rows, ORDER))
        lines += ["", "Large batches (the reference): "
                  + "; ".join(f"D={d}: " + ", ".join(f"{x:.0f}" for x in v) + f" (mean "
                              f"{sum(v) / len(v):.0f})" for d, v in sorted(large.items())), ""]
    for kind, title in (("varlen", "Ragged batch"), ("varlen_dense", "Dense kernels, same tokens"),
                        ("window", "Sliding window")):
        sel = [r for r in rows if r["kind"] == kind]
        if not sel:
            continue
        lines += [f"## {title}", ""]
        for r in sel:
            peer = fastest_peer(r["us"])[0]
            desc = {k: r[k] for k in ("prompts", "tokens", "longest", "batch", "seqlen", "window",
                                      "heads_q", "heads_kv", "head_dim") if k in r}
            lines.append(f"- {desc}: " + ", ".join(
                f"{n} {_tf(r, n):.0f} TFLOPs/s ({t:.0f} µs)" for n, t in r["us"].items() if t)
                + (f"; fastest peer {label(peer)}, cute_fa / fastest peer "
                   f"{times_cell(vs_fastest_peer(r['us']))}" if peer else ""))
            if r.get("sdpa_inputs"):
                lines.append(f"  - SDPA's inputs: {r['sdpa_inputs']}")
            if r.get("errors"):
                lines.append("  - not run: " + "; ".join(f"{n}: {m}"
                                                         for n, m in r["errors"].items()))
        lines.append("")
    timed = [r for r in rows if "us" in r]
    if timed:
        lines += ["All rows: " + ratio_summary(vs_fastest_peer(r["us"]) for r in timed), ""]
    lines += _model_lines([r for r in rows if r["kind"] == "model"])
    lines += error_lines([r for r in small + large_rows], _describe)
    return "\n".join(lines) + "\n"


def _model_lines(model) -> list:
    if not model:
        return []
    lines = ["## HF transformers model (random-init Llama, 8 layers, hidden 2048, 16/4 heads, "
             "bf16)", "",
             "End to end, the host's time inside, for every implementation alike "
             "(generate() synchronizes every token); prefill GPU: its GPU time behind the spin, "
             "where the model's forward lets the host run ahead of the GPU.", "",
             "| attn_implementation | prefill of 2000 tokens, ms | prefill GPU, ms | decode, ms "
             "per token |", "|---|---|---|---|"]
    for r in model:
        if "error" in r:
            lines.append(f"| {r['impl']} | not run: {r['error']} | | |")
        else:
            lines.append(f"| {r['impl']} | {r['prefill_ms']:.2f} | "
                         f"{cell(r.get('prefill_gpu_ms'), '.2f')} | "
                         f"{r['decode_ms_per_token']:.2f} |")
    ran = {r["impl"]: r for r in model if "error" not in r}
    if "cute_fa" in ran and len(ran) > 1:
        lines.append("")
        for key, what in (("prefill_ms", "prefill"), ("decode_ms_per_token", "decode")):
            others = {n: r[key] for n, r in ran.items() if n != "cute_fa"}
            name, best = fastest_peer(others, tuple(others))
            lines.append(f"- {what}: fastest other implementation {name} {best:.2f} ms; cute_fa "
                         f"/ it (speed) {times_cell(ratio(best, ran['cute_fa'][key]))}")
    return lines + [""]


def _plot(result: dict, path: Path) -> None:
    """The small shapes' TFLOPs/s per method as bars, each row's fastest peer marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    small = [r for r in result["rows"] if r["kind"] == "small"]
    names = [n for n in ("cute_fa",) + PEERS if any(r["us"].get(n) for r in small)]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        ax.bar([j + i * width for j in range(len(small))], [_tf(r, n) or 0 for r in small],
               width, label=n)
    # a black triangle over each row's fastest peer's bar
    best = [(j + names.index(peer) * width, 1.04 * tflops(r.get("flops"), us))
            for j, r in enumerate(small) for peer, us in [fastest_peer(r["us"])]
            if peer in names]
    if best:
        ax.scatter(*zip(*best), marker="v", s=30, color="black", zorder=3, label="fastest peer")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(small))])
    ax.set_xticklabels([f"B{r['batch']} S{r['seqlen']}\n{r['heads_q']}/{r['heads_kv']} "
                        f"D{r['head_dim']}" for r in small], fontsize=6)
    ax.set_ylabel("TFLOPs/s")
    plot_peak(ax, result["device"], 0)
    ax.legend(fontsize=7)
    ax.set_title(f"Small-batch causal prefill, {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(result: dict, out_dir: Path) -> None:
    small = any(r["kind"] == "small" for r in result["rows"])  # what the plot draws
    write_files(out_dir, "prefill", result, prefill_markdown(result), _plot if small else None)


def main(out_dir: str, quick: bool = False) -> dict:
    """quick: one head configuration, two small shapes and two large ones, the ragged batch and
    the window; no HF model."""
    import torch

    result = dict(run_info(torch), reps=REPS, rows=[])
    parts = [lambda: small_results(torch, quick), lambda: varlen_results(torch),
             lambda: window_results(torch)]
    if not quick:
        parts.append(lambda: model_results(torch))
    warm_gpu(torch)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for part in parts:  # each part's rows are on disk before the next starts
        result["rows"] += part()
        (out / "prefill.json").write_text(json.dumps(result, indent=1))
    write_report(result, out)
    print((out / "prefill.md").read_text())
    return result
