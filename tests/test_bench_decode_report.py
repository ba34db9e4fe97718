"""The decode benchmark's report (CPU): tables, bandwidths, ratios and targets from numbers."""

import json
import subprocess
import sys

import pytest

from cute_fa.bench.common import bf16_peak_tflops, hbm_peak_tbps, peer_fields
from cute_fa.bench.decode import (decode_markdown, decode_reps, decode_shapes, keep_faster_way,
                                  kv_bytes, write_decode_report)


def _row(b, sk, layout, us, page_size=None, sq=1, hq=32, hk=8, d=128, errors=None, check=None):
    return dict(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hk, head_dim=d,
                kv_bytes=kv_bytes(b, sk, hk, d), dtype="bfloat16", causal=True, layout=layout,
                page_size=page_size, us=us, errors=errors or {}, check=check or {},
                **peer_fields(us))


def _result():
    # B=8, Sk=32768, Hk=8, D=128: K/V = 8·32768·8·128·2·2 = 1 GiB = 1073741824 bytes
    rows = [
        _row(8, 32768, "dense", dict(cute_fa=300.0, sdpa_default=400.0, flash_attn_4=350.0),
             check=dict(sdpa_default=0.0039)),
        _row(8, 32768, "paged", dict(cute_fa=320.0, flash_attn_4=None), page_size=64,
             errors=dict(flash_attn_4="AssertionError: paged KV not supported")),
        _row(8, 32768, "paged", dict(cute_fa=360.0, flash_attn_4=330.0), page_size=256),
        # small: 1·2048·8·128·4 = 8 MiB, under the 64 MB of the bandwidth target
        _row(1, 2048, "dense", dict(cute_fa=12.0, sdpa_default=10.0, flash_attn_4=None)),
        _row(1, 2048, "dense", dict(cute_fa=8.0, sdpa_default=10.0, flash_attn_4=9.0),
             hq=16, hk=16, d=64),
    ]
    return dict(device="Test GPU", date="2026-12-02", torch="0", cutlass_dsl="4.8.1",
                flash_attn_4="4.0.0b36", reps="5-25", hbm_peak_tbps=4.8, l2_bytes=60 * 2**20,
                dtype="bfloat16", causal=True, rows=rows, seconds=1.0,
                small_call={"cute_fa": dict(gpu_us=9.0, host_us=55.7),
                            "sdpa_default": dict(gpu_us=12.0, host_us=32.8),
                            "cute_fa_paged": dict(gpu_us=10.0, host_us=67.6)},
                skipped=[dict(batch=64, seqlen_q=1, seqlen_k=131072, heads_q=16, heads_kv=16,
                              head_dim=128, kv_bytes=kv_bytes(64, 131072, 16, 128),
                              reason="K/V over 40 GB")])


def test_decode_markdown_rows_and_ratios():
    md = decode_markdown(_result())
    assert ("| B | Sq | Sk | K/V MB | layout | cute_fa µs | SDPA default µs | SDPA flash µs | "
            "SDPA cuDNN µs | FA4 µs | fastest peer | cute_fa TB/s | fastest peer TB/s | "
            "vs fastest peer | paged/dense |") in md
    # 1 GiB in 300 µs = 3.58 TB/s; the fastest peer FA4 350 µs: 3.07; 350 / 300 = 1.17x
    assert ("| 8 | 1 | 32768 | 1024 | dense | 300.0 | 400.0 | — | — | 350.0 | FA4 | 3.58 | 3.07 | "
            "1.17x | — |") in md
    # paged 64: FA4 failed (a dash, no peer, no ratio), paged/dense = 320 / 300 = 1.07x
    assert ("| 8 | 1 | 32768 | 1024 | paged 64 | 320.0 | — | — | — | — | — | 3.36 | — | — | "
            "1.07x |") in md
    # paged 256: FA4 paged is the only peer (SDPA has none): 330 / 360 = 0.92x; 360 / 300
    assert ("| 8 | 1 | 32768 | 1024 | paged 256 | 360.0 | — | — | — | 330.0 | FA4 | 2.98 | 3.25 | "
            "0.92x | 1.20x |") in md
    # a peer that did not run leaves the fastest of the others: 10 / 12 = 0.83x
    assert ("| 1 | 1 | 2048 | 8 | dense | 12.0 | 10.0 | — | — | — | SDPA default | 0.70 | 0.84 | "
            "0.83x | — |") in md
    # one section per head configuration, GQA before MHA at one head_dim, D=64 first
    assert md.index("## Hq/Hk = 16/16, head_dim 64") < md.index("## Hq/Hk = 32/8, head_dim 128")
    assert "HBM peak of this GPU: 4.8 TB/s" in md
    assert "GPU time per call: median of 5-25 calls queued behind a GPU spin" in md
    assert "Largest |cute_fa − SDPA default| over all rows (same inputs): 0.0039" in md
    assert "- FA4 on 1 row(s), first B=8 Sq=1 Sk=32768 H=32/8 D=128 paged 64: " \
           "`AssertionError: paged KV not supported`" in md
    assert "- B=64 Sq=1 Sk=131072 H=16/16 D=128 (68.7 GB of K/V): K/V over 40 GB" in md
    # the one decode call: GPU time and host cost, each against SDPA's
    assert "| cute_fa_paged | 10.0 | 67.6 |" in md
    assert "Host: fastest peer SDPA default 32.8 µs; cute_fa / fastest peer (speed) 0.59x." in md


