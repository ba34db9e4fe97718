"""Forward-pass benchmark: cute_fa next to torch SDPA (default, flash, cuDNN) and flash-attn-4.

python -m cute_fa bench --out docs/perf/<date>  writes results.json, results.md and
results.png there. Shapes follow the FlashAttention papers: 16k tokens per batch
(batch = 16384 / seqlen), hidden 2048 (heads = 2048 / head_dim), head_dim 64 and 128,
seqlen 1k..16k, causal and not. Every method runs on the same inputs in one process.
Also: the latency of a small call, and the first call of a new process (cold and warm
disk cache) for one configuration per head_dim class.

python -m cute_fa bench --decode --out <folder>  runs the decode benchmark instead (Sq 1 and 4
against dense and paged KV caches; decode.json, decode.md and decode.png): see `decode_main`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEQLENS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
LARGE_HEAD_DIMS = (192, 256)
TOKENS, HIDDEN = 16384, 2048


def _methods(torch):
    import cute_fa

    F = torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa_with(backend):
        def run(q, k, v, causal):
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            if backend is None:
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        return run

    methods = {
        "cute_fa": lambda q, k, v, causal: cute_fa.forward(q, k, v, causal=causal),
        "cute_fa_sm80": lambda q, k, v, causal: cute_fa.forward(q, k, v, causal=causal,
                                                                backend="sm80"),
        "sdpa_default": sdpa_with(None),
        "sdpa_flash": sdpa_with(SDPBackend.FLASH_ATTENTION),
        "sdpa_cudnn": sdpa_with(SDPBackend.CUDNN_ATTENTION),
    }
    if torch.cuda.get_device_capability()[0] >= 9:
        methods["cute_fa_tma"] = lambda q, k, v, causal: cute_fa.forward(q, k, v, causal=causal,
                                                                         backend="tma")
    try:
        from flash_attn.cute import flash_attn_func

        methods["flash_attn_4"] = lambda q, k, v, causal: flash_attn_func(q, k, v, causal=causal)
    except Exception as exc:  # not installed here: reported, not faked
        print(f"flash-attn-4 not importable: {exc}", file=sys.stderr)
    return methods


def _time_ms(torch, fn, warmup=5, reps=20, warmup_s=0.2, before=None) -> float:
    # warm up for at least `warmup_s` of GPU work too: with 5 calls only, whichever method was
    # timed first on a new short shape read up to 12% slower than the same kernel timed later.
    # `before`, if given, is enqueued ahead of each timed call, outside the events (the decode
    # benchmark flushes the L2 and keeps the GPU busy there while the host launches the call)
    t0 = time.perf_counter()
    n = 0
    while n < warmup or time.perf_counter() - t0 < warmup_s:
        fn()
        n += 1
        if n % 10 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if before is not None:
            before()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _flops(batch, heads, seqlen, head_dim, causal) -> float:
    f = 4 * batch * heads * seqlen * seqlen * head_dim
    return f / 2 if causal else f


def grid_results(torch, dtypes=("bfloat16", "float16"), seqlens=SEQLENS, head_dims=HEAD_DIMS):
    methods = _methods(torch)
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
                    row = dict(dtype=dtype, head_dim=head_dim, causal=causal, seqlen=seqlen,
                               batch=batch, heads=heads)
                    for name, fn in methods.items():
                        try:
                            ms = _time_ms(torch, lambda: fn(q, k, v, causal))
                            row[name] = _flops(batch, heads, seqlen, head_dim, causal) / ms / 1e9
                        except Exception as exc:
                            row[name] = None
                            row[name + "_error"] = f"{type(exc).__name__}: {exc}"[:200]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    del q, k, v
    return rows


def small_call_us(torch, calls=2000) -> dict:
    """End-to-end time of one small call from Python, B=1, H=16, S=128, D=128."""
    import cute_fa

    q, k, v = (torch.randn(1, 128, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fns = {"cute_fa": lambda: cute_fa.forward(q, k, v),
           "cute_fa_sm80": lambda: cute_fa.forward(q, k, v, backend="sm80"),
           "sdpa_default": lambda: torch.nn.functional.scaled_dot_product_attention(
               q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))}
    if torch.cuda.get_device_capability()[0] >= 9:
        fns["cute_fa_tma"] = lambda: cute_fa.forward(q, k, v, backend="tma")
    try:
        from flash_attn.cute import flash_attn_func

        fns["flash_attn_4"] = lambda: flash_attn_func(q, k, v)
    except Exception:
        pass
    return per_call_us(torch, fns, calls)


def per_call_us(torch, fns: dict, calls: int = 2000) -> dict:
    """µs per call of each of fns, called back to back from Python (after 50 warm-up calls):
    the host's cost where the kernels are shorter than it."""
    out = {}
    for name, fn in fns.items():
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out[name] = (time.perf_counter() - t) / calls * 1e6
    return out


