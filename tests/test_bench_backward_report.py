"""The backward benchmark's report (CPU): its ratios and its target lines, from numbers written
here."""

from cute_fa.bench_backward import backward_markdown


def _result():
    rows = [
        dict(kind="grid", batch=16, seqlen=1024, heads=16, heads_kv=16, head_dim=128,
             causal=False, cute_fa=300.0, cute_fa_det=270.0, sdpa_flash=250.0, sdpa_cudnn=400.0,
             flash_attn_4=None, flash_attn_4_error="ImportError: not here", cute_fa_step=310.0,
             sdpa_flash_step=260.0, sdpa_cudnn_step=None, flash_attn_4_step=None),
        dict(kind="grid", batch=2, seqlen=8192, heads=16, heads_kv=16, head_dim=128,
             causal=True, cute_fa=330.0, cute_fa_det=240.0, sdpa_flash=300.0, sdpa_cudnn=500.0,
             flash_attn_4=550.0),
        dict(kind="gqa", batch=1, seqlen=4096, heads=32, heads_kv=8, head_dim=128, causal=True,
             cute_fa=280.0),
    ]
    return dict(device="GPU", date="2026-12-01", torch="t", cutlass_dsl="c",
                flash_attn_4="4.0.0b36", rows=rows)


def _cells(text, prefix):
    row = next(line for line in text.splitlines() if line.startswith(prefix))
    return [c.strip() for c in row.strip("|").split("|")]


def test_ratios():
    text = backward_markdown(_result())
    cells = _cells(text, "| grid B16 S1024 H16/16 D128 | no |")
    # cute_fa 300, det 270, flash 250, cuDNN 400, FA4 missing; 300/250, 300/400, —; 270/300
    assert cells[2:11] == ["300", "270", "250", "400", "—", "1.20", "0.75", "—", "0.90"]
    assert cells[11:] == ["310", "260", "—", "—"]
    cells = _cells(text, "| grid B2 S8192 H16/16 D128 | yes |")
    assert cells[7:11] == ["1.10", "0.66", "0.60", "0.73"]


def test_target_line():
    text = backward_markdown(_result())
    # grid only: flash ratios 1.20 and 1.10; det/default 0.90 and 0.727
    assert ("cute_fa / SDPA flash 1.10x-1.20x (target >= 1.15x on every shape: met on 1 of 2); "
            "deterministic / default 0.73-0.90 (target >= 0.85: met on 1 of 2)") in text
    assert "| gqa B1 S4096 H32/8 D128 | yes | 280 |" in text
