"""Prefill as real clients send it: small batches, ragged batches, sliding windows, and a whole
HF transformers model, next to torch SDPA (default, flash, cuDNN) and flash-attn-4.

python -m cute_fa bench --prefill --out DIR  writes prefill.json, prefill.md and prefill.png.
Every method runs on the same inputs in one process. Times are the median GPU time per call
(`bench._time_ms`: CUDA events, after warm-up, the GPU kept busy while the host launches:
`SPIN_CYCLES`); TFLOPs/s count the work the masks leave
(4·Sq·Sk·D per head, halved under causal masking of a square, the visible pairs under a
window or a ragged batch).

- small: causal GQA prefill at batch 1-4 (the shapes an inference server prefills), and the
  same kernel on the paper grid's large batches (16k tokens) at the same head_dim, which the
  small shapes are measured against.
- varlen: 16 prompts of 100-4000 tokens packed end to end (~32k tokens): cute_fa.forward_varlen
  and flash-attn-4's flash_attn_varlen_func, SDPA on the same prompts right-padded to the
  longest (causal masking then hides the padding from every real query), and cute_fa's dense
  kernel on a uniform batch of the same token count.
- window: one 32k-token sequence, causal, full and with a 4k sliding window.
- model: a randomly initialised Llama-style model (8 layers, hidden 2048, 16/4 heads, bf16):
  prefill of a 2000-token prompt and per-token greedy decode, per attention implementation.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .bench import _time_ms

SMALL_SHAPES = ((1, 512), (1, 2000), (1, 8192), (2, 1024), (4, 1024), (4, 4096))
SMALL_HEADS = ((32, 8, 128), (64, 8, 128), (32, 8, 64), (64, 8, 64))  # (Hq, Hkv, D)
LARGE_SEQLENS = (1024, 2048, 4096, 8192)  # the paper grid's: batch = 16384 / S, H = 2048 / D
VARLEN_PROMPTS, VARLEN_MIN, VARLEN_MAX = 16, 100, 4000
WINDOW_SEQLEN, WINDOW = 32768, 4096


def _sdpa(torch, backend=None):
    from torch.nn.attention import sdpa_kernel

    F = torch.nn.functional

    def run(q, k, v, causal):
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        gqa = q.shape[2] != k.shape[2]
        if backend is None:
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)
    return run


def _dense_methods(torch) -> dict:
    import cute_fa
    from torch.nn.attention import SDPBackend

    methods = {
        "cute_fa": lambda q, k, v, c: cute_fa.forward(q, k, v, causal=c),
        "cute_fa_sm80": lambda q, k, v, c: cute_fa.forward(q, k, v, causal=c, backend="sm80"),
        "sdpa_default": _sdpa(torch),
        "sdpa_flash": _sdpa(torch, SDPBackend.FLASH_ATTENTION),
        "sdpa_cudnn": _sdpa(torch, SDPBackend.CUDNN_ATTENTION),
    }
    fa4 = _fa4()
    if fa4:
        methods["flash_attn_4"] = lambda q, k, v, c: fa4[0](q, k, v, causal=c)
    if torch.cuda.get_device_capability()[0] == 9:
        # the kernel 'auto' took on Hopper before the wgmma one, and the small-grid A/B: the
        # wgmma kernel with one consumer warpgroup (64-row tiles, twice the CTAs)
        methods["cute_fa_tma"] = lambda q, k, v, c: cute_fa.forward(q, k, v, causal=c,
                                                                    backend="tma")
        methods["cute_fa_sm90_64"] = _sm90_rows64(torch)
    return methods


def _sm90_rows64(torch):
    """fn(q, k, v, causal) of the causal wgmma kernel on a 64 x 128 tile (one consumer
    warpgroup), compiled per head_dim on first use."""
    from .layouts import TileConfig

    by_head_dim = {}

    def fn(q, k, v, c):
        d = q.shape[-1]
        if d not in by_head_dim:
            tile = TileConfig(head_dim=d, block_m=64, block_n=128, num_threads=128,
                              dtype=str(q.dtype).replace("torch.", ""), wgmma=True)
            by_head_dim[d] = _variant(torch, "sm90", True, tile=tile)
        return by_head_dim[d](q, k, v)
    return fn


def _fa4():
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

        return flash_attn_func, flash_attn_varlen_func
    except Exception as exc:  # not installed here: reported, not faked
        print(f"flash-attn-4 not importable: {exc}", file=sys.stderr)
        return None


def _variant(torch, backend: str, causal: bool, *, varlen: bool = False, window=None,
             **changes):
    """A call of one kernel variant the public API does not pick (for the A/B rows): the key
    `forward` would build for `backend`, with its fields `changes` replaced. Returns
    fn(q, k, v[, cu_seqlens, max_seqlen_q]) in forward's (varlen: forward_varlen's) layout."""
    import dataclasses
    import math

    from . import interface
    from .compiler import get_kernel
    from .tuning import kernel_key

    arch = interface._arch(torch.cuda.current_device())
    features = interface._score_features(causal, window or (-1, -1), 0.0)
    cache = {}

    def fn(q, k, v, cu=None, max_seqlen_q=0):
        d = q.shape[-1]
        if d not in cache:
            key = kernel_key(arch, interface._DTYPE_NAMES[q.dtype], d, features.causal, backend,
                             local=features.local, varlen=varlen)
            cache[d] = get_kernel(dataclasses.replace(key, **changes))
        out = torch.empty_like(q)
        if varlen:
            q, k, v, o = q[None], k[None], v[None], out[None]
        else:
            o = out
        held = interface._placeholders(q.get_device())
        interface._launch(q.get_device(), cache[d], interface._arguments(
            q.get_device(), q, k, v, o, held[0], 1 / math.sqrt(d),
            0 if varlen else k.shape[1] - q.shape[1], 0, features, (cu, cu), max_seqlen_q))
        return out
    return fn


def _tflops(flops: float, ms: float | None) -> float | None:
    return flops / ms / 1e9 if ms else None


# GPU cycles (~0.5 ms on the H200) the GPU spins before each timed call, so that the host has
# launched the call by the time the GPU reaches the start event: the events then time the
# kernels, not the host's launch path (tens of µs from Python, for flash-attn-4 more), which
# would otherwise dominate the smallest shapes
SPIN_CYCLES = 1_000_000


def _timed(torch, fns: dict, row: dict, flops: float) -> dict:
    def spin():
        torch.cuda._sleep(SPIN_CYCLES)

    for name, fn in fns.items():
        try:
            ms = _time_ms(torch, fn, before=spin)
            row[name + "_us"] = ms * 1e3
            row[name] = _tflops(flops, ms)
        except Exception as exc:
            row[name] = None
            row[name + "_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return row


def _randn(torch, *shape, gen):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)


def small_results(torch) -> list:
    methods = _dense_methods(torch)
    rows = []
    for hq, hk, d in SMALL_HEADS:
        for b, s in SMALL_SHAPES:
            gen = torch.Generator("cuda").manual_seed(b * s + hq + d)
            q, k, v = _randn(torch, b, s, hq, d, gen=gen), _randn(torch, b, s, hk, d, gen=gen), \
                _randn(torch, b, s, hk, d, gen=gen)
            row = dict(kind="small", batch=b, seqlen=s, heads_q=hq, heads_kv=hk, head_dim=d)
            flops = 2 * b * hq * s * s * d
            rows.append(_timed(torch, {n: (lambda f=f: f(q, k, v, True))
                                       for n, f in methods.items()}, row, flops))
            print(json.dumps(rows[-1]), flush=True)
    for d in sorted({d for _, _, d in SMALL_HEADS}):
        for s in LARGE_SEQLENS:
            b, h = 16384 // s, 2048 // d
            gen = torch.Generator("cuda").manual_seed(s + d)
            q, k, v = (_randn(torch, b, s, h, d, gen=gen) for _ in range(3))
            row = dict(kind="large", batch=b, seqlen=s, heads_q=h, heads_kv=h, head_dim=d)
            fns = {n: (lambda f=methods[n]: f(q, k, v, True))
                   for n in ("cute_fa", "cute_fa_tma", "cute_fa_sm80") if n in methods}
            rows.append(_timed(torch, fns, row, 2 * b * h * s * s * d))
            print(json.dumps(rows[-1]), flush=True)
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
    flops = sum(2 * hq * n * n * d for n in lens)  # causal, per prompt
    # the same prompts right-padded into (B, longest, H, D)
    padded = [torch.zeros(len(lens), longest, h, d, device="cuda", dtype=torch.bfloat16)
              for h in (hq, hk, hk)]
    for i, n in enumerate(lens):
        for dst, src in zip(padded, (q, k, v)):
            dst[i, :n] = src[int(cu[i]):int(cu[i]) + n]
    from torch.nn.attention import SDPBackend

    fns = {"cute_fa": lambda: cute_fa.forward_varlen(q, k, v, cu, cu, longest, longest,
                                                     causal=True),
           "cute_fa_sm80": lambda: cute_fa.forward_varlen(q, k, v, cu, cu, longest, longest,
                                                          causal=True, backend="sm80"),
           "sdpa_default_padded": lambda: _sdpa(torch)(*padded, True),
           "sdpa_flash_padded": lambda: _sdpa(torch, SDPBackend.FLASH_ATTENTION)(*padded, True),
           "sdpa_cudnn_padded": lambda: _sdpa(torch, SDPBackend.CUDNN_ATTENTION)(*padded, True)}
    if torch.cuda.get_device_capability()[0] >= 9:
        fns["cute_fa_tma"] = lambda: cute_fa.forward_varlen(q, k, v, cu, cu, longest, longest,
                                                            causal=True, backend="tma")
    fa4 = _fa4()
    if fa4:
        fns["flash_attn_4"] = lambda: fa4[1](q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                             max_seqlen_q=longest, max_seqlen_k=longest,
                                             causal=True)
    row = dict(kind="varlen", prompts=len(lens), tokens=total, longest=longest, lengths=lens,
               heads_q=hq, heads_kv=hk, head_dim=d)
    rows = [_timed(torch, fns, row, flops)]
    print(json.dumps(rows[-1]), flush=True)
    # cute_fa's dense kernel on a uniform batch of the same token count (the varlen target)
    s = 2048
    b = total // s
    qd, kd, vd = _randn(torch, b, s, hq, d, gen=gen), _randn(torch, b, s, hk, d, gen=gen), \
        _randn(torch, b, s, hk, d, gen=gen)
    dense = dict(kind="varlen_dense", batch=b, seqlen=s, heads_q=hq, heads_kv=hk, head_dim=d)
    rows.append(_timed(torch, {"cute_fa": lambda: cute_fa.forward(qd, kd, vd, causal=True),
                               "cute_fa_sm80": lambda: cute_fa.forward(qd, kd, vd, causal=True,
                                                                       backend="sm80")},
                       dense, 2 * b * hq * s * s * d))
    print(json.dumps(rows[-1]), flush=True)
    return rows


def _window_pairs(s: int, left: int) -> int:
    """(query, key) pairs a causal window of `left` keys back leaves in an s x s square."""
    return sum(min(i, left) + 1 for i in range(s))


def window_results(torch) -> list:
    import cute_fa

    hq, hk, d, s = 32, 8, 128, WINDOW_SEQLEN
    gen = torch.Generator("cuda").manual_seed(2)
    q, k, v = _randn(torch, 1, s, hq, d, gen=gen), _randn(torch, 1, s, hk, d, gen=gen), \
        _randn(torch, 1, s, hk, d, gen=gen)
    fa4 = _fa4()
    rows = []
    for window in (None, WINDOW):
        size = (-1, -1) if window is None else (window - 1, 0)  # window keys, itself included
        pairs = s * (s + 1) // 2 if window is None else _window_pairs(s, window - 1)
        fns = {"cute_fa": lambda size=size: cute_fa.forward(q, k, v, causal=True,
                                                            window_size=size),
               "cute_fa_sm80": lambda size=size: cute_fa.forward(q, k, v, causal=True,
                                                                 window_size=size,
                                                                 backend="sm80")}
        if fa4:
            fns["flash_attn_4"] = lambda size=size: fa4[0](q, k, v, causal=True,
                                                           window_size=size)
        if window is None:
            fns["sdpa_default"] = lambda: _sdpa(torch)(q, k, v, True)
        row = dict(kind="window", seqlen=s, window=window, heads_q=hq, heads_kv=hk, head_dim=d)
        rows.append(_timed(torch, fns, row, 4 * hq * pairs * d))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def model_results(torch, prompt: int = 2000, new_tokens: int = 32) -> list:
    """Prefill and per-token decode of a random-init Llama-style model, per attention
    implementation available here."""
    try:
        import transformers
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
    rows = {}
    # two rounds over the implementations, the faster of each one's two medians kept: the
    # first implementation timed would otherwise also pay for the GPU's clocks ramping up
    for _ in range(2):
        for impl in ("sdpa", "cute_fa", "flash_attention_4", "eager", "flash_attention_2"):
            row = rows.setdefault(impl, dict(kind="model", impl=impl, prompt=prompt,
                                             new_tokens=new_tokens,
                                             transformers=transformers.__version__))
            if "error" in row:
                continue
            try:
                model.set_attn_implementation(impl)
                with torch.no_grad():
                    prefill = _time_ms(torch, lambda: model(ids), warmup=3, reps=10)

                    def generate(n):
                        model.generate(ids, max_new_tokens=n, min_new_tokens=n,
                                       do_sample=False)

                    # a step: generating new_tokens + 1 tokens less generating 1 (the prefill
                    # and generate()'s fixed costs), median of 5 each
                    one = _time_ms(torch, lambda: generate(1), warmup=2, reps=5, warmup_s=0)
                    many = _time_ms(torch, lambda: generate(new_tokens + 1), warmup=1, reps=5,
                                    warmup_s=0)
                step = (many - one) / new_tokens
                row["prefill_ms"] = min(prefill, row.get("prefill_ms", prefill))
                row["decode_ms_per_token"] = min(step, row.get("decode_ms_per_token", step))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:200]
            print(json.dumps(row), flush=True)
    return list(rows.values())


def prefill_markdown(result: dict) -> str:
    rows = result["rows"]
    lines = [f"# cute_fa prefill as clients send it, {result['device']}, {result['date']}", "",
             f"torch {result['torch']}, nvidia-cutlass-dsl {result['cutlass_dsl']}, bf16. "
             "TFLOPs/s of the work the mask leaves (median GPU time per call after warm-up; µs "
             "in the json). cute_fa is backend='auto'.", ""]
    if result.get("note"):
        lines += [f"Note: {result['note']}.", ""]
    small = [r for r in rows if r["kind"] == "small"]
    large = {}
    for r in rows:
        if r["kind"] == "large" and r.get("cute_fa"):
            large.setdefault(r["head_dim"], []).append(r["cute_fa"])
    names = [n for n in ("cute_fa", "cute_fa_sm90_64", "cute_fa_tma", "cute_fa_sm80",
                         "cute_fa_nolpt", "cute_fa_sm80_nolpt", "sdpa_default", "sdpa_flash",
                         "sdpa_cudnn", "flash_attn_4")
             if any(n in r for r in small)]
    lines += ["## Small-batch causal prefill (GQA)", "",
              "large: cute_fa's mean TFLOPs/s over the paper grid's large batches (16k tokens, "
              "S = 1k-8k, hidden 2048) at the same head_dim, causal.", "",
              "| B | S | Hq/Hkv | D | " + " | ".join(names)
              + " | cute_fa / large | cute_fa / sdpa_flash | cute_fa / sdpa_cudnn "
              "| cute_fa / best other |",
              "|" + "---|" * (len(names) + 8)]
    for r in small:
        ref = sum(large.get(r["head_dim"], [0])) / max(1, len(large.get(r["head_dim"], [])))
        others = [r.get(n) for n in ("sdpa_default", "sdpa_flash", "sdpa_cudnn", "flash_attn_4")
                  if r.get(n)]
        cf = r.get("cute_fa")
        cells = [f"{r[n]:.0f}" if r.get(n) else "—" for n in names]
        cells.append(f"{cf / ref:.2f}" if cf and ref else "—")
        cells.append(f"{cf / r['sdpa_flash']:.2f}x" if cf and r.get("sdpa_flash") else "—")
        cells.append(f"{cf / r['sdpa_cudnn']:.2f}x" if cf and r.get("sdpa_cudnn") else "—")
        cells.append(f"{cf / max(others):.2f}x" if cf and others else "—")
        lines.append(f"| {r['batch']} | {r['seqlen']} | {r['heads_q']}/{r['heads_kv']} | "
                     f"{r['head_dim']} | " + " | ".join(cells) + " |")
    lines += ["", "Large batches (the reference): "
              + "; ".join(f"D={d}: " + ", ".join(f"{x:.0f}" for x in v) + f" (mean "
                          f"{sum(v) / len(v):.0f})" for d, v in sorted(large.items())), ""]
    for kind, title in (("varlen", "Ragged batch"), ("varlen_dense", "Dense kernel, same tokens"),
                        ("window", "Sliding window")):
        sel = [r for r in rows if r["kind"] == kind]
        if not sel:
            continue
        lines += [f"## {title}", ""]
        for r in sel:
            desc = {k: r[k] for k in ("prompts", "tokens", "longest", "batch", "seqlen", "window",
                                      "heads_q", "heads_kv", "head_dim") if k in r}
            lines.append(f"- {desc}: " + ", ".join(
                f"{n} {r[n]:.0f} TFLOPs/s ({r[n + '_us']:.0f} µs)" for n in r
                if n + "_us" in r and r.get(n)))
            errors = [f"{n[:-6]}: {r[n]}" for n in r if n.endswith("_error")]
            if errors:
                lines.append("  - not run: " + "; ".join(errors))
        lines.append("")
    model = [r for r in rows if r["kind"] == "model"]
    if model:
        lines += ["## HF transformers model (random-init Llama, 8 layers, hidden 2048, "
                  "16/4 heads, bf16)", "",
                  "| attn_implementation | prefill of 2000 tokens, ms | decode, ms per token |",
                  "|---|---|---|"]
        for r in model:
            if "error" in r:
                lines.append(f"| {r['impl']} | not run: {r['error']} | |")
            else:
                lines.append(f"| {r['impl']} | {r['prefill_ms']:.2f} | "
                             f"{r['decode_ms_per_token']:.2f} |")
    return "\n".join(lines) + "\n"


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    small = [r for r in result["rows"] if r["kind"] == "small"]
    names = [n for n in ("cute_fa", "sdpa_flash", "sdpa_cudnn", "flash_attn_4")
             if any(r.get(n) for r in small)]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        ax.bar([j + i * width for j in range(len(small))], [r.get(n) or 0 for r in small],
               width, label=n)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(small))])
    ax.set_xticklabels([f"B{r['batch']} S{r['seqlen']}\n{r['heads_q']}/{r['heads_kv']} "
                        f"D{r['head_dim']}" for r in small], fontsize=6)
    ax.set_ylabel("TFLOPs/s")
    ax.axhline(989, color="gray", lw=0.8, ls="--")  # dense bf16 peak (H100/H200 SXM datasheet)
    ax.text(0, 960, "bf16 dense peak (989)", fontsize=7, color="gray")
    ax.legend(fontsize=7)
    ax.set_title(f"Small-batch causal prefill, {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def prefill_main(out_dir: str, parts=("small", "varlen", "window", "model")) -> dict:
    import torch

    from .compiler import dsl_version

    result = dict(device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"),
                  torch=torch.__version__, cutlass_dsl=dsl_version(), rows=[])
    runs = {"small": small_results, "varlen": varlen_results, "window": window_results,
            "model": model_results}
    for part in parts:
        result["rows"] += runs[part](torch)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prefill.json").write_text(json.dumps(result, indent=1))
    (out / "prefill.md").write_text(prefill_markdown(result))
    if any(r["kind"] == "small" for r in result["rows"]):
        _plot(result, out / "prefill.png")
    print((out / "prefill.md").read_text())
    return result
