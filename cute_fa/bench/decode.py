"""Decode benchmark: a few new queries per sequence against a long KV cache (issue 14).

python -m cute_fa bench --decode --out DIR  writes decode.json, decode.md and decode.png.
Every method runs on the same inputs in one process: cute_fa.forward (dense and paged), torch
SDPA (default, flash, cuDNN) and flash-attn-4 (dense, and paged through its page_table argument).
The numbers are GPU time per call (`common.gpu_time_us`: the host's launch hidden behind a spin
for every method alike) with a cold L2 (a 256 MB write between samples, outside the events), and
the bandwidth that time gives for reading K and V once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import tuning
from .common import (PEERS, cell, error_lines, fastest_peer, first, flash_attn_4, hbm_peak_tbps,
                     label, peer_fields, ratio, ratio_summary, run_info, sdpa_peer,
                     small_call_lines, small_calls, time_each, timer_note, times_cell,
                     versions_line, vs_fastest_peer, warm_gpu, write_files)

DECODE_BATCHES = (1, 8, 32, 64)
DECODE_SEQLENS_K = (2048, 8192, 32768, 131072)
DECODE_SEQLENS_Q = (1, 4)
DECODE_HEADS = ((32, 8), (64, 8), (16, 16))  # (query heads, KV heads): GQA 4, GQA 8, MHA
DECODE_HEAD_DIMS = (64, 128)
DECODE_PAGE_SIZES = (64, 256)
DECODE_DTYPE = "bfloat16"
# Shapes whose K/V would pass this are skipped: the one cache buffer (K and V of the largest
# shape kept, 34 GB) plus the flush buffer and outputs stay far below the H200's 141 GB, and
# below the ~60 GB the benchmark allows itself.
DECODE_MAX_KV_BYTES = 40e9
# A run that has taken this long skips the shapes left (listed in the report as such), so the
# report is always written within the device tool's 10-minute command limit.
DECODE_TIME_BUDGET_S = 330.0
# Written between two samples, outside the events: the K/V of the previous call are then no
# longer in the L2 (a model runs other layers between two attention calls of one layer)
FLUSH_BYTES = 256 * 2**20
METHODS = ("cute_fa",) + PEERS
BIG_KV_BYTES = 64 * 2**20  # the bandwidth target holds from 64 MB of K/V up
TARGET_TBPS = 3.5


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


def decode_methods(torch):
    """(dense, paged, bool_mask): {name: fn(q, k, v) -> o} for the dense cache, {name: fn(q,
    k_pages, v_pages, page_table, seqused_k) -> o} for the paged one, and each SDPA peer's
    second way of taking Sq > 1 (an explicit mask); causal (bottom-right) throughout."""
    import cute_fa
    from torch.nn.attention.bias import causal_lower_right

    masks: dict = {}

    def mask_of(q, k):
        # key j visible to query i where j <= i + Sk - Sq; one mask kept, for the shape at hand
        key = (q.shape[1], k.shape[1], q.device)
        if key not in masks:
            masks.clear()
            sq, sk = key[:2]
            masks[key] = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        return masks[key]

    def lower_right(f):
        def run(q, k, v):
            sq, sk = q.shape[1], k.shape[1]
            if sq == 1:
                # one query sees every key under bottom-right causal: no mask is the same thing
                # (torch's is_causal=True is top-left, which would leave it key 0 only)
                return f(q, k, v)
            # torch's own lower-right causal bias: it dispatches to the flash kernel's
            # bottom-right flag where it can, instead of materialising a (Sq, Sk) mask
            return f(q, k, v, attn_mask=causal_lower_right(sq, sk))
        return run

    def bool_mask(f):
        # the other way a user writes it. Which is faster depends on the shape (on the H200 at
        # Sq = 4 the flash kernel has no split over the keys; the mask takes another kernel),
        # so both are timed
        return lambda q, k, v: f(q, k, v, attn_mask=mask_of(q, k))

    sdpa = {name: sdpa_peer(torch, name) for name in PEERS[:3]}
    dense = {"cute_fa": lambda q, k, v: cute_fa.forward(q, k, v, causal=True)}
    dense.update({name: lower_right(f) for name, f in sdpa.items()})
    paged = {
        "cute_fa": lambda q, k, v, page_table, seqused_k: cute_fa.forward(
            q, k, v, causal=True, page_table=page_table, seqused_k=seqused_k),
    }
    fa4 = flash_attn_4()
    if fa4 is not None:
        # flash-attn-4's causal is bottom-right, like cute_fa's. It takes a page table only in
        # its varlen entry point, where q may stay (B, Sq, H, D)
        dense["flash_attn_4"] = lambda q, k, v: first(fa4[0](q, k, v, causal=True))
        paged["flash_attn_4"] = lambda q, k, v, page_table, seqused_k: first(fa4[1](
            q, k, v, page_table=page_table, seqused_k=seqused_k, causal=True))
    return dense, paged, {name: bool_mask(f) for name, f in sdpa.items()}


def decode_reps(nbytes: int) -> int:
    """Samples per timing: ~0.1 s of kernel time at ~3 TB/s, 5 to 25."""
    est_s = nbytes / 3e12 + 20e-6
    return int(min(25, max(5, 0.1 / est_s)))


def _time_into(torch, row: dict, methods: dict, args, flush) -> dict:
    """Each method on `args`, timed into row['us'] (µs; failures in row['errors']); returns the
    outputs of those that ran."""
    us, errors, outs = time_each(torch, {n: (lambda f=f: f(*args)) for n, f in methods.items()},
                                 reps=decode_reps(row["kv_bytes"]), between=flush.zero_,
                                 warmup_s=0.0, warmup_calls=3, keep_outputs=True)
    row["us"].update(us)
    row["errors"].update(errors)
    return outs


def keep_faster_way(row: dict, name: str, mask_us, mask_error) -> bool:
    """row['us'][name] holds SDPA peer `name`'s time with the lower-right bias (None where that
    failed); mask_us its time with the explicit mask (None where that failed, mask_error saying
    why). Both go into row['sdpa_variants'][name]; row['us'][name] keeps the faster. Returns
    whether the mask's way was taken."""
    lower = row["us"].get(name)
    row.setdefault("sdpa_variants", {})[name] = {"causal_lower_right": lower, "bool_mask": mask_us}
    if mask_error:
        row["errors"][name + "_bool_mask"] = mask_error
    taken = mask_us is not None and (lower is None or mask_us < lower)
    if taken:
        row["us"][name] = mask_us
        row["errors"].pop(name, None)
    return taken


