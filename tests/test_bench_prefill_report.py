"""The prefill benchmark's report (CPU): its ratios against the large batches and the other
methods, and its sections, from numbers written here."""

from cute_fa.bench_prefill import _window_pairs, prefill_markdown


def _result():
    rows = [
        # the reference: mean of 300 and 500 = 400 TFLOPs/s at head_dim 128
        dict(kind="large", batch=16, seqlen=1024, heads_q=16, heads_kv=16, head_dim=128,
             cute_fa=300.0, cute_fa_us=1.0),
        dict(kind="large", batch=2, seqlen=8192, heads_q=16, heads_kv=16, head_dim=128,
             cute_fa=500.0, cute_fa_us=1.0),
        dict(kind="small", batch=1, seqlen=2000, heads_q=32, heads_kv=8, head_dim=128,
             cute_fa=360.0, cute_fa_us=1.0, sdpa_flash=300.0, sdpa_flash_us=1.0,
             sdpa_cudnn=450.0, sdpa_cudnn_us=1.0, flash_attn_4=None,
             flash_attn_4_error="ImportError: not here"),
        dict(kind="varlen", prompts=2, tokens=300, longest=200, heads_q=32, heads_kv=8,
             head_dim=128, cute_fa=100.0, cute_fa_us=20.0, flash_attn_4=None,
             flash_attn_4_error="RuntimeError: x"),
        dict(kind="model", impl="cute_fa", prefill_ms=6.5, decode_ms_per_token=7.25),
        dict(kind="model", impl="flash_attention_2", error="ImportError: no flash_attn"),
    ]
    return dict(device="GPU", date="2026-12-01", torch="t", cutlass_dsl="c", rows=rows,
                note="one run")


def test_small_shape_ratios():
    text = prefill_markdown(_result())
    row = next(line for line in text.splitlines() if line.startswith("| 1 | 2000 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # cute_fa / large = 360 / 400; / sdpa_flash = 360 / 300; / sdpa_cudnn = 360 / 450; / best
    # other (cuDNN 450) = 0.8
    assert cells[-4:] == ["0.90", "1.20x", "0.80x", "0.80x"]
    assert "Large batches (the reference): D=128: 300, 500 (mean 400)" in text
    assert "Note: one run." in text


def test_sections_and_refusals_are_reported():
    text = prefill_markdown(_result())
    assert "cute_fa 100 TFLOPs/s (20 µs)" in text
    assert "not run: flash_attn_4: RuntimeError: x" in text
    assert "| cute_fa | 6.50 | 7.25 |" in text
    assert "| flash_attention_2 | not run: ImportError: no flash_attn | |" in text


def test_window_pairs_by_hand():
    # s = 5, window of 2 keys back: rows see 1, 2, 3, 3, 3 keys
    assert _window_pairs(5, 2) == 12
    assert _window_pairs(5, 10) == 15  # a window past the sequence: the causal triangle
