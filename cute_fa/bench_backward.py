"""Backward-pass benchmark: cute_fa's backward next to torch SDPA (flash, cuDNN) and
flash-attn-4's, on the forward benchmark's grid and on training shapes.

python -m cute_fa bench --backward --out docs/perf/<date>  writes backward.json, backward.md and
backward.png. For each shape every method runs on the same inputs in one process:

- backward only, TFLOPs/s with FLOPs = 2.5 x the forward's (five GEMMs against two): cute_fa
  (`cute_fa.backward`, default and deterministic), SDPA flash and cuDNN and flash-attn-4
  (autograd.grad of their output, the graph kept);
- forward + backward (one training step's attention), TFLOPs/s with 3.5 x the forward's FLOPs.

Each timed call starts behind a GPU spin (`bench_prefill._timed`), so the events time the GPU's
work, not the host's launch path (Python's argument checks, the autograd engine).

The grid: 16k tokens per batch, hidden 2048, head_dim 64 and 128, seqlen 1k-16k, causal and not
(bf16); the training shapes: GQA (32 query heads, 8 K/V heads, head_dim 128) at batch 1-4 and a
ragged batch (cute_fa and flash-attn-4 only, which take one).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .bench import HEAD_DIMS, HIDDEN, SEQLENS, TOKENS, _flops, per_call_us
from .bench_prefill import _fa4, _timed

# the H200's dense bf16 tensor-core peak (NVIDIA's datasheet figure, TFLOPs/s), drawn as the
# plot's roofline
H200_BF16_PEAK_TFLOPS = 989


def _methods(torch, q, k, v, dout, causal):
    """name -> (backward-only callable, forward+backward callable), on these inputs."""
    import cute_fa
    from cute_fa.backward import backward
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, lse = cute_fa.forward(q, k, v, causal=causal, return_lse=True)

    def cute_step(det):
        def step():
            o = cute_fa.forward(*leaves, causal=causal, deterministic=det)
            return torch.autograd.grad(o, leaves, dout)
        return step

    methods = {
        "cute_fa": (lambda: backward(dout, q, k, v, out, lse, causal), cute_step(False)),
        "cute_fa_det": (lambda: backward(dout, q, k, v, out, lse, causal, deterministic=True),
                        cute_step(True)),
    }
    lt = [t.transpose(1, 2) for t in leaves]
    dout_t = dout.transpose(1, 2)
    for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                          ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(*lt, is_causal=causal,
                                                      enable_gqa=q.shape[2] != k.shape[2])
        methods[name] = _autograd_pair(torch, sdpa, leaves, dout_t)
    fa4 = _fa4()
    if fa4 is not None:
        methods["flash_attn_4"] = _autograd_pair(torch, lambda: fa4[0](*leaves, causal=causal),
                                                 leaves, dout)
    return methods


def _autograd_pair(torch, forward, leaves, dout) -> tuple:
    """(backward only, forward + backward) of a peer's autograd function `forward()` (its
    output, or a tuple whose first item is it). Where `forward` fails, both raise its error
    when timed, so that the row reports it (not faked)."""
    def fwd():
        o = forward()
        return o[0] if isinstance(o, tuple) else o
    try:
        o = fwd()
    except Exception as exc:
        def failed():
            raise exc
        return failed, failed
    return (lambda: torch.autograd.grad(o, leaves, dout, retain_graph=True),
            lambda: torch.autograd.grad(fwd(), leaves, dout))


def _time_into(torch, row: dict, methods: dict, flops_fwd: float) -> dict:
    """Each method's backward (2.5x the forward's FLOPs) and forward + backward (3.5x), timed
    as the prefill benchmark times its calls (`bench_prefill._timed`: behind a GPU spin)."""
    _timed(torch, {name: bwd for name, (bwd, _) in methods.items()}, row, 2.5 * flops_fwd)
    return _timed(torch, {name + "_step": step for name, (_, step) in methods.items()}, row,
                  3.5 * flops_fwd)


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
                row = dict(kind="grid", head_dim=head_dim, causal=causal, seqlen=seqlen,
                           batch=batch, heads=heads, heads_kv=heads)
                _time_into(torch, row, _methods(torch, q, k, v, dout, causal),
                           _flops(batch, heads, seqlen, head_dim, causal))
                rows.append(row)
                print(json.dumps(row), flush=True)
                del q, k, v, dout
    return rows


def training_results(torch) -> list:
    """GQA training shapes: 32 query heads over 8 K/V heads, head_dim 128, causal."""
    rows = []
    for batch, seqlen in ((1, 2048), (1, 4096), (2, 4096), (4, 2048), (1, 8192)):
        gen = torch.Generator(device="cuda").manual_seed(seqlen + batch)
        q, dout = (torch.randn(batch, seqlen, 32, 128, device="cuda", dtype=torch.bfloat16,
                               generator=gen) for _ in range(2))
        k, v = (torch.randn(batch, seqlen, 8, 128, device="cuda", dtype=torch.bfloat16,
                            generator=gen) for _ in range(2))
        row = dict(kind="gqa", head_dim=128, causal=True, seqlen=seqlen, batch=batch, heads=32,
                   heads_kv=8)
        _time_into(torch, row, _methods(torch, q, k, v, dout, True),
                   _flops(batch, 32, seqlen, 128, True))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def varlen_results(torch) -> list:
    """A ragged batch of 16 sequences of 256-4096 tokens (32k in all), GQA 32/8, causal:
    cute_fa's and flash-attn-4's varlen backward (SDPA takes no ragged batch)."""
    import cute_fa
    from cute_fa.backward import backward_varlen

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
    methods = {"cute_fa": (
        lambda: backward_varlen(dout, q, k, v, out, lse, cu, cu, max_len, max_len, True),
        lambda: torch.autograd.grad(cute_fa.forward_varlen(*leaves, cu, cu, max_len, max_len,
                                                           causal=True), leaves, dout))}
    fa4 = _fa4()
    if fa4 is not None:
        methods["flash_attn_4"] = _autograd_pair(
            torch, lambda: fa4[1](*leaves, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                  max_seqlen_q=max_len, max_seqlen_k=max_len, causal=True),
            leaves, dout)
    flops = sum(_flops(1, 32, n, 128, True) for n in lens)
    row = dict(kind="varlen", head_dim=128, causal=True, seqlen=max_len, batch=16, heads=32,
               heads_kv=8, tokens=total)
    _time_into(torch, row, methods, flops)
    print(json.dumps(row), flush=True)
    return [row]


def small_calls(torch, calls=2000) -> dict:
    """End-to-end µs of one small forward call from Python (B=1, H=16, S=128, D=128, back to
    back, so host time shows): without grad (no dispatcher), through the custom op (inputs
    that require grad; the forward alone), and torch SDPA's default."""
    import cute_fa

    q, k, v = (torch.randn(1, 128, 16, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    fns = {"cute_fa": lambda: cute_fa.forward(q, k, v),
           "cute_fa_requires_grad": lambda: cute_fa.forward(qg, kg, vg),
           "sdpa_default": lambda: torch.nn.functional.scaled_dot_product_attention(
               q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))}
    out = per_call_us(torch, fns, calls)
    print(json.dumps(out), flush=True)
    return out


PEERS = ("sdpa_flash", "sdpa_cudnn", "flash_attn_4")


def _fmt(x, spec=".0f") -> str:
    return "—" if x is None else format(x, spec)


def _ratio(a, b):
    return a / b if a and b else None


def backward_markdown(result: dict) -> str:
    lines = [f"# Backward pass, {result['device']}, {result['date']}", "",
             f"torch {result['torch']}, nvidia-cutlass-dsl {result['cutlass_dsl']}, "
             f"flash-attn-4 {result.get('flash_attn_4')}. bf16. TFLOPs/s, backward only "
             "(2.5x the forward's FLOPs) and forward + backward (3.5x). `det`: "
             "deterministic=True. Ratios: cute_fa over each peer.", "",
             "| shape | causal | cute_fa | det | SDPA flash | SDPA cuDNN | FA4 | vs flash | "
             "vs cuDNN | vs FA4 | det/default | fwd+bwd cute_fa | flash | cuDNN | FA4 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        shape = (f"{r['kind']} B{r['batch']} S{r['seqlen']} H{r['heads']}/{r['heads_kv']} "
                 f"D{r['head_dim']}")
        c = r.get("cute_fa")
        lines.append("| " + " | ".join([
            shape, "yes" if r["causal"] else "no", _fmt(c), _fmt(r.get("cute_fa_det"))]
            + [_fmt(r.get(p)) for p in PEERS]
            + [_fmt(_ratio(c, r.get(p)), ".2f") for p in PEERS]
            + [_fmt(_ratio(r.get("cute_fa_det"), c), ".2f"), _fmt(r.get("cute_fa_step"))]
            + [_fmt(r.get(p + "_step")) for p in PEERS]) + " |")
    if "small_call_us" in result:
        lines += ["", "Small forward call (B=1, H=16, S=128, D=128), µs from Python: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in result["small_call_us"].items())]
    grid = [r for r in result["rows"] if r["kind"] == "grid" and r.get("cute_fa")]
    flash = [_ratio(r["cute_fa"], r.get("sdpa_flash")) for r in grid]
    flash = [x for x in flash if x]
    det = [_ratio(r.get("cute_fa_det"), r["cute_fa"]) for r in grid]
    det = [x for x in det if x]
    if flash:
        lines += ["", f"Grid: cute_fa / SDPA flash {min(flash):.2f}x-{max(flash):.2f}x "
                      f"(target >= 1.15x on every shape: met on "
                      f"{sum(x >= 1.15 for x in flash)} of {len(flash)}); deterministic / "
                      f"default {min(det):.2f}-{max(det):.2f} (target >= 0.85: met on "
                      f"{sum(x >= 0.85 for x in det)} of {len(det)})."]
    return "\n".join(lines) + "\n"


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [r for r in result["rows"] if r["kind"] == "grid"]
    panels = sorted({(r["head_dim"], r["causal"]) for r in grid})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), sharey=True)
    for ax, (hd, causal) in zip(axes, panels):
        rows = sorted((r for r in grid if (r["head_dim"], r["causal"]) == (hd, causal)),
                      key=lambda r: r["seqlen"])
        xs = [r["seqlen"] for r in rows]
        for name in ("cute_fa", "cute_fa_det") + PEERS:
            ys = [r.get(name) for r in rows]
            if any(ys):
                ax.plot(xs, [y or float("nan") for y in ys], marker="o", label=name)
        if "H200" in result["device"]:
            ax.axhline(H200_BF16_PEAK_TFLOPS, color="grey", ls="--", lw=1)
            ax.text(xs[0], H200_BF16_PEAK_TFLOPS - 45, "H200 dense bf16 tensor-core peak",
                    fontsize=7, color="grey")
        ax.set_ylim(0, 1050)
        ax.set_xscale("log", base=2)
        ax.set_title(f"head_dim {hd}, {'causal' if causal else 'non-causal'}", fontsize=9)
        ax.set_xlabel("seqlen")
    axes[0].set_ylabel("backward TFLOPs/s (bf16)")
    axes[-1].legend(fontsize=7)
    fig.suptitle(f"Backward, {result['device']}, {result['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def backward_main(out_dir: str, quick: bool = False) -> dict:
    import torch

    from .bench import _package_version
    from .compiler import dsl_version

    result = dict(device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"),
                  torch=torch.__version__, cutlass_dsl=dsl_version(),
                  flash_attn_4=_package_version("flash-attn-4"), rows=[])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = [lambda: grid_results(torch, seqlens=(1024, 8192) if quick else SEQLENS)]
    if not quick:
        parts += [lambda: training_results(torch), lambda: varlen_results(torch)]
    for part in parts:  # each part's rows are on disk before the next starts
        result["rows"] += part()
        (out / "backward.json").write_text(json.dumps(result, indent=1))
    result["small_call_us"] = small_calls(torch)
    (out / "backward.json").write_text(json.dumps(result, indent=1))
    (out / "backward.md").write_text(backward_markdown(result))
    _plot(result, out / "backward.png")
    print((out / "backward.md").read_text())
    return result