_PROBE = """
import time, sys
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import cute_fa
q, k, v = (torch.randn(1, 128, 16, {d}, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o = cute_fa.forward(q, k, v, causal={causal})
torch.cuda.synchronize()
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


# one first-call probe per head_dim class (each compiles a different kernel)
START_CONFIGS = ((64, True), (128, False), (192, True), (256, False))


def start_times(head_dim=128, causal=False) -> dict:
    """First call in a new process, with a cold and then a warm on-disk cache (seconds).

    `after_torch` counts from after `import torch` (what cute_fa adds) to the first result.
    """
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, CUTE_FA_CACHE_DIR=cache)
        code = _PROBE.format(d=head_dim, causal=causal)
        for label in ("cold_cache", "warm_cache"):
            t = time.perf_counter()
            res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, check=True)
            total = time.perf_counter() - t
            torch_import, after_torch = (float(x) for x in res.stdout.split())
            out[label] = dict(process_total=total, import_torch=torch_import,
                              after_torch=after_torch)
    return out


def write_report(result: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(result, indent=1))
    rows = result["grid"]
    names = [n for n in ("cute_fa", "cute_fa_sm80", "cute_fa_tma", "cute_fa_tma_eager",
                         "sdpa_default", "sdpa_flash", "sdpa_cudnn", "flash_attn_4")
             if any(n in r for r in rows)]
    # best_peer: the faster of cuDNN and flash-attn-4, the Hopper kernel's target
    rows = [dict(r, best_peer=max((r[n] for n in ("sdpa_cudnn", "flash_attn_4") if r.get(n)),
                                  default=None)) for r in rows]
    ratios = [(a, b) for a, b in (("cute_fa", "best_peer"), ("cute_fa", "sdpa_flash"),
                                  ("cute_fa", "cute_fa_tma"), ("cute_fa_tma", "cute_fa_sm80"),
                                  ("cute_fa_tma", "cute_fa_tma_eager"))
              if a in names and (b in names or any(r.get(b) for r in rows))]
    lines = [f"# cute_fa forward, {result['device']}, {result['date']}", "",
             f"torch {result['torch']}, nvidia-cutlass-dsl {result['cutlass_dsl']}. "
             "TFLOPs/s (forward FLOPs = 4·B·H·S²·D, halved when causal); median of 20 runs "
             "after at least 5 warm-up calls and 0.2 s; batch·seqlen = 16384, "
             "heads·head_dim = 2048.", "",
             "cute_fa is backend='auto' (on Hopper the wgmma kernel, backend='sm90', but for "
             "causal calls at head_dim 64 with at most 2048 queries: the TMA kernel); "
             "best_peer is the faster of sdpa_cudnn and flash_attn_4.", "",
             "| dtype | D | causal | S | " + " | ".join(names) + " | "
             + " | ".join(f"{a} / {b}" for a, b in ratios) + " |",
             "|" + "---|" * (len(names) + len(ratios) + 4)]
    for r in rows:
        vals = [f"{r[n]:.0f}" if r.get(n) else "—" for n in names]
        vals += [f"{r[a] / r[b]:.2f}x" if r.get(a) and r.get(b) else "—" for a, b in ratios]
        lines.append(f"| {r['dtype']} | {r['head_dim']} | {r['causal']} | {r['seqlen']} | "
                     + " | ".join(vals) + " |")
    lines += ["", "Small call (B=1, H=16, S=128, D=128, bf16), µs per call from Python:", ""]
    lines += [f"- {k}: {v:.1f} µs" for k, v in result["small_call_us"].items()]
    lines += ["", "New process, first result (B=1, H=16, S=128, bf16), seconds after `import "
              "torch` (in brackets: the whole process):", "",
              "| head_dim | causal | cold cache (compiles) | warm disk cache |", "|---|---|---|---|"]
    for v in result["start"]:
        cold, warm = v["cold_cache"], v["warm_cache"]
        lines.append(f"| {v['head_dim']} | {v['causal']} | {cold['after_torch']:.2f} s "
                     f"({cold['process_total']:.2f} s) | {warm['after_torch']:.2f} s "
                     f"({warm['process_total']:.2f} s) |")
    (out_dir / "results.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    combos = sorted({(r["dtype"], r["head_dim"], r["causal"]) for r in rows})
    ncols = max(1, -(-len(combos) // 2))
    fig, axes = plt.subplots(2, ncols, figsize=(4.2 * ncols, 7), squeeze=False)
    for ax in axes.ravel()[len(combos):]:
        ax.set_visible(False)
    for ax, (dtype, d, causal) in zip(axes.ravel(), combos):
        sel = [r for r in rows if (r["dtype"], r["head_dim"], r["causal"]) == (dtype, d, causal)]
        x = [r["seqlen"] for r in sel]
        for n in names:
            ax.plot(x, [r.get(n) or float("nan") for r in sel], marker="o", label=n)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dtype} D={d} {'causal' if causal else 'full'}")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOPs/s")
    axes.ravel()[0].legend(fontsize=7)
    fig.suptitle(f"cute_fa forward on {result['device']}")
    fig.tight_layout()
    fig.savefig(out_dir / "results.png", dpi=110)


def main(out_dir: str, quick: bool = False) -> dict:
    import torch

    from .compiler import dsl_version

    seqlens = (1024, 8192) if quick else SEQLENS
    result = dict(device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"),
                  torch=torch.__version__, cutlass_dsl=dsl_version())
    configs = START_CONFIGS[1:2] if quick else START_CONFIGS
    result["start"] = [dict(head_dim=d, causal=c, **start_times(d, c)) for d, c in configs]
    result["grid"] = grid_results(torch, seqlens=seqlens)
    if not quick:  # the larger head_dims, one dtype
        result["grid"] += grid_results(torch, dtypes=("bfloat16",), seqlens=(1024, 4096, 16384),
                                       head_dims=LARGE_HEAD_DIMS)
    result["small_call_us"] = small_call_us(torch)
    write_report(result, Path(out_dir))
    print((Path(out_dir) / "results.md").read_text())
    return result


# ---------------------------------------------------------------------------------------------
# Decode: a few new queries per sequence against a long KV cache (issue 14).
#
# python -m cute_fa bench --decode --out DIR  writes decode.json, decode.md and decode.png.
# Every method runs on the same inputs in one process: cute_fa.forward (dense and paged), torch
# SDPA (its default backend choice) and flash-attn-4 (dense, and paged through its page_table
# argument). The numbers are GPU time per call with a cold L2 and the host's launch overhead
# hidden (see _DecodeTimer), and the bandwidth that time gives for reading K and V once.
# ---------------------------------------------------------------------------------------------

DECODE_BATCHES = (1, 8, 32, 64)
DECODE_SEQLENS_K = (2048, 8192, 32768, 131072)
DECODE_SEQLENS_Q = (1, 4)
DECODE_HEADS = ((32, 8), (64, 8), (16, 16))  # (query heads, KV heads): GQA 4, GQA 8, MHA
DECODE_HEAD_DIMS = (64, 128)
LARGE_HEAD_DIMS = (192, 256)
DECODE_PAGE_SIZES = (64, 256)
DECODE_DTYPE = "bfloat16"
# Shapes whose K/V would pass this are skipped: the one cache buffer (K and V of the largest
# shape kept, 34 GB) plus the flush buffer and outputs stay far below the H200's 141 GB, and
# below the ~60 GB the benchmark allows itself.
DECODE_MAX_KV_BYTES = 40e9
# A run that has taken this long skips the shapes left (listed in the report as such), so the
# report is always written within the device tool's 10-minute command limit.
DECODE_TIME_BUDGET_S = 330.0

# HBM bandwidth by the vendor's datasheet, TB/s, for the roofline line of the plot; looked up
# by a substring of torch.cuda.get_device_name(), first match wins (GH200 first: its "H200"
# substring is not the H200's memory; its bandwidth depends on the memory variant, so none).
HBM_PEAK_TBPS = (
    ("GH200", None),
    ("H200", 4.8),               # H200 SXM and NVL: 141 GB HBM3e
    ("H100 NVL", 3.9),
    ("H100 PCIe", 2.0),
    ("H100", 3.35),              # H100 SXM ("NVIDIA H100 80GB HBM3")
    ("A100-SXM4-80GB", 2.039),
    ("A100 80GB PCIe", 1.935),
    ("A100", 1.555),             # the 40 GB parts, SXM4 and PCIe
)


def hbm_peak_tbps(device_name: str) -> float | None:
    """The datasheet HBM bandwidth of the named GPU in TB/s, or None for one not listed."""
    for key, tbps in HBM_PEAK_TBPS:
        if key in device_name:
            return tbps
    return None


def kv_bytes(batch: int, seqlen_k: int, heads_kv: int, head_dim: int, elem_bytes: int = 2) -> int:
    """Bytes of K and V a decode call must read: every one of the B·Sk keys, K and V."""
    return batch * seqlen_k * heads_kv * head_dim * elem_bytes * 2


def decode_shapes(quick: bool = False, max_kv_bytes: float = DECODE_MAX_KV_BYTES):
    """(kept, skipped): dicts of batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim.

    Ordered by (head_dim, heads), then Sq, B, Sk: each kernel configuration is compiled once,
    at its first shape, and neighbouring rows of the report differ in one number.
    """
    if quick:  # one GQA configuration, a small and a large cache: a smoke test of the whole path
        batches, seqlens_k, heads, head_dims = (1, 32), (8192, 131072), ((32, 8),), (128,)
    else:
        batches, seqlens_k = DECODE_BATCHES, DECODE_SEQLENS_K
        heads, head_dims = DECODE_HEADS, DECODE_HEAD_DIMS
    kept, skipped = [], []
    for d in head_dims:
        for hq, hk in heads:
            for sq in DECODE_SEQLENS_Q:
                for b in batches:
                    for sk in seqlens_k:
                        shape = dict(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hk,
                                     head_dim=d, kv_bytes=kv_bytes(b, sk, hk, d))
                        (kept if shape["kv_bytes"] <= max_kv_bytes else skipped).append(shape)
    return kept, skipped


def _decode_methods(torch):
    """({name: fn(q, k, v) -> o} for the dense cache, {name: fn(q, k_pages, v_pages,
    page_table, seqused_k) -> o} for the paged one, SDPA's second way of taking Sq > 1);
    causal (bottom-right) throughout."""
    import cute_fa

    F = torch.nn.functional
    from torch.nn.attention.bias import causal_lower_right

    def sdpa(q, k, v):
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        sq, sk = q.shape[1], k.shape[1]
        gqa = q.shape[2] != k.shape[2]
        if sq == 1:
            # one query sees every key under bottom-right causal: no mask is the same thing
            # (torch's is_causal=True is top-left, which would leave it key 0 only)
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=gqa).transpose(1, 2)
        # torch's own lower-right causal bias: it dispatches to the flash kernel's bottom-right
        # flag where it can, instead of materialising a (Sq, Sk) mask
        return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=causal_lower_right(sq, sk),
                                              enable_gqa=gqa).transpose(1, 2)

    masks: dict = {}

    def sdpa_bool_mask(q, k, v):
        # the other way a user writes it: an explicit (Sq, Sk) mask, key j <= i + Sk - Sq.
        # Which is faster depends on the shape (on the H200 at Sq = 4 the flash kernel has no
        # split over the keys; the mask takes another kernel), so both are timed
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        sq, sk = q.shape[1], k.shape[1]
        mask = masks.get((sq, sk))
        if mask is None:
            masks.clear()
            mask = masks[(sq, sk)] = torch.ones(sq, sk, dtype=torch.bool,
                                                device=q.device).tril(sk - sq)
        return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask,
                                              enable_gqa=q.shape[2] != k.shape[2]).transpose(1, 2)

    dense = {
        "cute_fa": lambda q, k, v: cute_fa.forward(q, k, v, causal=True),
        "sdpa_default": sdpa,
    }
    paged = {
        "cute_fa": lambda q, k, v, page_table, seqused_k: cute_fa.forward(
            q, k, v, causal=True, page_table=page_table, seqused_k=seqused_k),
    }
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

        # flash-attn-4's causal is bottom-right, like cute_fa's. It takes a page table only in
        # its varlen entry point, where q may stay (B, Sq, H, D); both return (out, lse).
        dense["flash_attn_4"] = lambda q, k, v: flash_attn_func(q, k, v, causal=True)[0]
        paged["flash_attn_4"] = lambda q, k, v, page_table, seqused_k: flash_attn_varlen_func(
            q, k, v, page_table=page_table, seqused_k=seqused_k, causal=True)[0]
    except Exception as exc:  # not installed here: reported, not faked
        print(f"flash-attn-4 not importable: {exc}", file=sys.stderr)
    return dense, paged, sdpa_bool_mask


class _DecodeTimer:
    """GPU time of one call, as a decode step inside a model (or a CUDA graph) would see it.

    Before each timed call: write a 256 MB buffer, so that the K/V of the previous call are no
    longer in the L2 (a model runs other layers between two attention calls of one layer), then
    spin the GPU for ~0.5 ms (torch.cuda._sleep), so that the host has launched the call before
    the GPU reaches the start event. Without the spin, Python overhead of a few tens of µs (most
    of all in flash-attn-4's interface) would be counted for the smallest shapes, whose kernels
    take about as long.
    """

    FLUSH_BYTES = 256 * 2**20
    SPIN_CYCLES = 1_000_000  # ~0.5 ms at the H200's 1.98 GHz

    def __init__(self, torch):
        self.torch = torch
        self.flush = torch.empty(self.FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def _before(self):
        self.flush.zero_()
        self.torch.cuda._sleep(self.SPIN_CYCLES)

    def ms(self, fn, nbytes: int) -> float:
        # reps: ~0.1 s of kernel time, 5 to 25 samples; the median of them
        est_s = nbytes / 3e12 + 20e-6
        reps = int(min(25, max(5, 0.1 / est_s)))
        return _time_ms(self.torch, fn, warmup=3, reps=reps, warmup_s=0.0, before=self._before)


def _fill_randn(torch, flat, gen, chunk=2**28):
    """Standard normal values into a large 1-D tensor, in chunks (no int32 index limits, and
    no float32 temporary of the whole buffer)."""
    for i in range(0, flat.numel(), chunk):
        part = flat[i:i + chunk]
        part.copy_(torch.randn(part.numel(), device=flat.device, dtype=torch.float32,
                               generator=gen))


def decode_results(torch, quick: bool = False, time_budget_s: float = DECODE_TIME_BUDGET_S):
    """Time every method on every decode shape. Returns (rows, skipped).

    One row per (shape, layout): layout 'dense', or 'paged' with its page_size. A row holds
    `us` (µs per call by method, None where the call failed, with the message in `errors`)
    and `check`: the largest difference between cute_fa and another method's output on the
    same inputs (a broken kernel shows there; the GPU tests are the real correctness check).
    Dense rows with Sq > 1 also hold `sdpa_variants`, the time of each way of giving SDPA the
    bottom-right mask; `us['sdpa_default']` is the faster.
    """
    kept, skipped = decode_shapes(quick)
    skipped = [dict(s, reason="K/V over %.0f GB" % (DECODE_MAX_KV_BYTES / 1e9)) for s in skipped]
    dense_methods, paged_methods, sdpa_bool_mask = _decode_methods(torch)
    dtype = getattr(torch, DECODE_DTYPE)
    timer = _DecodeTimer(torch)
    gen = torch.Generator(device="cuda").manual_seed(0)
    # One cache buffer for every shape: K and V of each shape are views into it, so the largest
    # shape sets the memory used and no shape allocates (or generates random numbers) again.
    pool_numel = max(s["kv_bytes"] for s in kept) // 2
    pool = torch.empty(pool_numel, device="cuda", dtype=dtype)
    _fill_randn(torch, pool, gen)
    # bring the clocks up before the first timing (the first method timed would pay otherwise)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        timer._before()
        torch.cuda.synchronize()  # one at a time: the host would queue seconds of spins ahead

    rows = []
    start = time.perf_counter()
    for n, shape in enumerate(kept):
        if time.perf_counter() - start > time_budget_s:
            skipped += [dict(s, reason=f"time budget ({time_budget_s:.0f} s) spent")
                        for s in kept[n:]]
            break
        b, sq, sk = shape["batch"], shape["seqlen_q"], shape["seqlen_k"]
        hq, hk, d = shape["heads_q"], shape["heads_kv"], shape["head_dim"]
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=gen)
        numel = b * sk * hk * d
        k = pool[:numel].view(b, sk, hk, d)
        v = pool[numel:2 * numel].view(b, sk, hk, d)
        base = dict(shape, dtype=DECODE_DTYPE, causal=True)

        row = dict(base, layout="dense", page_size=None, us={}, errors={}, check={})
        outs = _time_methods(torch, timer, row, dense_methods, (q, k, v))
        if sq > 1:
            _faster_sdpa(torch, timer, row, outs, sdpa_bool_mask, (q, k, v))
        if "cute_fa" in outs and "sdpa_default" in outs:
            row["check"]["sdpa_default"] = _max_diff(outs["cute_fa"], outs["sdpa_default"])
        rows.append(row)
        print(json.dumps(row), flush=True)
        del outs

        for page_size in DECODE_PAGE_SIZES:
            # The dense cache's own memory seen as a pool of pages, handed to the sequences in
            # a random order: the paged calls read the same bytes as the dense ones (in another
            # order, so each sequence's keys differ from the dense call's), with no second copy.
            pages = b * sk // page_size
            page_table = torch.randperm(pages, device="cuda", generator=gen)
            page_table = page_table.to(torch.int32).view(b, sk // page_size)
            seqused_k = torch.full((b,), sk, device="cuda", dtype=torch.int32)
            kp, vp = k.view(pages, page_size, hk, d), v.view(pages, page_size, hk, d)
            row = dict(base, layout="paged", page_size=page_size, us={}, errors={}, check={})
            outs = _time_methods(torch, timer, row, paged_methods,
                                 (q, kp, vp, page_table, seqused_k))
            if "cute_fa" in outs and "flash_attn_4" in outs:
                row["check"]["flash_attn_4"] = _max_diff(outs["cute_fa"], outs["flash_attn_4"])
            rows.append(row)
            print(json.dumps(row), flush=True)
            del outs
    del pool
    torch.cuda.empty_cache()
    return rows, skipped


def _time_methods(torch, timer, row, methods, args) -> dict:
    """Time each method on `args` into row['us'] (µs); returns the outputs of those that ran."""
    outs = {}
    for name, fn in methods.items():
        try:
            outs[name] = fn(*args)  # the first call compiles, outside the timing
            row["us"][name] = 1000.0 * timer.ms(lambda: fn(*args), row["kv_bytes"])
        except Exception as exc:
            row["us"][name] = None
            row["errors"][name] = f"{type(exc).__name__}: {exc}"[:300]
            outs.pop(name, None)
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
    return outs


def _faster_sdpa(torch, timer, row, outs, sdpa_bool_mask, args) -> None:
    """Time SDPA with the explicit mask too; keep the faster of the two ways in the row."""
    other = dict(row, us={}, errors={})
    mask_out = _time_methods(torch, timer, other, {"sdpa_default": sdpa_bool_mask}, args)
    variants = {"causal_lower_right": row["us"].get("sdpa_default"),
                "bool_mask": other["us"]["sdpa_default"]}
    row["sdpa_variants"] = variants
    if variants["bool_mask"] and not (variants["causal_lower_right"] and
                                      variants["causal_lower_right"] <= variants["bool_mask"]):
        row["us"]["sdpa_default"] = variants["bool_mask"]
        row["errors"].pop("sdpa_default", None)
        outs["sdpa_default"] = mask_out["sdpa_default"]
    if other["errors"]:
        row["errors"]["sdpa_bool_mask"] = other["errors"]["sdpa_default"]


def _max_diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


# --- the report: plain functions of the results dict, so that they run (and are tested) on CPU

_DECODE_METHODS = ("cute_fa", "sdpa_default", "flash_attn_4")
_DECODE_LABELS = {"cute_fa": "cute_fa", "sdpa_default": "SDPA", "flash_attn_4": "FA4"}
_BIG_KV_BYTES = 64 * 2**20  # the bandwidth target holds from 64 MB of K/V up
_TARGET_TBPS = 3.5


def _tbps(row, name) -> float | None:
    us = row["us"].get(name)
    return row["kv_bytes"] / (us * 1e-6) / 1e12 if us else None


def _best_other(row) -> float | None:
    """The faster of the other methods that ran on this row (SDPA and FA4 dense; FA4 paged)."""
    times = [row["us"][n] for n in _DECODE_METHODS[1:] if row["us"].get(n)]
    return min(times) if times else None


def _dense_of(rows):
    """(shape -> dense row), to put paged next to dense."""
    key = ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim")
    return {tuple(r[k] for k in key): r for r in rows if r["layout"] == "dense"}, key


def _shape_name(r) -> str:
    layout = "dense" if r["layout"] == "dense" else f"paged {r['page_size']}"
    return (f"B={r['batch']} Sq={r['seqlen_q']} Sk={r['seqlen_k']} "
            f"H={r['heads_q']}/{r['heads_kv']} D={r['head_dim']} {layout}")


def decode_targets(rows) -> list:
    """The issue's three targets, each as one line: how many rows meet it, and the worst."""
    dense_of, key = _dense_of(rows)
    lines = []
    dense = [(r["us"]["cute_fa"] / _best_other(r), r) for r in rows if r["layout"] == "dense"
             and r["us"].get("cute_fa") and _best_other(r)]
    if dense:
        ok = sum(ratio <= 1.0 for ratio, _ in dense)
        worst, r = max(dense, key=lambda x: x[0])
        lines.append(f"cute_fa at or below the faster of SDPA and FA4 (dense): {ok} of "
                     f"{len(dense)} shapes; worst {worst:.2f}x ({_shape_name(r)})")
    big = [(_tbps(r, "cute_fa"), r) for r in rows
           if r["kv_bytes"] >= _BIG_KV_BYTES and r["us"].get("cute_fa")]
    if big:
        ok = sum(t >= _TARGET_TBPS for t, _ in big)
        low, r = min(big, key=lambda x: x[0])
        lines.append(f"cute_fa ≥ {_TARGET_TBPS} TB/s where K/V ≥ 64 MB (dense and paged): "
                     f"{ok} of {len(big)} rows; lowest {low:.2f} TB/s ({_shape_name(r)})")
    paged = []
    for r in rows:
        dr = dense_of.get(tuple(r[k] for k in key))
        if r["layout"] == "paged" and r["page_size"] >= 64 and r["us"].get("cute_fa") \
                and dr and dr["us"].get("cute_fa"):
            paged.append((r["us"]["cute_fa"] / dr["us"]["cute_fa"], r))
    if paged:
        ok = sum(ratio <= 1.1 for ratio, _ in paged)
        worst, r = max(paged, key=lambda x: x[0])
        lines.append(f"cute_fa paged within 10% of dense (page size ≥ 64): {ok} of {len(paged)} "
                     f"rows; worst {worst:.2f}x ({_shape_name(r)})")
    return lines


def decode_markdown(result: dict) -> str:
    """The report of a decode run (the dict decode_main writes to decode.json) as markdown."""
    rows = result["rows"]
    peak = result.get("hbm_peak_tbps")
    lines = [f"# cute_fa decode, {result['device']}, {result['date']}", "",
             f"torch {result['torch']}, nvidia-cutlass-dsl {result['cutlass_dsl']}, flash-attn-4 "
             f"{result.get('flash_attn_4') or 'not installed'}. {result['dtype']}, causal "
             "bottom-right (query i of Sq sees keys j ≤ i + Sk − Sq), every one of the Sk keys "
             "valid.", "",
             "µs: GPU time per call, the median of 5-25 calls, each after a 256 MB write that "
             "evicts the previous call's K/V from the L2 and a ~0.5 ms GPU spin that hides the "
             "host's launch overhead (what a CUDA graph replay of a decode step sees). TB/s: "
             "bytes of K and V read (B·Sk·Hk·D·2 bytes·2) ÷ that time. "
             + (f"HBM peak of this GPU: {peak} TB/s (datasheet)." if peak else
                "No HBM peak is listed for this GPU (bench.HBM_PEAK_TBPS)."), "",
             "Methods, all on the same inputs: **cute_fa** `cute_fa.forward(q, k, v, causal=True)`"
             "; paged: `forward(q, k_pages, v_pages, causal=True, page_table=, seqused_k=)`. "
             "**SDPA** `F.scaled_dot_product_attention` (torch's default backend choice) on "
             "(B, H, S, D) transposes, `enable_gqa=True` where Hq ≠ Hk; Sq = 1 without a mask "
             "(one query sees every key); Sq > 1 (torch's `is_causal` is top-left): the faster of "
             "`attn_mask=causal_lower_right(Sq, Sk)` (torch's flash kernel with its bottom-right "
             "flag) and an explicit boolean (Sq, Sk) mask, both timed (decode.json: "
             "`sdpa_variants`). **FA4** `flash_attn.cute.flash_attn_func(q, k, v, "
             "causal=True)`; paged: `flash_attn_varlen_func(q, k_pages, v_pages, "
             "page_table=, seqused_k=, causal=True)`. SDPA has no paged cache: its paged cells "
             "are empty.", "",
             "Paged: the dense cache's memory seen as pages of `page_size` keys, handed to the "
             "sequences in a random order (`torch.randperm`), `seqused_k` = Sk: the paged calls "
             "read the same bytes as the dense ones. `vs best`: cute_fa's time ÷ the faster of "
             "the others on that row; `paged/dense`: cute_fa paged ÷ cute_fa dense.", ""]
    if result.get("l2_bytes"):
        lines += [f"K/V under the L2's {result['l2_bytes'] / 2**20:.0f} MB can still be partly "
                  "served from it despite the flush writes; their TB/s is not an HBM figure.", ""]
    targets = decode_targets(rows)
    if targets:
        lines += ["## Targets (issue 14)", ""] + [f"- {t}" for t in targets] + [""]

    dense_of, key = _dense_of(rows)

    def cell(x, fmt):
        return fmt.format(x) if x is not None else "—"

    groups = sorted({(r["head_dim"], r["heads_q"], r["heads_kv"]) for r in rows},
                    key=lambda g: (g[0], -(g[1] // g[2]), g[1]))
    for d, hq, hk in groups:
        lines += [f"## Hq/Hk = {hq}/{hk}, head_dim {d}", "",
                  "| B | Sq | Sk | K/V MB | layout | " +
                  " | ".join(f"{_DECODE_LABELS[n]} µs" for n in _DECODE_METHODS) + " | " +
                  " | ".join(f"{_DECODE_LABELS[n]} TB/s" for n in _DECODE_METHODS) +
                  " | cute_fa vs best | paged/dense |",
                  "|" + "---|" * (5 + 2 * len(_DECODE_METHODS) + 2)]
        sel = [r for r in rows if (r["head_dim"], r["heads_q"], r["heads_kv"]) == (d, hq, hk)]
        sel.sort(key=lambda r: (r["seqlen_q"], r["batch"], r["seqlen_k"], r["page_size"] or 0))
        for r in sel:
            us = [cell(r["us"].get(n), "{:.1f}") for n in _DECODE_METHODS]
            bw = [cell(_tbps(r, n), "{:.2f}") for n in _DECODE_METHODS]
            best = _best_other(r)
            ratio = cell(r["us"]["cute_fa"] / best if r["us"].get("cute_fa") and best else None,
                         "{:.2f}x")
            dr = dense_of.get(tuple(r[k] for k in key))
            pd = None
            if r["layout"] == "paged" and r["us"].get("cute_fa") and dr and dr["us"].get("cute_fa"):
                pd = r["us"]["cute_fa"] / dr["us"]["cute_fa"]
            layout = "dense" if r["layout"] == "dense" else f"paged {r['page_size']}"
            lines.append(f"| {r['batch']} | {r['seqlen_q']} | {r['seqlen_k']} | "
                         f"{r['kv_bytes'] / 2**20:.0f} | {layout} | " + " | ".join(us) + " | "
                         + " | ".join(bw) + f" | {ratio} | {cell(pd, '{:.2f}x')} |")
        lines.append("")

    checks = [(v, n, r) for r in rows for n, v in r.get("check", {}).items()]
    if checks:
        worst, name, r = max(checks, key=lambda x: x[0])
        lines += [f"Largest |cute_fa − {_DECODE_LABELS[name]}| over all rows (same inputs): "
                  f"{worst:.3g} ({_shape_name(r)}).", ""]
    errors: dict = {}
    for r in rows:
        for name, msg in r.get("errors", {}).items():
            errors.setdefault((name, msg), []).append(r)
    if errors:
        lines += ["## Failed calls", ""]
        for (name, msg), rs in errors.items():
            lines.append(f"- {_DECODE_LABELS.get(name, name)} on {len(rs)} row(s), first "
                         f"{_shape_name(rs[0])}: `{msg}`")
        lines.append("")
    if result.get("skipped"):
        lines += ["## Skipped shapes", ""]
        for s in result["skipped"]:
            lines.append(f"- B={s['batch']} Sq={s['seqlen_q']} Sk={s['seqlen_k']} "
                         f"H={s['heads_q']}/{s['heads_kv']} D={s['head_dim']} "
                         f"({s['kv_bytes'] / 1e9:.1f} GB of K/V): {s['reason']}")
        lines.append("")
    return "\n".join(lines)


def _decode_plot(result: dict, path: Path) -> None:
    """TB/s against K/V bytes, one panel per Sq, one series per (method, layout), with the HBM
    peak as a horizontal line: how close each method gets to the roofline as the cache grows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    sqs = sorted({r["seqlen_q"] for r in rows}) or [1]
    fig, axes = plt.subplots(1, len(sqs), figsize=(6.5 * len(sqs), 5), squeeze=False)
    series = sorted({(n, r["page_size"]) for r in rows for n in _DECODE_METHODS
                     if r["us"].get(n)}, key=lambda s: (_DECODE_METHODS.index(s[0]), s[1] or 0))
    colors = {"cute_fa": "tab:blue", "sdpa_default": "tab:orange", "flash_attn_4": "tab:green"}
    markers = {None: "o", 64: "^", 256: "s"}
    for ax, sq in zip(axes.ravel(), sqs):
        for name, page in series:
            sel = [r for r in rows if r["seqlen_q"] == sq and r["page_size"] == page
                   and r["us"].get(name)]
            label = _DECODE_LABELS[name] + (f" paged {page}" if page else " dense")
            ax.scatter([r["kv_bytes"] for r in sel], [_tbps(r, name) for r in sel], s=14,
                       alpha=0.75, color=colors[name], marker=markers.get(page, "x"), label=label)
        if result.get("hbm_peak_tbps"):
            ax.axhline(result["hbm_peak_tbps"], color="black", linestyle="--", linewidth=1,
                       label=f"HBM peak {result['hbm_peak_tbps']} TB/s")
        if result.get("l2_bytes"):
            ax.axvline(result["l2_bytes"], color="grey", linestyle=":", linewidth=1,
                       label="L2 size")
        ax.set_xscale("log")
        ax.set_xlabel("bytes of K and V read per call")
        ax.set_ylabel("effective bandwidth, TB/s")
        ax.set_title(f"Sq = {sq}")
        ax.grid(alpha=0.3)
    axes.ravel()[0].legend(fontsize=7)
    fig.suptitle(f"decode, {result['dtype']}, causal: {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_decode_report(result: dict, out_dir: Path) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "decode.json").write_text(json.dumps(result, indent=1))
    (out_dir / "decode.md").write_text(decode_markdown(result))
    _decode_plot(result, out_dir / "decode.png")


def _package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def decode_main(out_dir: str, quick: bool = False) -> dict:
    import torch

    from .compiler import dsl_version

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    name = torch.cuda.get_device_name()
    result = dict(device=name, date=time.strftime("%Y-%m-%d"), torch=torch.__version__,
                  cutlass_dsl=dsl_version(), flash_attn_4=_package_version("flash-attn-4"),
                  hbm_peak_tbps=hbm_peak_tbps(name), l2_bytes=getattr(props, "L2_cache_size", None),
                  dtype=DECODE_DTYPE, causal=True)
    t = time.perf_counter()
    result["rows"], result["skipped"] = decode_results(torch, quick=quick)
    result["seconds"] = time.perf_counter() - t
    write_decode_report(result, Path(out_dir))
    print((Path(out_dir) / "decode.md").read_text())
    return result