def test_decode_targets():
    md = decode_markdown(_result())
    # dense rows with a peer: 350 vs 300 (ok), 10 vs 12 (not), 9 vs 8 (ok)
    assert ("- cute_fa at least as fast as the fastest peer (dense): 2 of 3 shapes; slowest "
            "0.83x (B=1 Sq=1 Sk=2048 H=32/8 D=128 dense)") in md
    # the 1 GiB rows only (the 8 MiB ones are under 64 MB): 3.58 ok, 3.36 and 2.98 not
    assert ("- cute_fa ≥ 3.5 TB/s where K/V ≥ 64 MB (dense and paged): 1 of 3 rows; lowest "
            "2.98 TB/s (B=8 Sq=1 Sk=32768 H=32/8 D=128 paged 256)") in md
    assert ("- cute_fa paged within 10% of dense (page size ≥ 64): 1 of 2 rows; worst 1.20x "
            "(B=8 Sq=1 Sk=32768 H=32/8 D=128 paged 256)") in md
    # every row with a peer: 1.17, 0.92, 0.83 and 1.125
    assert ("cute_fa / fastest peer: min 0.83x, max 1.17x, mean 1.01x; ≥ 1.0 on 2 of 4 "
            "rows.") in md


def test_rows_hold_the_fastest_peer():
    rows = _result()["rows"]
    assert [r["best_peer"] for r in rows] == ["flash_attn_4", None, "flash_attn_4",
                                              "sdpa_default", "flash_attn_4"]
    assert rows[3]["best_peer_us"] == 10.0 and round(rows[3]["vs_best_peer"], 3) == 0.833


def test_write_decode_report(tmp_path):
    result = _result()
    write_decode_report(result, tmp_path)
    assert json.loads((tmp_path / "decode.json").read_text()) == result
    assert (tmp_path / "decode.md").read_text() == decode_markdown(result)
    assert (tmp_path / "decode.png").stat().st_size > 10_000


def test_report_without_numbers_or_peak():
    """A run where every call failed, on a GPU with no listed peak, still gives a report."""
    result = _result()
    result["hbm_peak_tbps"] = None
    for r in result["rows"]:
        r["us"] = {n: None for n in r["us"]}
    md = decode_markdown(result)
    assert "No HBM peak is listed for this GPU" in md
    assert "## Targets" not in md


def test_shapes_and_peaks():
    kept, skipped = decode_shapes()
    # 4 B x 4 Sk x 2 Sq x 3 head configurations x 2 head dims, less the two over 40 GB
    assert len(kept) + len(skipped) == 192
    assert [(s["batch"], s["seqlen_k"], s["heads_kv"], s["head_dim"]) for s in skipped] == \
        [(64, 131072, 16, 128)] * 2
    assert max(s["kv_bytes"] for s in kept) == kv_bytes(64, 131072, 8, 128) < 40e9
    assert hbm_peak_tbps("NVIDIA H200") == 4.8
    assert hbm_peak_tbps("NVIDIA H100 80GB HBM3") == 3.35
    assert hbm_peak_tbps("NVIDIA H100 PCIe") == 2.0
    assert hbm_peak_tbps("NVIDIA GH200 480GB") is None
    assert hbm_peak_tbps("Some GPU") is None
    assert bf16_peak_tflops("NVIDIA H200") == 989 and bf16_peak_tflops("NVIDIA H200 NVL") == 835
    assert bf16_peak_tflops("NVIDIA H100 PCIe") == 756 and bf16_peak_tflops("Some GPU") is None
    # ~0.1 s of kernel time per timing at 3 TB/s, 5 to 25 samples: 34 GB take 11.5 ms
    assert decode_reps(kv_bytes(1, 2048, 8, 128)) == 25
    assert decode_reps(kv_bytes(64, 131072, 8, 128)) == 8
    assert decode_reps(10**12) == 5


def test_decode_bench_refuses_cleanly_without_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the machine without a GPU")
    out_dir = tmp_path / "bench-out"
    out = subprocess.run([sys.executable, "-m", "cute_fa", "bench", "--decode", "--out",
                          str(out_dir)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "error: bench needs a CUDA GPU" in out.stderr
    assert not out_dir.exists()


@pytest.mark.parametrize("lower_right_us, mask_us, mask_error, want_us, taken", [
    (500.0, 200.0, None, 200.0, True),       # the mask is faster: taken
    (150.0, 200.0, None, 150.0, False),      # slower: the lower-right one stays
    (None, 200.0, None, 200.0, True),        # lower-right failed: the mask's
    (500.0, None, "RuntimeError: no kernel", 500.0, False),  # the mask failed: noted, not taken
])
def test_keep_faster_way(lower_right_us, mask_us, mask_error, want_us, taken):
    row = dict(us=dict(cute_fa=100.0, sdpa_flash=lower_right_us),
               errors={} if lower_right_us else dict(sdpa_flash="RuntimeError: x"))
    assert keep_faster_way(row, "sdpa_flash", mask_us, mask_error) is taken
    assert row["us"]["sdpa_flash"] == want_us
    assert row["sdpa_variants"]["sdpa_flash"] == dict(causal_lower_right=lower_right_us,
                                                      bool_mask=mask_us)
    if mask_error:
        assert row["errors"] == {"sdpa_flash_bool_mask": "RuntimeError: no kernel"}
    else:
        assert row["errors"] == {}  # a way that ran clears the other's failure