def _max_diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


def _fill_randn(torch, flat, gen, chunk=2**28):
    """Standard normal values into a large 1-D tensor, in chunks (no int32 index limits, and
    no float32 temporary of the whole buffer)."""
    for i in range(0, flat.numel(), chunk):
        part = flat[i:i + chunk]
        part.copy_(torch.randn(part.numel(), device=flat.device, dtype=torch.float32,
                               generator=gen))


def _finish(row: dict, outs: dict) -> dict:
    """The checks against cute_fa's output and the fastest peer, then the row is printed."""
    for name in PEERS:
        if "cute_fa" in outs and name in outs:
            row["check"][name] = _max_diff(outs["cute_fa"], outs[name])
    row.update(peer_fields(row["us"]))
    print(json.dumps(row), flush=True)
    return row


def decode_results(torch, quick: bool = False, time_budget_s: float = DECODE_TIME_BUDGET_S):
    """Time every method on every decode shape. Returns (rows, skipped).

    One row per (shape, layout): layout 'dense', or 'paged' with its page_size. A row holds
    `us` (µs per call by method, None where the call failed, with the message in `errors`),
    `check`: the largest difference between cute_fa and each peer's output on the same inputs
    (a broken kernel shows there; the GPU tests are the real correctness check), and the
    fastest peer (`best_peer`, `best_peer_us`, `vs_best_peer`). Dense rows with Sq > 1 also hold
    `sdpa_variants`, each SDPA peer's time with each way of giving it the bottom-right mask;
    its `us` is the faster.
    """
    kept, skipped = decode_shapes(quick)
    skipped = [dict(s, reason="K/V over %.0f GB" % (DECODE_MAX_KV_BYTES / 1e9)) for s in skipped]
    dense_methods, paged_methods, mask_ways = decode_methods(torch)
    dtype = getattr(torch, DECODE_DTYPE)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    # One cache buffer for every shape: K and V of each shape are views into it, so the largest
    # shape sets the memory used and no shape allocates (or generates random numbers) again.
    pool = torch.empty(max(s["kv_bytes"] for s in kept) // 2, device="cuda", dtype=dtype)
    _fill_randn(torch, pool, gen)
    warm_gpu(torch)

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
        outs = _time_into(torch, row, dense_methods, (q, k, v), flush)
        if sq > 1:
            masked = dict(row, us={}, errors={})
            mask_outs = _time_into(torch, masked, mask_ways, (q, k, v), flush)
            for name in mask_ways:
                if keep_faster_way(row, name, masked["us"].get(name),
                                   masked["errors"].get(name)):
                    outs[name] = mask_outs[name]
        rows.append(_finish(row, outs))
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
            outs = _time_into(torch, row, paged_methods, (q, kp, vp, page_table, seqused_k),
                              flush)
            rows.append(_finish(row, outs))
            del outs
    del pool
    torch.cuda.empty_cache()
    return rows, skipped


SMALL_CALL = dict(batch=1, seqlen_q=1, seqlen_k=4096, heads_q=32, heads_kv=8, head_dim=128,
                  page_size=64)


def small_call_table(torch) -> dict:
    """GPU time and host cost of one decode call per method, dense and paged (SMALL_CALL): a
    decode step's host path can be as long as its kernel, which the GPU times hide."""
    dense, paged, _ = decode_methods(torch)
    s = SMALL_CALL
    b, sk, hk, d, page = s["batch"], s["seqlen_k"], s["heads_kv"], s["head_dim"], s["page_size"]
    dtype = getattr(torch, DECODE_DTYPE)
    q = torch.randn(b, s["seqlen_q"], s["heads_q"], d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=dtype) for _ in range(2))
    pages = b * sk // page
    page_table = torch.arange(pages, device="cuda", dtype=torch.int32).view(b, sk // page)
    seqused_k = torch.full((b,), sk, device="cuda", dtype=torch.int32)
    kp, vp = k.view(pages, page, hk, d), v.view(pages, page, hk, d)
    fns = {n: (lambda f=f: f(q, k, v)) for n, f in dense.items()}
    fns.update({f"{n}_paged": (lambda f=f: f(q, kp, vp, page_table, seqused_k))
                for n, f in paged.items()})
    table = small_calls(torch, fns)
    print(json.dumps(table), flush=True)
    return table


# --- the report: plain functions of the results dict (they run, and are tested, on a CPU)

def _tbps(row, us) -> float | None:
    return row["kv_bytes"] / (us * 1e-6) / 1e12 if us else None


def _dense_of(rows):
    """(shape -> dense row), to put paged next to dense."""
    key = ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim")
    return {tuple(r[k] for k in key): r for r in rows if r["layout"] == "dense"}, key


def _paged_over_dense(r, dense_of, key):
    """cute_fa paged's time over cute_fa dense's on the same shape, or None."""
    dr = dense_of.get(tuple(r[k] for k in key))
    if r["layout"] != "paged" or not dr:
        return None
    return ratio(r["us"].get("cute_fa"), dr["us"].get("cute_fa"))


def _shape_name(r) -> str:
    layout = "dense" if r["layout"] == "dense" else f"paged {r['page_size']}"
    return (f"B={r['batch']} Sq={r['seqlen_q']} Sk={r['seqlen_k']} "
            f"H={r['heads_q']}/{r['heads_kv']} D={r['head_dim']} {layout}")


def decode_targets(rows) -> list:
    """The issue's three targets, each as one line: how many rows meet it, and the worst."""
    dense_of, key = _dense_of(rows)
    lines = []
    dense = [(vs_fastest_peer(r["us"]), r) for r in rows if r["layout"] == "dense"]
    dense = [(x, r) for x, r in dense if x is not None]
    if dense:
        ok = sum(x >= 1.0 for x, _ in dense)
        worst, r = min(dense, key=lambda x: x[0])
        lines.append(f"cute_fa at least as fast as the fastest peer (dense): {ok} of "
                     f"{len(dense)} shapes; slowest {worst:.2f}x ({_shape_name(r)})")
    big = [(_tbps(r, r["us"].get("cute_fa")), r) for r in rows
           if r["kv_bytes"] >= BIG_KV_BYTES and r["us"].get("cute_fa")]
    if big:
        ok = sum(t >= TARGET_TBPS for t, _ in big)
        low, r = min(big, key=lambda x: x[0])
        lines.append(f"cute_fa ≥ {TARGET_TBPS} TB/s where K/V ≥ 64 MB (dense and paged): "
                     f"{ok} of {len(big)} rows; lowest {low:.2f} TB/s ({_shape_name(r)})")
    paged = [(_paged_over_dense(r, dense_of, key), r) for r in rows
             if r["layout"] == "paged" and r["page_size"] >= 64]
    paged = [(x, r) for x, r in paged if x is not None]
    if paged:
        ok = sum(x <= 1.1 for x, _ in paged)
        worst, r = max(paged, key=lambda x: x[0])
        lines.append(f"cute_fa paged within 10% of dense (page size ≥ 64): {ok} of {len(paged)} "
                     f"rows; worst {worst:.2f}x ({_shape_name(r)})")
    return lines


def decode_markdown(result: dict) -> str:
    """The report of a decode run (the dict `main` writes to decode.json) as markdown."""
    rows = result["rows"]
    peak = result.get("hbm_peak_tbps")
    lines = [f"# cute_fa decode, {result['device']}, {result['date']}", "",
             versions_line(result) + f" {result['dtype']}, causal bottom-right (query i of Sq "
             "sees keys j ≤ i + Sk − Sq), every one of the Sk keys valid.", "",
             timer_note(result.get("reps", "5-25")), "",
             "Between two samples, outside the events: a 256 MB write that evicts the previous "
             "call's K/V from the L2. TB/s: bytes of K and V read (B·Sk·Hk·D·2 bytes·2) ÷ "
             "that time. " + (f"HBM peak of this GPU: {peak} TB/s (datasheet)." if peak else
                         "No HBM peak is listed for this GPU (common.HBM_PEAK_TBPS)."), "",
             "Methods, all on the same inputs: **cute_fa** `cute_fa.forward(q, k, v, causal=True)`"
             "; paged: `forward(q, k_pages, v_pages, causal=True, page_table=, seqused_k=)`. "
             "**SDPA** `F.scaled_dot_product_attention` on (B, H, S, D) transposes, "
             "`enable_gqa=True` where Hq ≠ Hk: default (torch's choice, no `sdpa_kernel` "
             "context), flash and cuDNN (pinned by `sdpa_kernel`); Sq = 1 without a mask (one "
             "query sees every key); Sq > 1 (torch's `is_causal` is top-left): the faster of "
             "`attn_mask=causal_lower_right(Sq, Sk)` and an explicit boolean (Sq, Sk) mask, both "
             "timed (decode.json: `sdpa_variants`). **FA4** `flash_attn.cute.flash_attn_func(q, "
             "k, v, causal=True)`; paged: `flash_attn_varlen_func(q, k_pages, v_pages, "
             "page_table=, seqused_k=, causal=True)`. SDPA has no paged cache: its paged cells "
             "are empty.", "",
             "Paged: the dense cache's memory seen as pages of `page_size` keys, handed to the "
             "sequences in a random order (`torch.randperm`), `seqused_k` = Sk: the paged calls "
             "read the same bytes as the dense ones. `fastest peer`: the fastest of the peers "
             "on that row; `vs fastest peer`: its time ÷ cute_fa's (cute_fa's speed over its; "
             "≥ 1.0: cute_fa at least as fast); `paged/dense`: cute_fa paged's time ÷ cute_fa "
             "dense's.", ""]
    if "split_kv_one_launch" in result:
        lines += ["Split-KV calls (`num_splits` > 1): `tuning.DECODE_FUSED_MERGE` = "
                  f"{result['split_kv_one_launch']!r}: one launch (each query block's last CTA "
                  "merges the partials) where `tuning.decode_fused_merge` says so, else the "
                  "split kernel and then the merge kernel.", ""]
    if result.get("l2_bytes"):
        lines += [f"K/V under the L2's {result['l2_bytes'] / 2**20:.0f} MB can still be partly "
                  "served from it despite the flush writes; their TB/s is not an HBM figure.", ""]
    targets = decode_targets(rows)
    if targets:
        lines += ["## Targets (issue 14)", ""] + [f"- {t}" for t in targets] + [""]
    lines += [ratio_summary(vs_fastest_peer(r["us"]) for r in rows), ""]

    dense_of, key = _dense_of(rows)
    groups = sorted({(r["head_dim"], r["heads_q"], r["heads_kv"]) for r in rows},
                    key=lambda g: (g[0], -(g[1] // g[2]), g[1]))
    head = (["B", "Sq", "Sk", "K/V MB", "layout"] + [f"{label(n)} µs" for n in METHODS]
            + ["fastest peer", "cute_fa TB/s", "fastest peer TB/s", "vs fastest peer",
               "paged/dense"])
    for d, hq, hk in groups:
        lines += [f"## Hq/Hk = {hq}/{hk}, head_dim {d}", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        sel = [r for r in rows if (r["head_dim"], r["heads_q"], r["heads_kv"]) == (d, hq, hk)]
        sel.sort(key=lambda r: (r["seqlen_q"], r["batch"], r["seqlen_k"], r["page_size"] or 0))
        for r in sel:
            peer, peer_us = fastest_peer(r["us"])
            layout = "dense" if r["layout"] == "dense" else f"paged {r['page_size']}"
            cells = ([str(r["batch"]), str(r["seqlen_q"]), str(r["seqlen_k"]),
                      f"{r['kv_bytes'] / 2**20:.0f}", layout]
                     + [cell(r["us"].get(n), ".1f") for n in METHODS]
                     + [label(peer), cell(_tbps(r, r["us"].get("cute_fa")), ".2f"),
                        cell(_tbps(r, peer_us), ".2f"), times_cell(vs_fastest_peer(r["us"])),
                        times_cell(_paged_over_dense(r, dense_of, key))])
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")

    if result.get("small_call"):
        s = SMALL_CALL
        lines += small_call_lines(
            result["small_call"], f"## One decode call (B={s['batch']}, Sq={s['seqlen_q']}, "
            f"Sk={s['seqlen_k']}, H={s['heads_q']}/{s['heads_kv']}, D={s['head_dim']}, paged: "
            f"pages of {s['page_size']}; its 8 MB of K/V stay in the L2, no flush)")
    checks = [(v, n, r) for r in rows for n, v in r.get("check", {}).items()]
    if checks:
        worst, name, r = max(checks, key=lambda x: x[0])
        lines += [f"Largest |cute_fa − {label(name)}| over all rows (same inputs): "
                  f"{worst:.3g} ({_shape_name(r)}).", ""]
    lines += error_lines(rows, _shape_name)
    if result.get("skipped"):
        lines += ["## Skipped shapes", ""]
        for s in result["skipped"]:
            lines.append(f"- B={s['batch']} Sq={s['seqlen_q']} Sk={s['seqlen_k']} "
                         f"H={s['heads_q']}/{s['heads_kv']} D={s['head_dim']} "
                         f"({s['kv_bytes'] / 1e9:.1f} GB of K/V): {s['reason']}")
        lines.append("")
    return "\n".join(lines)


_COLORS = {"cute_fa": "tab:blue", "sdpa_default": "tab:orange", "sdpa_flash": "tab:red",
           "sdpa_cudnn": "tab:purple", "flash_attn_4": "tab:green"}


def _decode_plot(result: dict, path: Path) -> None:
    """TB/s against K/V bytes, one panel per Sq, one series per (method, layout), each row's
    fastest peer ringed, with the HBM peak as a horizontal line: how close each method gets to
    the roofline as the cache grows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    sqs = sorted({r["seqlen_q"] for r in rows}) or [1]
    fig, axes = plt.subplots(1, len(sqs), figsize=(6.5 * len(sqs), 5), squeeze=False)
    series = sorted({(n, r["page_size"]) for r in rows for n in METHODS if r["us"].get(n)},
                    key=lambda s: (METHODS.index(s[0]), s[1] or 0))
    markers = {None: "o", 64: "^", 256: "s"}
    for ax, sq in zip(axes.ravel(), sqs):
        for name, page in series:
            sel = [r for r in rows if r["seqlen_q"] == sq and r["page_size"] == page
                   and r["us"].get(name)]
            ax.scatter([r["kv_bytes"] for r in sel], [_tbps(r, r["us"][name]) for r in sel],
                       s=14, alpha=0.75, color=_COLORS[name], marker=markers.get(page, "x"),
                       label=label(name) + (f" paged {page}" if page else " dense"))
        best = [(r["kv_bytes"], _tbps(r, fastest_peer(r["us"])[1])) for r in rows
                if r["seqlen_q"] == sq and fastest_peer(r["us"])[1]]
        if best:
            ax.scatter(*zip(*best), s=40, facecolors="none", edgecolors="black", linewidths=0.7,
                       label="fastest peer (ringed)")
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
    write_files(out_dir, "decode", result, decode_markdown(result), _decode_plot)


def main(out_dir: str, quick: bool = False) -> dict:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    result = dict(run_info(torch), reps="5-25", dtype=DECODE_DTYPE, causal=True,
                  l2_bytes=getattr(props, "L2_cache_size", None))
    result["hbm_peak_tbps"] = hbm_peak_tbps(result["device"])
    result["split_kv_one_launch"] = tuning.DECODE_FUSED_MERGE
    t = time.perf_counter()
    result["rows"], result["skipped"] = decode_results(torch, quick=quick)
    result["seconds"] = time.perf_counter() - t
    result["small_call"] = small_call_table(torch)
    write_decode_report(result, Path(out_dir))
    print((Path(out_dir) / "decode.md").read_text())
    return result
