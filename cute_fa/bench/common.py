"""What every benchmark shares: the one timer (`gpu_time_us`; `host_us` for the host's cost per
call), the peers cute_fa is measured against, FLOPs, the report helpers (cells, the fastest peer,
the ratio summary, package versions) and the datasheet peaks the plots draw.

The timer: a call's GPU time is measured with the GPU held by a spin kernel while the host
enqueues every sample, so no sample's events can wait for the host. Timing from an idle GPU
instead puts the host's launch path inside the events (flash-attn-4's Python path costs ~127 µs
per small call; SDPA's `sdpa_kernel(...)` context manager lands inside the window too), and that
is not the same cost for every method. The host's cost per call is then its own number
(`host_us`), measured with the GPU held as well, so that it is the host's alone.

Everything that touches the GPU imports torch inside a function (the report functions run on a
machine without one) and takes the `torch` module as an argument.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from time import perf_counter

# The FlashAttention papers' forward grid: 16k tokens per batch (batch = TOKENS / seqlen), hidden
# 2048 (heads = HIDDEN / head_dim)
SEQLENS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
LARGE_HEAD_DIMS = (192, 256)
TOKENS, HIDDEN = 16384, 2048

# Every peer a row can be measured against; a row's reference is the fastest of those it holds
PEERS = ("sdpa_default", "sdpa_flash", "sdpa_cudnn", "flash_attn_4")
LABELS = {"sdpa_default": "SDPA default", "sdpa_flash": "SDPA flash",
          "sdpa_cudnn": "SDPA cuDNN", "flash_attn_4": "FA4"}

# HBM bandwidth by the vendor's datasheet, TB/s, for the decode plot's roofline; looked up by a
# substring of torch.cuda.get_device_name(), first match wins (GH200 first: its "H200" substring
# is not the H200's memory; its bandwidth depends on the memory variant, so none).
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

# Dense (no sparsity) bf16 tensor-core peak by the datasheet, TFLOPs/s (fp16's is the same on
# these parts), for the TFLOPs plots' roofline; same lookup as HBM_PEAK_TBPS. The NVL parts
# run at a lower power limit than the SXM ones.
BF16_PEAK_TFLOPS = (
    ("GH200", 989),
    ("H200 NVL", 835),
    ("H200", 989),               # H200 SXM
    ("H100 NVL", 835),
    ("H100 PCIe", 756),
    ("H100", 989),               # H100 SXM
    ("A100", 312),
)


def _lookup(table, device_name: str):
    for key, value in table:
        if key in device_name:
            return value
    return None


def hbm_peak_tbps(device_name: str) -> float | None:
    """The datasheet HBM bandwidth of the named GPU in TB/s, or None for one not listed."""
    return _lookup(HBM_PEAK_TBPS, device_name)


def bf16_peak_tflops(device_name: str) -> float | None:
    """The datasheet dense bf16 tensor-core peak of the named GPU, or None for one not listed."""
    return _lookup(BF16_PEAK_TFLOPS, device_name)


def flops(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool) -> float:
    """Forward FLOPs of a square attention call: 4·B·H·S²·D, halved when causal."""
    f = 4 * batch * heads * seqlen * seqlen * head_dim
    return f / 2 if causal else f


def tflops(work: float | None, us: float | None) -> float | None:
    return work / us / 1e6 if work and us else None


# --- the timer ------------------------------------------------------------------------------

# The host's enqueue must take at most this share of the spin that holds the GPU: the rest is
# slack for the spin's own launch and the calibration's error.
FIT = 0.9
MIN_SPIN_S = 200e-6
MAX_SPIN_S = 4.0
SPIN_TRIES = 4
_CALIBRATION_CYCLES = 4_000_000  # ~2 ms at the H200's 1.98 GHz
_CYCLES_PER_S: dict = {}


class HostBound(RuntimeError):
    """The host's enqueue outlasted every spin tried: the call waits for the GPU inside (a
    synchronization, or a full launch queue), so its GPU time cannot be told from the host's."""


