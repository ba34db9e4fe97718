"""The benchmarks' shared pieces and the forward grid's report (CPU): the timer's control flow on
a simulated GPU, the fastest-peer selection and ratio summary, and the grid and host tables
written from given numbers."""

import json

import pytest

from cute_fa.bench import common
from cute_fa.bench.common import (HostBound, fastest_peer, gpu_time_us, host_us, measured_row,
                                  peer_fields, ratio_summary, vs_fastest_peer)
from cute_fa.bench.grid import grid_markdown, write_report
from cute_fa.bench.host import host_markdown


# --- the timer, on a simulated GPU ----------------------------------------------------------

class _GPU:
    """One stream and a host clock, in seconds. A launch costs the host `launch_s` and starts
    on the GPU when both the GPU is free and the host has launched it; an event marks the
    moment the GPU reaches it."""

    rate = 2e9  # spin cycles per second
    launch_s = 3e-6

    def __init__(self):
        self.host = 0.0
        self.free = 0.0  # when the GPU has done everything enqueued so far
        self.spins = []  # seconds of each spin asked for, calibration included

    def perf_counter(self):
        return self.host

    def launch(self, seconds):
        self.host += self.launch_s
        self.free = max(self.free, self.host) + seconds

    def synchronize(self):
        self.host = max(self.host, self.free)


class _Event:
    def __init__(self, gpu):
        self.gpu, self.at = gpu, None

    def record(self):
        self.gpu.launch(0.0)
        self.at = self.gpu.free

    def synchronize(self):
        self.gpu.host = max(self.gpu.host, self.at)

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3  # ms, as torch.cuda.Event's


class _FakeTorch:
    def __init__(self, gpu):
        gpu_ = gpu

        class cuda:
            OutOfMemoryError = MemoryError

            @staticmethod
            def Event(enable_timing=False):
                return _Event(gpu_)

            @staticmethod
            def _sleep(cycles):
                gpu_.spins.append(cycles / gpu_.rate)
                gpu_.launch(cycles / gpu_.rate)

            @staticmethod
            def synchronize():
                gpu_.synchronize()

            @staticmethod
            def current_device():
                return 0

        self.cuda = cuda


@pytest.fixture
def gpu(monkeypatch):
    gpu = _GPU()
    monkeypatch.setattr(common, "perf_counter", gpu.perf_counter)
    monkeypatch.setattr(common, "_CYCLES_PER_S", {})
    return gpu


def _call(gpu, host_s, gpu_s):
    """A method whose Python path costs host_s before it launches a kernel of gpu_s."""
    def fn():
        gpu.host += host_s
        gpu.launch(gpu_s)
    return fn


def test_gpu_time_is_the_kernels_not_the_host_path(gpu):
    # a 100 µs host path in front of a 10 µs kernel: the events see the kernel only
    torch = _FakeTorch(gpu)
    assert gpu_time_us(torch, _call(gpu, 100e-6, 10e-6), reps=20, warmup_s=0.0) == \
        pytest.approx(10.0)
    # the host path counts on its own: per call, what it costs plus its launch
    assert host_us(torch, _call(gpu, 100e-6, 10e-6), calls=50) == pytest.approx(103.0)
    # a kernel far longer than its host path: GPU time as it is, host cost unchanged
    assert gpu_time_us(torch, _call(gpu, 20e-6, 2e-3), reps=10, warmup_s=0.0) == \
        pytest.approx(2000.0)
    assert host_us(torch, _call(gpu, 20e-6, 2e-3), calls=20) == pytest.approx(23.0)


def test_between_runs_outside_the_events(gpu):
    torch = _FakeTorch(gpu)
    flushes = []

    def flush():  # a 60 µs GPU write between samples
        flushes.append(1)
        gpu.launch(60e-6)

    assert gpu_time_us(torch, _call(gpu, 30e-6, 5e-6), reps=7, between=flush, warmup_s=0.0,
                       warmup_calls=3) == pytest.approx(5.0)
    assert len(flushes) == 3 + 7


def test_a_spin_too_short_is_taken_again_longer(gpu):
    torch = _FakeTorch(gpu)
    calls = []

    def fn():  # cheap in the warm-up, 300 µs of host time per call once timed
        calls.append(1)
        gpu.host += 10e-6 if len(calls) <= 6 else 300e-6
        gpu.launch(10e-6)

    fn()  # the first call, as time_each makes it
    assert gpu_time_us(torch, fn, reps=20, warmup_s=0.0) == pytest.approx(10.0)
    held = gpu.spins[4:]  # after the calibration's four
    assert len(held) == 2 and held[1] >= 2 * held[0]


