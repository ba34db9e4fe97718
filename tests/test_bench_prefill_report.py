"""The prefill benchmark's report (CPU): its ratios against the large batches and the fastest
peer, and its sections, from numbers written here."""

import pytest

from cute_fa.bench.common import measured_row
from cute_fa.bench.prefill import prefill_markdown, window_pairs, write_report

FLOPS = 1e12


def _row(base, errors=None, **tflops):
    """A measured row whose µs give these TFLOPs/s at FLOPS of work."""
    us = {n: (FLOPS / t / 1e6 if t else None) for n, t in tflops.items()}
    return measured_row(base, us, errors or {}, FLOPS)


def _result():
    rows = [
        # the reference: mean of 300 and 500 = 400 TFLOPs/s at head_dim 128
        _row(dict(kind="large", batch=16, seqlen=1024, heads_q=16, heads_kv=16, head_dim=128),
             cute_fa=300.0, sdpa_flash=280.0),
        _row(dict(kind="large", batch=2, seqlen=8192, heads_q=16, heads_kv=16, head_dim=128),
             cute_fa=500.0),
        _row(dict(kind="small", batch=1, seqlen=2000, heads_q=32, heads_kv=8, head_dim=128),
             dict(flash_attn_4="ImportError: not here"), cute_fa=360.0, sdpa_default=200.0,
             sdpa_flash=300.0, sdpa_cudnn=450.0, flash_attn_4=None),
        # 100 TFLOPs/s in 20 µs: 2e9 FLOPs
        measured_row(dict(kind="varlen", prompts=2, tokens=300, longest=200, heads_q=32,
                          heads_kv=8, head_dim=128,
                          sdpa_inputs="right-padded to the longest prompt"),
                     dict(cute_fa=20.0, sdpa_default=25.0, flash_attn_4=None),
                     dict(flash_attn_4="RuntimeError: x"), 2e9),
        dict(kind="model", impl="sdpa", prefill_ms=7.0, decode_ms_per_token=7.0),
        dict(kind="model", impl="cute_fa", prefill_ms=6.5, prefill_gpu_ms=5.25,
             decode_ms_per_token=7.25),
        dict(kind="model", impl="flash_attention_2", error="ImportError: no flash_attn"),
    ]
    return dict(device="GPU", date="2026-12-01", torch="t", cutlass_dsl="c", flash_attn_4=None,
                rows=rows, note="one run", reps=20)


def _cells(text, prefix):
    row = next(line for line in text.splitlines() if line.startswith(prefix))
    return [c.strip() for c in row.strip("|").split("|")]


def test_small_shape_ratios():
    text = prefill_markdown(_result())
    cells = _cells(text, "| 1 | 2000 |")
    # fastest peer: cuDNN (450 > SDPA default 200, flash 300; FA4 did not run)
    assert cells[4:9] == ["360", "200", "300", "450", "—"]
    assert cells[9:12] == ["SDPA cuDNN", "2777.8", "2222.2"]
    # cute_fa / large = 360 / 400; / sdpa_flash = 360 / 300; / sdpa_cudnn = 360 / 450; / the
    # fastest peer (cuDNN) = 0.8
    assert cells[-4:] == ["0.90", "1.20x", "0.80x", "0.80x"]
    assert "cute_fa / fastest peer: min 0.80x, max 0.80x, mean 0.80x; ≥ 1.0 on 0 of 1 rows." \
        in text
    assert "Large batches (the reference): D=128: 300, 500 (mean 400)" in text
    assert "Note: one run." in text
    assert "median of 20 calls queued behind a GPU spin" in text
    assert "host cost per call is its own column in the host benchmark (`bench --host`" in text


def test_large_rows_have_their_peer():
    text = prefill_markdown(_result())
    # 300 against SDPA flash's 280: 1.07x; no cuDNN on the row: a dash
    assert _cells(text, "| 16 | 1024 | 16/16 | 128 |")[4:] == [
        "300", "280", "SDPA flash", "3333.3", "3571.4", "1.07x", "—", "1.07x"]
    # a row without any peer: no reference, dashes
    assert _cells(text, "| 2 | 8192 | 16/16 | 128 |")[4:] == [
        "500", "—", "—", "2000.0", "—", "—", "—", "—"]


def test_sections_and_refusals_are_reported():
    text = prefill_markdown(_result())
    assert "cute_fa 100 TFLOPs/s (20 µs)" in text
    # the varlen row's fastest peer: SDPA (padded) 25 µs, 25 / 20
    assert "fastest peer SDPA default, cute_fa / fastest peer 1.25x" in text
    assert "SDPA's inputs: right-padded to the longest prompt" in text
    assert "not run: flash_attn_4: RuntimeError: x" in text
    assert "| cute_fa | 6.50 | 5.25 | 7.25 |" in text
    assert "| sdpa | 7.00 | — | 7.00 |" in text  # its forward would not run behind the spin
    assert "| flash_attention_2 | not run: ImportError: no flash_attn | | |" in text
    # the model's fastest other implementation: sdpa, 7.0 / 6.5 and 7.0 / 7.25
    assert "- prefill: fastest other implementation sdpa 7.00 ms; cute_fa / it (speed) 1.08x" \
        in text
    assert "- decode: fastest other implementation sdpa 7.00 ms; cute_fa / it (speed) 0.97x" \
        in text
    assert "- FA4 on 1 row(s), first small batch=1, seqlen=2000, heads_q=32, heads_kv=8, " \
           "head_dim=128: `ImportError: not here`" in text


def test_rows_hold_the_fastest_peer():
    small = _result()["rows"][2]
    assert small["best_peer"] == "sdpa_cudnn"
    assert small["best_peer_us"] == pytest.approx(FLOPS / 450 / 1e6)
    assert small["vs_best_peer"] == pytest.approx(0.8)
    assert small["tflops"]["cute_fa"] == pytest.approx(360.0)


def test_write_report(tmp_path):
    result = _result()
    write_report(result, tmp_path)
    assert (tmp_path / "prefill.md").read_text() == prefill_markdown(result)
    assert (tmp_path / "prefill.png").stat().st_size > 10_000


def test_window_pairs_by_hand():
    # s = 5, window of 2 keys back: rows see 1, 2, 3, 3, 3 keys
    assert window_pairs(5, 2) == 12
    assert window_pairs(5, 10) == 15  # a window past the sequence: the causal triangle