def spin_cycles_per_s(torch) -> float:
    """How many cycles of `torch.cuda._sleep` (a kernel that spins on the SM clock) make a
    second on this GPU, measured once per device with CUDA events (median of three)."""
    index = torch.cuda.current_device()
    if index not in _CYCLES_PER_S:
        torch.cuda._sleep(_CALIBRATION_CYCLES)  # the spin kernel's first launch loads it
        torch.cuda.synchronize()
        rates = []
        for _ in range(3):
            start, end = _event_pair(torch)
            start.record()
            torch.cuda._sleep(_CALIBRATION_CYCLES)
            end.record()
            end.synchronize()
            rates.append(_CALIBRATION_CYCLES / (start.elapsed_time(end) * 1e-3))
        _CYCLES_PER_S[index] = statistics.median(rates)
    return _CYCLES_PER_S[index]


def _event_pair(torch):
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _spin(torch, seconds: float):
    """Enqueues a spin of about `seconds` between two events; returns the events, whose elapsed
    time is how long the GPU was really held (the clock may differ from the calibration's)."""
    cycles = max(1, int(seconds * spin_cycles_per_s(torch)))
    start, end = _event_pair(torch)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    return start, end


def warm_gpu(torch, seconds: float = 1.0) -> None:
    """Spin the GPU for `seconds`, one short spin at a time, so that its clocks are up before
    the first timing (the first method timed would pay for the ramp otherwise)."""
    spin_cycles_per_s(torch)
    t0 = perf_counter()
    while perf_counter() - t0 < seconds:
        _spin(torch, 0.01)
        torch.cuda.synchronize()  # one at a time: the host would queue seconds of spins ahead


def _warm_up(torch, sample, calls: int, seconds: float) -> float:
    """sample() at least `calls` times and for at least `seconds` of wall time, synchronizing
    every 10 calls (the host never runs far ahead of the GPU); returns the median host time of
    one call in seconds, the first guess of how long the timed samples take to enqueue."""
    host = []
    t0 = perf_counter()
    while len(host) < calls or perf_counter() - t0 < seconds:
        t = perf_counter()
        sample()
        host.append(perf_counter() - t)
        if len(host) % 10 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(host)


def _held(torch, enqueue, spin_s: float, what: str):
    """Runs enqueue() with the GPU held by a spin that outlasts it: first `spin_s` seconds,
    longer on each try where the host's enqueue took more than FIT of the spin. Returns
    enqueue()'s result."""
    spin_cycles_per_s(torch)  # calibrated (once) here, not inside the enqueue's time
    for _ in range(SPIN_TRIES):
        torch.cuda.synchronize()
        t = perf_counter()  # from before the spin's launch: its launch counts as host time
        spin_start, spin_end = _spin(torch, spin_s)
        result = enqueue()
        enqueue_s = perf_counter() - t
        torch.cuda.synchronize()
        spun_s = max(spin_start.elapsed_time(spin_end) * 1e-3, 1e-9)
        if enqueue_s <= FIT * spun_s:
            return result
        # the spin ran spun_s where spin_s was asked: scale the request by what it must cover
        spin_s *= max(2.0, 1.5 * enqueue_s / (FIT * spun_s))
        if spin_s > MAX_SPIN_S:
            break
    raise HostBound(f"{what}: the host took {enqueue_s * 1e3:.2f} ms to enqueue, more than "
                    f"{FIT} of the {spun_s * 1e3:.2f} ms GPU spin ahead of it, on every try: the "
                    "call waits for the GPU (a synchronization inside it, or a full launch "
                    "queue), so its GPU time cannot be told from its host time")


def gpu_time_us(torch, fn, *, reps: int, between=None, warmup_s: float = 0.2,
                warmup_calls: int = 5, hide_host: bool = True) -> float:
    """GPU time of one call of fn(), µs: the median of `reps` samples.

    Warm-up: at least `warmup_calls` samples and `warmup_s` of wall time (with 5 calls only,
    whichever method was timed first on a new short shape read up to 12% slower than the same
    kernel timed later). Then the GPU is held by one spin long enough to cover the host's
    enqueue of all the samples, each [between() if given, start event, fn(), end event]; the
    events then time the GPU's work alone, for every method alike (also one launching several
    kernels, or with a context manager around its launch). `between` runs outside the events
    (the decode benchmark's L2 flush). If the enqueue took longer than FIT of the spin, the GPU
    may have waited for the host inside a sample: the samples are taken again behind a longer
    spin, and HostBound is raised if none fits.

    hide_host=False: each sample from an idle GPU instead (synchronize, start, fn(), end), the
    host's time inside it included: for calls that synchronize inside (HF `generate`), whose
    end-to-end time is what the row reports.
    """
    def sample():
        if between is not None:
            between()
        fn()

    host_s = _warm_up(torch, sample, warmup_calls, warmup_s)
    pairs = [_event_pair(torch) for _ in range(reps)]  # made ahead: not in the enqueue's time

    def enqueue():
        for start, end in pairs:
            if between is not None:
                between()
            if not hide_host:
                torch.cuda.synchronize()
            start.record()
            fn()
            end.record()

    if hide_host:
        # twice the warm-up's host time per sample, plus the events' own launches
        _held(torch, enqueue, max(MIN_SPIN_S, 2.0 * reps * (host_s + 10e-6)),
              f"gpu_time_us({reps} samples)")
    else:
        enqueue()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(start.elapsed_time(end) for start, end in pairs)


