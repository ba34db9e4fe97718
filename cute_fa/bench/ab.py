"""Same-process A/B of the wgmma backward's tile tables (GPU): each variant patches one entry
of a `cute_fa.tuning_bwd` table, every variant of a row and (where asked) every peer runs on the
same inputs in one process, so that a table change is judged against the tiles it would
replace, not against another process's clocks. The scripts under docs/perf describe their
variants and shapes and call `run`.

Per row: µs per backward of each variant and peer (`common.time_each`, the best of two passes
of `reps` calls in opposite orders), the speedup of each variant over its group's reference,
its ratio to the fastest peer timed, the largest difference of its gradients from the
reference's (softcap variants, whose logits differ, are left out), and for deterministic
variants whether two calls agree bit for bit. The first call of each variant compiles in a
pool of spawned processes first (they share the on-disk cache), so compile time stays out of
the timed process.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from dataclasses import dataclass

from .backward import BACKWARD_WORK, peer_pairs
from .common import fastest_peer, flops, time_each, warm_gpu

TABLES = ("BWD_SM90_TILES", "BWD_SM90_DETERMINISTIC_TILES", "BWD_SM90_SOFTCAP_TILES",
          "BWD_SM90_DETERMINISTIC_SOFTCAP_TILES")
SOFTCAP = 30.0


@dataclass(frozen=True)
class Shape:
    """One row: `group` names the variants that run on it (e.g. "d128")."""

    group: str
    batch: int
    heads_q: int
    heads_kv: int
    seqlen: int
    head_dim: int
    causal: bool


@dataclass(frozen=True)
class Variant:
    """`entry` in tuning's `table` at head_dim's class (the entry format of
    `tuning_bwd.bwd_sm90_entry_tile`), run on the rows of `group`, called with `deterministic`
    and a softcap or not."""

    group: str
    head_dim: int
    table: str
    entry: tuple
    deterministic: bool = False
    softcap: bool = False

    def __post_init__(self):
        from ..tuning_bwd import bwd_sm90_entry_tile

        if self.table not in TABLES:
            raise ValueError(f"table must be one of {TABLES}, got {self.table!r}")
        bwd_sm90_entry_tile(self.entry, "bfloat16", self.head_dim)  # a tile, or it raises


_BASE: dict = {}
_CURRENT: list = [None]


def use(variants: dict, name) -> None:
    """Put the tables back as imported, then `variants[name]`'s entry in (None: none), and
    drop the plans made with the tables before."""
    import cute_fa.tuning_bwd as tuning
    from cute_fa.runtime.plan import clear_plans

    if _CURRENT[0] == name:
        return
    if not _BASE:
        _BASE.update({t: dict(getattr(tuning, t)) for t in TABLES})
    for table, entries in _BASE.items():
        setattr(tuning, table, dict(entries))
    if name is not None:
        v = variants[name]
        getattr(tuning, v.table)[tuning.head_dim_class(v.head_dim)] = v.entry
    clear_plans()
    _CURRENT[0] = name


def _inputs(torch, shape: Shape, softcap: bool):
    import cute_fa

    g = torch.Generator(device="cuda").manual_seed(shape.seqlen + shape.batch + shape.heads_q
                                                   + shape.head_dim)
    dims = (shape.batch, shape.seqlen)
    q, do = (torch.randn(*dims, shape.heads_q, shape.head_dim, device="cuda",
                         dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(*dims, shape.heads_kv, shape.head_dim, device="cuda",
                        dtype=torch.bfloat16, generator=g) for _ in range(2))
    o, lse = cute_fa.forward(q, k, v, causal=shape.causal, return_lse=True)
    capped = (cute_fa.forward(q, k, v, causal=shape.causal, return_lse=True, softcap=SOFTCAP)
              if softcap else (None, None))
    return q, k, v, do, (o, lse), capped


def _call(variants: dict, name, shape: Shape, inputs):
    import cute_fa

    q, k, v, do, plain, capped = inputs
    var = variants[name]

    def fn():
        use(variants, name)
        if var.softcap:
            return cute_fa.backward(do, q, k, v, *capped, shape.causal, softcap=SOFTCAP,
                                    deterministic=var.deterministic, backend="sm90")
        return cute_fa.backward(do, q, k, v, *plain, shape.causal,
                                deterministic=var.deterministic, backend="sm90")
    return fn


def _warm(job):
    import torch

    from cute_fa.compile.cache import wait_for_saves

    variants, name, shape = job
    _call(variants, name, shape, _inputs(torch, shape, variants[name].softcap))()
    torch.cuda.synchronize()
    wait_for_saves()


def run(out_dir: str, shapes: list, variants: dict, reference: dict, *, peers=False,
        reps: int = 10, workers: int = 14, name: str = "ab") -> list:
    """Time `variants` (name -> Variant) on `shapes`, each row's variants those of its group,
    against `reference[group]` (a variant's name); with peers, SDPA's backends and
    flash-attn-4 on the rows at S = 4k/8k and on GQA rows (peers="all": every row). Writes
    out_dir/<name>.json after each row and returns the rows."""
    import torch

    for shape in shapes:
        wrong = [n for n, v in variants.items()
                 if v.group == shape.group and v.head_dim != shape.head_dim]
        if wrong:
            raise ValueError(f"variants {wrong} of group {shape.group!r} are not for its "
                             f"head_dim {shape.head_dim}")
    missing = {n for n in reference.values() if n not in variants}
    if missing:
        raise ValueError(f"reference names variants that are not there: {sorted(missing)}")
    os.makedirs(out_dir, exist_ok=True)
    start = time.time()
    # the first call of each variant on the shortest shape of its group and causality
    jobs = []
    for n, v in variants.items():
        for causal in (False, True):
            rows = [s for s in shapes if s.group == v.group and s.causal == causal]
            if rows:
                jobs.append((variants, n, min(rows, key=lambda s: s.seqlen)))
    with mp.get_context("spawn").Pool(min(workers, len(jobs))) as pool:
        pool.map(_warm, jobs, chunksize=1)
    print("warm", round(time.time() - start), flush=True)
    warm_gpu(torch)
    rows = []
    for shape in shapes:
        mine = [n for n, v in variants.items() if v.group == shape.group]
        inputs = _inputs(torch, shape, any(variants[n].softcap for n in mine))
        q, k, v, do = inputs[:4]
        fns = {n: _call(variants, n, shape, inputs) for n in mine}
        if peers == "all" or (peers and (shape.seqlen in (4096, 8192)
                                         or shape.heads_q != shape.heads_kv)):
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            fns.update({peer: pair[0] for peer, pair in
                        peer_pairs(torch, leaves, do, shape.causal).items()})  # backward only
        us, errors, outs = time_each(torch, fns, reps=reps, keep_outputs=True)
        again, _, _ = time_each(torch, dict(reversed(list(fns.items()))), reps=reps)
        us = {n: (min(u, again[n]) if u and again.get(n) else u) for n, u in us.items()}
        ref = reference[shape.group]
        diff, bitwise = {}, {}
        for n in mine:
            if n in outs and ref in outs and not variants[n].softcap:
                diff[n] = max(float((a.float() - r.float()).abs().max())
                              for a, r in zip(outs[n], outs[ref]))
            if variants[n].deterministic:
                first, second = fns[n](), fns[n]()
                bitwise[n] = all(torch.equal(x, y) for x, y in zip(first, second))
        fastest, fastest_us = fastest_peer(us)
        work = BACKWARD_WORK * flops(shape.batch, shape.heads_q, shape.seqlen, shape.head_dim,
                                     shape.causal)
        row = dict(shape=list(vars(shape).values()), us=us, errors=errors, diff_vs_ref=diff,
                   det_bitwise=bitwise,
                   tflops={n: round(work / u / 1e6, 1) for n, u in us.items() if u},
                   fastest_peer=fastest,
                   speedup_vs_ref={n: round(us[ref] / us[n], 3) for n in mine
                                   if us.get(n) and us.get(ref)},
                   vs_fastest={n: round(fastest_us / us[n], 3) for n in mine
                               if fastest and us.get(n)})
        print(json.dumps(row), flush=True)
        rows.append(row)
        del inputs, fns, outs
        torch.cuda.empty_cache()
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump(rows, f, indent=1)
    use(variants, None)
    print("done", round(time.time() - start), flush=True)
    return rows
