"""The benchmark's report (CPU): the table and ratios written from given numbers."""

import json

from cute_fa.bench import write_report


def _timing(after_torch, total):
    return dict(after_torch=after_torch, process_total=total, import_torch=total - after_torch)


def test_report_tables(tmp_path):
    grid = [dict(dtype="bfloat16", head_dim=64, causal=c, seqlen=1024, batch=16, heads=32,
                 cute_fa=330.0, cute_fa_sm80=256.0, cute_fa_tma=320.0, sdpa_flash=300.0)
            for c in (False, True)]
    grid.append(dict(dtype="bfloat16", head_dim=128, causal=False, seqlen=1024, batch=16,
                     heads=16, cute_fa=400.0, cute_fa_sm80=None, cute_fa_tma=390.0,
                     sdpa_flash=320.0, sdpa_cudnn=350.0, flash_attn_4=340.0))
    result = dict(device="Test GPU", date="2026-11-30", torch="0", cutlass_dsl="4.8.1",
                  grid=grid, small_call_us={"cute_fa": 13.64},
                  start=[dict(head_dim=256, causal=False, cold_cache=_timing(7.08, 11.46),
                              warm_cache=_timing(0.52, 5.68))])
    write_report(result, tmp_path)
    md = (tmp_path / "results.md").read_text()
    # ratios: to the faster of cuDNN and flash-attn-4 (350), to FA2 (330 / 300 = 1.10x), to the
    # TMA kernel (330 / 320 = 1.03x), TMA / sm80 (320 / 256 = 1.25x); a missing number: a dash
    assert ("| bfloat16 | 64 | False | 1024 | 330 | 256 | 320 | 300 | — | — | — | 1.10x | "
            "1.03x | 1.25x |") in md
    assert ("| bfloat16 | 128 | False | 1024 | 400 | — | 390 | 320 | 350 | 340 | 1.14x | 1.25x "
            "| 1.03x | — |") in md
    assert "- cute_fa: 13.6 µs" in md
    assert "| 256 | False | 7.08 s (11.46 s) | 0.52 s (5.68 s) |" in md
    assert json.loads((tmp_path / "results.json").read_text()) == result
    assert (tmp_path / "results.png").stat().st_size > 10_000  # three panels, odd count