def host_us(torch, fn, *, calls: int = 200, warmup_calls: int = 5, repeats: int = 5) -> float:
    """The host's cost of one call of fn(), µs: `calls` calls back to back, timed on the host
    while a GPU spin outlasts them (so the GPU's work never holds the host up), no sync inside;
    the median of `repeats` such runs (one run of a few ms reads up to 2x high when the host is
    busy with something else). `calls` stays modest so that the CUDA launch queue never fills
    (a full queue blocks the host, which the spin check would then refuse as HostBound)."""
    host_s = _warm_up(torch, fn, warmup_calls, 0.0)

    def enqueue():
        t = perf_counter()
        for _ in range(calls):
            fn()
        return perf_counter() - t

    runs = [_held(torch, enqueue, max(MIN_SPIN_S, 2.0 * calls * host_s),
                  f"host_us({calls} calls)") for _ in range(repeats)]
    return statistics.median(runs) / calls * 1e6


def write_files(out_dir, stem: str, result: dict, markdown: str, plot=None) -> None:
    """A benchmark's report under out_dir: stem.json (every number), stem.md (the tables) and,
    where `plot` is given, stem.png (plot(result, path))."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (out / f"{stem}.md").write_text(markdown)
    if plot is not None:
        plot(result, out / f"{stem}.png")


def error_text(exc: BaseException, limit: int = 300) -> str:
    return f"{type(exc).__name__}: {exc}"[:limit]


def time_each(torch, fns: dict, *, reps: int, between=None, warmup_s: float = 0.2,
              warmup_calls: int = 5, hide_host: bool = True, keep_outputs: bool = False):
    """Each of fns (name -> fn()) timed by gpu_time_us. Returns (us, errors, outputs): µs per
    call by name (None where the call failed, its message in errors) and, with keep_outputs,
    the output of each first call (for the checks between methods on the same inputs). The
    first call runs outside the timing (it compiles where it must)."""
    us, errors, outputs = {}, {}, {}
    for name, fn in fns.items():
        try:
            out = fn()
            if keep_outputs:
                outputs[name] = out
            del out
            us[name] = gpu_time_us(torch, fn, reps=reps, between=between, warmup_s=warmup_s,
                                   warmup_calls=warmup_calls, hide_host=hide_host)
        except Exception as exc:
            us[name] = None
            errors[name] = error_text(exc)
            outputs.pop(name, None)
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
    return us, errors, outputs


def small_calls(torch, fns: dict, *, calls: int = 200, reps: int = 50) -> dict:
    """name -> {gpu_us, host_us} (or {error}) of each of fns: small calls, whose host cost
    can exceed their GPU time, so both are reported, each measured on its own."""
    table = {}
    for name, fn in fns.items():
        try:
            fn()
            table[name] = dict(gpu_us=gpu_time_us(torch, fn, reps=reps),
                               host_us=host_us(torch, fn, calls=calls))
        except Exception as exc:
            table[name] = dict(gpu_us=None, host_us=None, error=error_text(exc))
    return table


# --- the peers ------------------------------------------------------------------------------

_FA4: list = []  # [(functions or None, import error or None)], filled on first use


def flash_attn_4():
    """(flash_attn_func, flash_attn_varlen_func) of flash-attn-4 (`flash_attn.cute`), or None
    where it is not importable (then reported, not faked: `flash_attn_4_error()`)."""
    if not _FA4:
        try:
            from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

            _FA4.append(((flash_attn_func, flash_attn_varlen_func), None))
        except Exception as exc:
            print(f"flash-attn-4 not importable: {exc}", file=sys.stderr)
            _FA4.append((None, error_text(exc)))
    return _FA4[0][0]


def flash_attn_4_error() -> str | None:
    flash_attn_4()
    return _FA4[0][1]


def first(out):
    """The output of a call that returns it or (out, lse, ...) (flash-attn-4's functions)."""
    return out[0] if isinstance(out, tuple) else out


def sdpa_peer(torch, name: str):
    """fn(q, k, v, causal=False, attn_mask=None) -> o of the SDPA peer `name` in flash-attn's
    (batch, seqlen, heads, head_dim) layout (transposed views in and out), GQA through
    enable_gqa. sdpa_default is torch's own choice, without a `sdpa_kernel` context; the others
    pin a backend with one (its cost is host time, which the timer keeps out of GPU time)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    backend = {"sdpa_default": None, "sdpa_flash": SDPBackend.FLASH_ATTENTION,
               "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[name]

    def run(q, k, v, causal=False, attn_mask=None):
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        kwargs = dict(attn_mask=attn_mask, is_causal=causal, enable_gqa=q.shape[2] != k.shape[2])
        if backend is None:
            return F.scaled_dot_product_attention(qt, kt, vt, **kwargs).transpose(1, 2)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, **kwargs).transpose(1, 2)
    return run


def dense_peers(torch) -> dict:
    """name -> fn(q, k, v, causal) -> o of every peer, in flash-attn's layout (square calls:
    SDPA's top-left causal is then flash-attn's bottom-right)."""
    peers = {name: sdpa_peer(torch, name) for name in PEERS[:3]}
    fa4 = flash_attn_4()
    if fa4 is not None:
        peers["flash_attn_4"] = lambda q, k, v, causal: first(fa4[0](q, k, v, causal=causal))
    return peers


# --- the reports: plain functions of result dicts (they run, and are tested, on a CPU) --------

def timer_note(reps, host_column: bool = True) -> str:
    """The sentence every report opens with: how its times were taken. host_column=False for a
    report without a host table, which points to the host benchmark instead."""
    where = ("its own column" if host_column else
             "its own column in the host benchmark (`bench --host`, host.md)")
    return (f"GPU time per call: median of {reps} calls queued behind a GPU spin (host launch "
            f"hidden for every method alike); host cost per call is {where}.")


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def run_info(torch) -> dict:
    """What every result dict starts with: the GPU, the date, the packages' versions, and why
    flash-attn-4 is missing where it is."""
    fa4 = package_version("flash-attn-4")
    if fa4 is None and flash_attn_4() is not None:
        fa4 = "version unknown"  # importable, from a distribution of another name
    return dict(device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"),
                torch=torch.__version__, cutlass_dsl=package_version("nvidia-cutlass-dsl"),
                flash_attn_4=fa4, flash_attn_4_error=flash_attn_4_error())


def versions_line(result: dict) -> str:
    fa4 = result.get("flash_attn_4") or "not installed"
    if result.get("flash_attn_4_error"):
        fa4 += f" (not importable: {result['flash_attn_4_error']})"
    return (f"torch {result.get('torch')}, nvidia-cutlass-dsl {result.get('cutlass_dsl')}, "
            f"flash-attn-4 {fa4}.")


def cell(x, spec: str = ".0f") -> str:
    return "—" if x is None else format(x, spec)


def times_cell(x) -> str:
    """A ratio as a table cell: 1.10x, or a dash where there is none."""
    return "—" if x is None else f"{x:.2f}x"


def ratio(a, b):
    """a / b where both are numbers, else None."""
    return a / b if a and b else None


def label(name: str | None) -> str:
    return "—" if name is None else LABELS.get(name, name)


def fastest_peer(us: dict, peers=PEERS) -> tuple:
    """(name, µs) of the fastest of `peers` that has a time in `us` (µs by method), or
    (None, None) where none has; a tie goes to the first in `peers`' order."""
    timed = [(us[n], i, n) for i, n in enumerate(peers) if us.get(n)]
    if not timed:
        return None, None
    best_us, _, name = min(timed)
    return name, best_us


