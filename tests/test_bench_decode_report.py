"""The decode benchmark's report (CPU): tables, bandwidths, ratios and targets from numbers."""

import json
import subprocess
import sys

import pytest

from cute_fa.bench import (decode_markdown, decode_shapes, hbm_peak_tbps, kv_bytes,
                           write_decode_report)


def _row(b, sk, layout, us, page_size=None, sq=1, hq=32, hk=8, d=128, errors=None, check=None):
    return dict(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hk, head_dim=d,
                kv_bytes=kv_bytes(b, sk, hk, d), dtype="bfloat16", causal=True, layout=layout,
                page_size=page_size, us=us, errors=errors or {}, check=check or {})


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
                flash_attn_4="4.0.0b36", hbm_peak_tbps=4.8, l2_bytes=60 * 2**20,
                dtype="bfloat16", causal=True, rows=rows, seconds=1.0,
                skipped=[dict(batch=64, seqlen_q=1, seqlen_k=131072, heads_q=16, heads_kv=16,
                              head_dim=128, kv_bytes=kv_bytes(64, 131072, 16, 128),
                              reason="K/V over 40 GB")])


def test_decode_markdown_rows_and_ratios():
    md = decode_markdown(_result())
    # 1 GiB in 300 µs = 3.58 TB/s; 400 µs: 2.68; 350 µs: 3.07; vs best = 300 / 350 = 0.86x
    assert ("| 8 | 1 | 32768 | 1024 | dense | 300.0 | 400.0 | 350.0 | 3.58 | 2.68 | 3.07 | "
            "0.86x | — |") in md
    # paged 64: FA4 failed (a dash, no ratio), paged/dense = 320 / 300 = 1.07x
    assert ("| 8 | 1 | 32768 | 1024 | paged 64 | 320.0 | — | — | 3.36 | — | — | — | "
            "1.07x |") in md
    # paged 256: vs FA4 paged only (SDPA has none): 360 / 330 = 1.09x; 360 / 300 = 1.20x
    assert ("| 8 | 1 | 32768 | 1024 | paged 256 | 360.0 | — | 330.0 | 2.98 | — | 3.25 | 1.09x | "
            "1.20x |") in md
    # a method that did not run on a dense row leaves the best of the others: 12 / 10 = 1.20x
    assert ("| 1 | 1 | 2048 | 8 | dense | 12.0 | 10.0 | — | 0.70 | 0.84 | — | 1.20x | "
            "— |") in md
    # one section per head configuration, GQA before MHA at one head_dim, D=64 first
    assert md.index("## Hq/Hk = 16/16, head_dim 64") < md.index("## Hq/Hk = 32/8, head_dim 128")
    assert "HBM peak of this GPU: 4.8 TB/s" in md
    assert "Largest |cute_fa − SDPA| over all rows (same inputs): 0.0039" in md
    assert "- FA4 on 1 row(s), first B=8 Sq=1 Sk=32768 H=32/8 D=128 paged 64: " \
           "`AssertionError: paged KV not supported`" in md
    assert "- B=64 Sq=1 Sk=131072 H=16/16 D=128 (68.7 GB of K/V): K/V over 40 GB" in md


def test_decode_targets():
    md = decode_markdown(_result())
    # dense rows with a competitor: 300 vs 350 (ok), 12 vs 10 (not), 8 vs 9 (ok)
    assert ("- cute_fa at or below the faster of SDPA and FA4 (dense): 2 of 3 shapes; worst "
            "1.20x (B=1 Sq=1 Sk=2048 H=32/8 D=128 dense)") in md
    # the 1 GiB rows only (the 8 MiB ones are under 64 MB): 3.58 ok, 3.36 and 2.98 not
    assert ("- cute_fa ≥ 3.5 TB/s where K/V ≥ 64 MB (dense and paged): 1 of 3 rows; lowest "
            "2.98 TB/s (B=8 Sq=1 Sk=32768 H=32/8 D=128 paged 256)") in md
    assert ("- cute_fa paged within 10% of dense (page size ≥ 64): 1 of 2 rows; worst 1.20x "
            "(B=8 Sq=1 Sk=32768 H=32/8 D=128 paged 256)") in md


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


class _FakeTimer:
    """Calls the function once and returns the next of the given times (ms)."""

    def __init__(self, *ms):
        self.times = list(ms)

    def ms(self, fn, nbytes):
        fn()
        return self.times.pop(0)


def _failing(*args):
    raise RuntimeError("no kernel")


@pytest.mark.parametrize("lower_right_us, mask_ms, mask_fn, want_us, want_out", [
    (500.0, 0.2, lambda *a: "mask", 200.0, "mask"),      # the mask is faster: taken
    (150.0, 0.2, lambda *a: "mask", 150.0, "lower"),     # slower: the lower-right one stays
    (None, 0.2, lambda *a: "mask", 200.0, "mask"),       # lower-right failed: the mask's
    (500.0, 0.2, _failing, 500.0, "lower"),              # the mask failed: noted, not taken
])
def test_faster_sdpa_variant(lower_right_us, mask_ms, mask_fn, want_us, want_out):
    import torch

    from cute_fa.bench import _faster_sdpa

    row = dict(kv_bytes=1, us=dict(cute_fa=100.0, sdpa_default=lower_right_us), check={},
               errors={} if lower_right_us else dict(sdpa_default="RuntimeError: x"))
    outs = {"sdpa_default": "lower"} if lower_right_us else {}
    _faster_sdpa(torch, _FakeTimer(mask_ms), row, outs, mask_fn, ())
    assert row["us"]["sdpa_default"] == want_us and outs.get("sdpa_default") == want_out
    assert row["sdpa_variants"]["causal_lower_right"] == lower_right_us
    if mask_fn is _failing:
        assert row["sdpa_variants"]["bool_mask"] is None
        assert row["errors"] == {"sdpa_bool_mask": "RuntimeError: no kernel"}
    else:
        assert row["sdpa_variants"]["bool_mask"] == 200.0 and row["errors"] == {}
