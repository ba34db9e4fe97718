"""The backward benchmark's report (CPU): its ratios, the fastest peer of the backward and of
the step, and its target lines, from numbers written here."""

from cute_fa.bench.backward import backward_markdown, write_report
from cute_fa.bench.common import measured_row, peer_fields

FORWARD = 1e12  # forward FLOPs of every row: the backward's are 2.5x, the step's 3.5x


def _row(base, step=None, errors=None, step_errors=None, **tflops):
    """A measured row whose µs give these backward TFLOPs/s (and `step`'s forward + backward
    TFLOPs/s)."""
    us = {n: (2.5 * FORWARD / t / 1e6 if t else None) for n, t in tflops.items()}
    row = measured_row(dict(base, forward_flops=FORWARD), us, errors or {}, 2.5 * FORWARD)
    step_us = {n: (3.5 * FORWARD / t / 1e6 if t else None) for n, t in (step or {}).items()}
    row.update(step_us=step_us, step_errors=step_errors or {}, step_flops=3.5 * FORWARD,
               **peer_fields(step_us, prefix="step_"))
    return row


def _result():
    rows = [
        _row(dict(kind="grid", batch=16, seqlen=1024, heads=16, heads_kv=16, head_dim=128,
                  causal=False),
             step=dict(cute_fa=310.0, sdpa_flash=260.0, sdpa_cudnn=None, flash_attn_4=None),
             errors=dict(flash_attn_4="ImportError: not here"),
             step_errors=dict(flash_attn_4="ImportError: not here"),
             cute_fa=300.0, cute_fa_det=270.0, sdpa_flash=250.0, sdpa_cudnn=400.0,
             flash_attn_4=None),
        _row(dict(kind="grid", batch=2, seqlen=8192, heads=16, heads_kv=16, head_dim=128,
                  causal=True),
             cute_fa=330.0, cute_fa_det=240.0, sdpa_flash=300.0, sdpa_cudnn=500.0,
             flash_attn_4=600.0),
        _row(dict(kind="gqa", batch=1, seqlen=4096, heads=32, heads_kv=8, head_dim=128,
                  causal=True), cute_fa=280.0),
    ]
    small = {"cute_fa": dict(gpu_us=5.0, host_us=12.0),
             "cute_fa_requires_grad": dict(gpu_us=5.0, host_us=30.0),
             "sdpa_default": dict(gpu_us=6.0, host_us=10.0)}
    return dict(device="GPU", date="2026-12-01", torch="t", cutlass_dsl="c",
                flash_attn_4="4.0.0b36", rows=rows, reps=20, small_call=small)


def _cells(text, prefix):
    row = next(line for line in text.splitlines() if line.startswith(prefix))
    return [c.strip() for c in row.strip("|").split("|")]


def test_ratios():
    text = backward_markdown(_result())
    assert ("| shape | causal | cute_fa | det | SDPA flash | SDPA cuDNN | FA4 | fastest peer | "
            "cute_fa µs | fastest peer µs | vs SDPA flash | vs SDPA cuDNN | vs FA4 | "
            "vs fastest peer | det/default | fwd+bwd cute_fa | fwd+bwd SDPA flash | "
            "fwd+bwd SDPA cuDNN | fwd+bwd FA4 | fwd+bwd fastest peer | "
            "fwd+bwd vs fastest peer |") in text
    cells = _cells(text, "| grid B16 S1024 H16/16 D128 | no |")
    # cute_fa 300, det 270, flash 250, cuDNN 400 (the fastest peer), FA4 missing;
    # 300/250, 300/400, —, 300/400; det/default 270/300
    assert cells[2:7] == ["300", "270", "250", "400", "—"]
    assert cells[7:10] == ["SDPA cuDNN", "8333.3", "6250.0"]
    assert cells[10:15] == ["1.20x", "0.75x", "—", "0.75x", "0.90"]
    # forward + backward: cute_fa 310, flash 260 (the only peer that ran): 310/260
    assert cells[15:] == ["310", "260", "—", "—", "SDPA flash", "1.19x"]
    cells = _cells(text, "| grid B2 S8192 H16/16 D128 | yes |")
    # the fastest peer is FA4 (600): 330/600
    assert cells[7] == "FA4"
    assert cells[10:15] == ["1.10x", "0.66x", "0.55x", "0.55x", "0.73"]


def test_summary_and_target_lines():
    text = backward_markdown(_result())
    # grid only: flash ratios 1.20 and 1.10; det/default 0.90 and 0.727
    assert ("cute_fa / SDPA flash 1.10x-1.20x (target >= 1.15x on every shape: met on 1 of 2); "
            "deterministic / default 0.73-0.90 (target >= 0.85: met on 1 of 2)") in text
    # every row with a peer: 0.75 and 0.55 (the GQA row has none)
    assert ("Backward: cute_fa / fastest peer: min 0.55x, max 0.75x, mean 0.65x; ≥ 1.0 on 0 of "
            "2 rows.") in text
    assert "Forward + backward: cute_fa / fastest peer: min 1.19x, max 1.19x" in text
    assert "| gqa B1 S4096 H32/8 D128 | yes | 280 |" in text
    assert "median of 20 calls queued behind a GPU spin" in text


def test_small_call_and_failures():
    text = backward_markdown(_result())
    assert "| cute_fa_requires_grad | 5.0 | 30.0 |" in text
    assert "Host: fastest peer SDPA default 10.0 µs; cute_fa / fastest peer (speed) 0.83x." \
        in text
    assert "- FA4 on 1 row(s), first grid B16 S1024 H16/16 D128: `ImportError: not here`" in text


def test_rows_hold_both_fastest_peers():
    row = _result()["rows"][0]
    assert (row["best_peer"], row["step_best_peer"]) == ("sdpa_cudnn", "sdpa_flash")
    assert round(row["vs_best_peer"], 4) == 0.75
    assert round(row["step_vs_best_peer"], 4) == round(310 / 260, 4)


def test_write_report(tmp_path):
    result = _result()
    write_report(result, tmp_path)
    assert (tmp_path / "backward.md").read_text() == backward_markdown(result)
    assert (tmp_path / "backward.png").stat().st_size > 10_000