def vs_fastest_peer(us: dict, method: str = "cute_fa", peers=PEERS):
    """method's speed over the fastest peer's on a row (the peer's µs over method's), or None."""
    return ratio(fastest_peer(us, peers)[1], us.get(method))


def peer_fields(us: dict, method: str = "cute_fa", prefix: str = "", peers=PEERS) -> dict:
    """What a row stores about its reference: `best_peer` (the fastest peer's name),
    `best_peer_us` and `vs_best_peer`: method's speed over the fastest peer's (its time over
    method's; ≥ 1.0 where method is at least as fast). `prefix` names a second set
    (the backward's `step_`)."""
    name, best_us = fastest_peer(us, peers)
    return {prefix + "best_peer": name, prefix + "best_peer_us": best_us,
            prefix + "vs_best_peer": vs_fastest_peer(us, method, peers)}


def measured_row(base: dict, us: dict, errors: dict, work: float | None = None) -> dict:
    """A table row: the shape's fields, µs per method, TFLOPs/s where `work` (FLOPs) is given,
    the failed calls' messages and the fastest peer (`peer_fields`)."""
    row = dict(base, us=us, errors=errors)
    if work is not None:
        row["flops"] = work
        row["tflops"] = {n: tflops(work, t) for n, t in us.items()}
    row.update(peer_fields(us))
    return row