def test_a_call_that_waits_for_the_gpu_is_refused(gpu):
    torch = _FakeTorch(gpu)

    def fn():  # synchronizes inside: the host waits for the spin every time
        gpu.host += 5e-6
        gpu.launch(10e-6)
        gpu.synchronize()

    with pytest.raises(HostBound, match="waits for the GPU"):
        gpu_time_us(torch, fn, reps=10, warmup_s=0.0)
    with pytest.raises(HostBound):
        host_us(torch, fn, calls=10)
    # the end-to-end timing takes it, host time included: 5 µs, the kernel's launch (3 µs), the
    # kernel (10 µs), the end event's launch (3 µs), which the idle GPU waits for
    assert gpu_time_us(torch, fn, reps=10, warmup_s=0.0, hide_host=False) == \
        pytest.approx(21.0)


# --- the fastest peer ------------------------------------------------------------------------

def test_fastest_peer_is_the_fastest_of_every_peer_timed():
    us = dict(cute_fa=100.0, cute_fa_sm80=50.0, sdpa_default=120.0, sdpa_flash=None,
              sdpa_cudnn=90.0, flash_attn_4=95.0)
    # cute_fa's own variants are no peers; a failed peer (None) is no reference
    assert fastest_peer(us) == ("sdpa_cudnn", 90.0)
    assert vs_fastest_peer(us) == pytest.approx(0.9)
    assert peer_fields(us) == dict(best_peer="sdpa_cudnn", best_peer_us=90.0,
                                   vs_best_peer=pytest.approx(0.9))
    assert peer_fields(us, prefix="step_")["step_best_peer"] == "sdpa_cudnn"
    # SDPA default counts as any other peer; a tie goes to the first in PEERS' order
    assert fastest_peer(dict(sdpa_default=80.0, flash_attn_4=80.0)) == ("sdpa_default", 80.0)
    assert fastest_peer(dict(cute_fa=1.0, sdpa_flash=None)) == (None, None)
    assert vs_fastest_peer(dict(cute_fa=None, sdpa_flash=5.0)) is None


def test_measured_row_and_summary():
    row = measured_row(dict(seqlen=1024), dict(cute_fa=200.0, sdpa_flash=250.0),
                       dict(flash_attn_4="ImportError: x"), work=1e11)
    assert row["tflops"] == dict(cute_fa=pytest.approx(500.0), sdpa_flash=pytest.approx(400.0))
    assert (row["best_peer"], row["best_peer_us"]) == ("sdpa_flash", 250.0)
    assert row["vs_best_peer"] == pytest.approx(1.25)
    assert ratio_summary([1.25, None, 0.75, 1.1]) == (
        "cute_fa / fastest peer: min 0.75x, max 1.25x, mean 1.03x; ≥ 1.0 on 2 of 3 rows.")
    assert ratio_summary([None]) == "cute_fa / fastest peer: no row has both numbers."


# --- the grid's report -----------------------------------------------------------------------

FLOPS = 1e12


def _us(**tflops):
    """µs by method from TFLOPs/s at FLOPS of work (None stays None)."""
    return {n: (FLOPS / t / 1e6 if t else None) for n, t in tflops.items()}


def _timing(after_torch, total):
    return dict(after_torch=after_torch, process_total=total, import_torch=total - after_torch)


def _grid_result():
    grid = [dict(dtype="bfloat16", head_dim=64, causal=c, seqlen=1024, batch=16, heads=32,
                 flops=FLOPS, errors={},
                 us=_us(cute_fa=330, cute_fa_sm80=256, cute_fa_tma=320, sdpa_flash=300))
            for c in (False, True)]
    grid.append(dict(dtype="bfloat16", head_dim=128, causal=False, seqlen=1024, batch=16,
                     heads=16, flops=FLOPS, errors={"cute_fa_sm80": "RuntimeError: no kernel"},
                     us=_us(cute_fa=400, cute_fa_sm80=None, cute_fa_tma=390, sdpa_flash=320,
                            sdpa_cudnn=350, flash_attn_4=340)))
    small = {"cute_fa": dict(gpu_us=5.3, host_us=13.64),
             "cute_fa_sm80": dict(gpu_us=None, host_us=None, error="RuntimeError: x"),
             "sdpa_default": dict(gpu_us=6.0, host_us=9.0),
             "flash_attn_4": dict(gpu_us=4.2, host_us=127.0)}
    return dict(device="Test GPU", date="2026-11-30", torch="0", cutlass_dsl="4.8.1",
                flash_attn_4=None, flash_attn_4_error=None, reps=20, grid=grid,
                small_call=small,
                start=[dict(head_dim=256, causal=False, cold_cache=_timing(7.08, 11.46),
                            warm_cache=_timing(0.52, 5.68))])


def _cells(text, prefix):
    row = next(line for line in text.splitlines() if line.startswith(prefix))
    return [c.strip() for c in row.strip("|").split("|")]