def ratio_summary(ratios, what: str = "cute_fa / fastest peer") -> str:
    """One line: min, max and mean of the ratios given (None skipped) and how many are ≥ 1.0."""
    xs = [x for x in ratios if x is not None]
    if not xs:
        return f"{what}: no row has both numbers."
    return (f"{what}: min {min(xs):.2f}x, max {max(xs):.2f}x, mean "
            f"{sum(xs) / len(xs):.2f}x; ≥ 1.0 on {sum(x >= 1.0 for x in xs)} of {len(xs)} rows.")


def methods_in(rows, order, key: str = "us") -> list:
    """The methods that appear in any row's `key` dict: those of `order` first, in its order,
    then any other (an A/B variant a run added) in the order met."""
    seen = [n for r in rows for n in r.get(key, {})]
    return [n for n in order if n in seen] + list(dict.fromkeys(n for n in seen if n not in order))


def error_lines(rows, describe, keys=("errors",)) -> list:
    """'## Failed calls' with one line per (method, message): on how many rows, the first."""
    found: dict = {}
    for r in rows:
        for key in keys:
            for name, msg in r.get(key, {}).items():
                rs = found.setdefault((name, msg), [])
                if not rs or rs[-1] is not r:  # a row failing both ways counts once
                    rs.append(r)
    if not found:
        return []
    lines = ["## Failed calls", ""]
    for (name, msg), rs in found.items():
        lines.append(f"- {label(name)} on {len(rs)} row(s), first {describe(rs[0])}: `{msg}`")
    return lines + [""]


def small_call_lines(table: dict, title: str) -> list:
    """The markdown of a `small_calls` table, with the fastest peer of each column."""
    lines = [title, "", "| method | GPU µs per call | host µs per call |", "|---|---|---|"]
    for name, v in table.items():
        if v.get("error"):
            lines.append(f"| {name} | not run: {v['error']} | |")
        else:
            lines.append(f"| {name} | {cell(v['gpu_us'], '.1f')} | {cell(v['host_us'], '.1f')} |")
    cute = table.get("cute_fa", {})
    for column in ("gpu_us", "host_us"):
        name, best = fastest_peer({n: v.get(column) for n, v in table.items()})
        if name:
            lines.append(f"\n{'GPU' if column == 'gpu_us' else 'Host'}: fastest peer "
                         f"{label(name)} {best:.1f} µs; cute_fa / fastest peer (speed) "
                         f"{cell(ratio(best, cute.get(column)), '.2f')}x.")
    return lines + [""]


def plot_peak(ax, device: str, x) -> None:
    """The device's dense bf16 peak as a dashed line on a TFLOPs/s axis, labelled at data
    x-coordinate `x`, where the device is listed."""
    peak = bf16_peak_tflops(device)
    if peak:
        ax.axhline(peak, color="grey", ls="--", lw=1)
        ax.text(x, peak * 0.95, f"dense bf16 peak ({peak})", fontsize=7, color="grey")