def test_grid_table_and_ratios():
    md = grid_markdown(_grid_result())
    assert "GPU time per call: median of 20 calls queued behind a GPU spin (host launch " \
           "hidden for every method alike); host cost per call is its own column." in md
    assert ("| dtype | D | causal | S | cute_fa | cute_fa_sm80 | cute_fa_tma | sdpa_flash | "
            "sdpa_cudnn | flash_attn_4 | fastest peer | cute_fa µs | fastest peer µs | "
            "cute_fa / fastest peer | cute_fa / SDPA flash | cute_fa / cute_fa_tma | "
            "cute_fa_tma / cute_fa_sm80 |") in md
    # the fastest peer is SDPA flash here (the only one): 330 / 300; to the TMA kernel
    # 330 / 320; TMA / sm80 320 / 256; missing numbers: a dash
    assert _cells(md, "| bfloat16 | 64 | False | 1024 |")[4:] == [
        "330", "256", "320", "300", "—", "—", "SDPA flash", "3030.3", "3333.3", "1.10x",
        "1.10x", "1.03x", "1.25x"]
    # the fastest of flash (320), cuDNN (350) and FA4 (340) is cuDNN: 400 / 350
    assert _cells(md, "| bfloat16 | 128 | False | 1024 |")[4:] == [
        "400", "—", "390", "320", "350", "340", "SDPA cuDNN", "2500.0", "2857.1", "1.14x",
        "1.25x", "1.03x", "—"]
    assert ("cute_fa / fastest peer: min 1.10x, max 1.14x, mean 1.11x; ≥ 1.0 on 3 of 3 "
            "rows.") in md
    assert "- cute_fa_sm80 on 1 row(s), first bfloat16 D=128 full S=1024: " \
           "`RuntimeError: no kernel`" in md


def test_grid_small_call_and_start():
    md = grid_markdown(_grid_result())
    assert "| cute_fa | 5.3 | 13.6 |" in md
    assert "| cute_fa_sm80 | not run: RuntimeError: x | |" in md
    # GPU: FA4 4.2 µs is the fastest peer, 4.2 / 5.3; host: SDPA default 9.0, 9.0 / 13.64
    assert "GPU: fastest peer FA4 4.2 µs; cute_fa / fastest peer (speed) 0.79x." in md
    assert "Host: fastest peer SDPA default 9.0 µs; cute_fa / fastest peer (speed) 0.66x." in md
    assert "| 256 | False | 7.08 s (11.46 s) | 0.52 s (5.68 s) |" in md
    assert "flash-attn-4 not installed." in md


def test_write_report(tmp_path):
    result = _grid_result()
    write_report(result, tmp_path)
    assert (tmp_path / "results.md").read_text() == grid_markdown(result)
    assert json.loads((tmp_path / "results.json").read_text()) == result
    assert (tmp_path / "results.png").stat().st_size > 10_000  # three panels, odd count


# --- the host table --------------------------------------------------------------------------

def test_host_table():
    def row(mode, calls, host, gpu, errors=None):
        r = dict(mode=mode, calls=calls, reps=50, host_us=host, gpu_us=gpu, errors=errors or {})
        r.update(peer_fields(host, prefix="host_"))
        r.update(peer_fields(gpu, prefix="gpu_"))
        return r

    rows = [row("no_grad", 200, dict(cute_fa=12.0, sdpa_default=9.0, flash_attn_4=127.0),
                dict(cute_fa=5.0, sdpa_default=6.0, flash_attn_4=4.0)),
            row("step", 50, dict(cute_fa=80.0, sdpa_default=100.0, flash_attn_4=None),
                dict(cute_fa=30.0, sdpa_default=25.0, flash_attn_4=None),
                errors=dict(flash_attn_4="RuntimeError: no backward"))]
    md = host_markdown(dict(device="Test GPU", date="2026-12-02", torch="0", cutlass_dsl="c",
                            flash_attn_4="4.0.0b36", rows=rows))
    assert "median of 50 calls queued behind a GPU spin" in md
    # host: the fastest peer is SDPA (9.0), 9 / 12 = 0.75x; GPU: FA4 (4.0), 4 / 5 = 0.80x
    assert ("| forward, inputs without grad | 200 | 12.0 | 9.0 | 127.0 | SDPA default | 0.75x | "
            "5.0 | 6.0 | 4.0 | FA4 | 0.80x |") in md
    assert ("| forward + backward (autograd.grad) | 50 | 80.0 | 100.0 | — | SDPA default | "
            "1.25x | 30.0 | 25.0 | — | SDPA default | 0.83x |") in md
    assert "Host: cute_fa / fastest peer: min 0.75x, max 1.25x, mean 1.00x; ≥ 1.0 on 1 of 2" in md
    assert "- FA4, forward + backward (autograd.grad): `RuntimeError: no backward`" in md


def test_bench_flags():
    from cute_fa.__main__ import build_parser

    args = build_parser().parse_args(["bench", "--host", "--quick", "--out", "x"])
    assert args.host and args.quick and not args.decode
    with pytest.raises(SystemExit):  # one benchmark per run
        build_parser().parse_args(["bench", "--host", "--decode"])
