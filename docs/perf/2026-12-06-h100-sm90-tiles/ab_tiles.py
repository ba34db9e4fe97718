"""A/B of the wgmma forward's P conversion and its tiles (H200), in one process on the same
inputs, with the peers in run 1.

The change under test: P leaves the S accumulator through `convert.pack_pairs` (one
cvt.rn.bf16x2.f32 per pair) instead of `.load().to(dtype)`, whose truncations LLVM folded
through the mainloop's phi, so that each round carried P as float32 and converted it a value at
a time. On the CPU (ptxas) that freed enough registers for block_n 176 and 192 at head_dim 128
(212 and more bytes of spills before, none after) and for 192 at head_dim 64 on two warpgroups.

Variants per (head_dim, causal) class, each on every grid row (16k tokens, hidden 2048, S 1k-16k)
and every small-batch causal GQA prefill row of its class:
- `now`: what `auto` plans with the packed conversion (the shipped tile tables);
- `old`: the same keys compiled with the conversion as it was (PTX byte-identical to c474987's,
  checked on the CPU), swapped into the compiled-kernel cache for its calls;
- `n176`, `n192` (head_dim 128), `n192` (head_dim 64): the wgmma kernel forced to 128 x N on two
  consumer warpgroups, packed.

The rule, written before run 1 (`decide`):
1. The packed conversion ships if, in each class, old/now (time ratio) has a geometric mean of
   at least 0.99 over the class's rows and no row is below 0.97.
2. A candidate tile replaces a class's SM90_TILES entry if candidate/now speedup has a geometric
   mean >= 1.02 over the class's grid rows, no grid row < 0.98 and no prefill row < 0.97 (of
   the class's head_dim), in run 1 and again in run 2; the faster of two that qualify. Else,
   where it holds on the grid rows from some S on (the smallest such S), it becomes a long tile
   (SM90_LONG_TILES) from that S, if the class has none yet.

Usage: ab_tiles.py OUT RUN [peers]   (RUN 1 or 2; "peers" adds SDPA's backends and
flash-attn-4 to every row); ab_tiles.py OUT warm compiles the disk cache first."""
import json
import math
import os
import sys

import torch

import cute_fa
import cute_fa.kernels.common.convert as convert
from cute_fa.bench.common import (HIDDEN, SEQLENS, TOKENS, dense_peers, fastest_peer, flops,
                                  time_each, warm_gpu)
from cute_fa.bench.prefill import SMALL_HEADS, SMALL_SHAPES
from cute_fa.compile.build import compile_kernel
from cute_fa.compile.cache import compiled_kernels, get_kernel
from cute_fa.layouts import TileConfig
from cute_fa.runtime.plan import clear_plans, overriding

import cutlass.cute as cute

CANDIDATES = {64: {"n192": (128, 192, 256)}, 128: {"n176": (128, 176, 256),
                                                   "n192": (128, 192, 256)}}
HEAD_DIMS = (64, 128, 192, 256)


@cute.jit
def _old_pack(src, dst):
    dst.store(src.load().to(dst.element_type))


_packed = convert.pack_pairs
_old: dict = {}  # key -> the kernel compiled with the old conversion
_new: dict = {}  # key -> the shipped (packed) kernel
_state = [None]


def _keys_of(q, k, v, causal, backend="auto"):
    """The kernel keys `cute_fa.forward(q, k, v, causal=causal)` runs (planned, not compiled)."""
    from cute_fa.api.checks import check_forward
    from cute_fa.runtime.call import DENSE
    from cute_fa.runtime.device import device
    from cute_fa.runtime.plan import plan

    keys = plan(check_forward(DENSE, q, k, v, causal=causal, backend=backend),
                device(q.get_device()),
                compile=False).kernel_keys()
    clear_plans()
    return keys


def use(old: bool, keys) -> None:
    """The old or the packed kernels under these keys in the compiled-kernel cache."""
    if _state[0] == (old, tuple(keys)):
        return
    for key in keys:
        if key not in _new:
            _new[key] = get_kernel(key)
        if old and key not in _old:
            convert.pack_pairs = _old_pack
            try:
                _old[key] = compile_kernel(key)
            finally:
                convert.pack_pairs = _packed
        compiled_kernels[key] = (_old if old else _new)[key]
    clear_plans()
    _state[0] = (old, tuple(keys))


def methods(head_dim, causal, keys_of_row, peers):
    def now(q, k, v):
        use(False, keys_of_row())
        return cute_fa.forward(q, k, v, causal=causal)

    def old(q, k, v):
        use(True, keys_of_row())
        return cute_fa.forward(q, k, v, causal=causal)

    found = {"now": now, "old": old}
    for name, (block_m, block_n, threads) in CANDIDATES.get(head_dim, {}).items():
        tile = TileConfig(head_dim=head_dim, block_m=block_m, block_n=block_n,
                          num_threads=threads, dtype="bfloat16", wgmma=True)

        def run(q, k, v, tile=tile):
            use(False, ())
            with overriding(tile=tile):
                return cute_fa.forward(q, k, v, causal=causal, backend="sm90")
        found[name] = run
    if peers:
        found.update({n: (lambda q, k, v, f=f: f(q, k, v, causal))
                      for n, f in dense_peers(torch).items()})
    return found


def shapes():
    for d in HEAD_DIMS:
        for causal in (False, True):
            for s in SEQLENS:
                yield "grid", d, causal, TOKENS // s, s, HIDDEN // d, HIDDEN // d
    for hq, hk, d in SMALL_HEADS:
        for b, s in SMALL_SHAPES:
            yield "prefill", d, True, b, s, hq, hk


def _geo(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summary(rows):
    """Per class: old/now and candidate/now geometric means and extremes."""
    out = {}
    for d in HEAD_DIMS:
        for causal in (False, True):
            mine = [r for r in rows if r["head_dim"] == d and r["causal"] == causal]
            if not mine:
                continue
            cls = {}
            for name in ["old"] + list(CANDIDATES.get(d, {})):
                for kind in ("grid", "prefill"):
                    xs = [r["us"][name] / r["us"]["now"] for r in mine if r["kind"] == kind
                          and r["us"].get(name) and r["us"].get("now")]
                    if name != "old":
                        xs = [1 / x for x in xs]  # the candidate's speedup over now
                    if xs:
                        cls[f"{name}/{kind}"] = dict(geo=round(_geo(xs), 4),
                                                     lo=round(min(xs), 3), hi=round(max(xs), 3))
            out[f"d{d} {'causal' if causal else 'full'}"] = cls
    return out


def decide(rows):
    """The rule of the docstring on one run's rows (run 2 repeats it; both must agree)."""
    result = {}
    for d in HEAD_DIMS:
        for causal in (False, True):
            mine = [r for r in rows if r["head_dim"] == d and r["causal"] == causal]
            if not mine:
                continue
            mine = [r for r in mine if all(r["us"].get(n) for n in
                                           ["now", "old"] + list(CANDIDATES.get(d, {})))]
            ratios = [r["us"]["old"] / r["us"]["now"] for r in mine]
            entry = dict(packed_ships=_geo(ratios) >= 0.99 and min(ratios) >= 0.97)
            best = None
            for name in CANDIDATES.get(d, {}):
                grid = [r for r in mine if r["kind"] == "grid"]
                sp = {r["seqlen"]: r["us"]["now"] / r["us"][name] for r in grid}
                pre = [r["us"]["now"] / r["us"][name] for r in mine if r["kind"] == "prefill"]
                whole = (_geo(list(sp.values())) >= 1.02 and min(sp.values()) >= 0.98
                         and all(x >= 0.97 for x in pre))
                long_from = None
                for s in sorted(sp):
                    tail = [x for t, x in sp.items() if t >= s]
                    pre_tail = [r["us"]["now"] / r["us"][name] for r in mine
                                if r["kind"] == "prefill" and r["seqlen"] >= s]
                    if (_geo(tail) >= 1.02 and min(tail) >= 0.98
                            and all(x >= 0.97 for x in pre_tail)):
                        long_from = s
                        break
                entry[name] = dict(whole=whole, long_from=long_from,
                                   geo=round(_geo(list(sp.values())), 4))
                if whole and (best is None or entry[name]["geo"] > entry[best]["geo"]):
                    best = name
            entry["tile"] = best
            result[f"d{d} {'causal' if causal else 'full'}"] = entry
    return result


def _compile(key):
    from cute_fa.compile.cache import wait_for_saves

    get_kernel(key)
    wait_for_saves()
    return repr(key)


def warm(workers=14):
    """Every key a row's `now` and candidate calls plan, compiled into the disk cache by a pool
    of processes (the old conversion's kernels compile in the timed process: same keys)."""
    import multiprocessing as mp

    keys = set()
    for kind, d, causal, b, s, hq, hk in shapes():
        q = torch.empty(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.empty(b, s, hk, d, device="cuda", dtype=torch.bfloat16)
        keys.update(_keys_of(q, k, k, causal))
        for block_m, block_n, threads in CANDIDATES.get(d, {}).values():
            with overriding(tile=TileConfig(head_dim=d, block_m=block_m, block_n=block_n,
                                            num_threads=threads, dtype="bfloat16",
                                            wgmma=True)):
                keys.update(_keys_of(q, k, k, causal, "sm90"))
    with mp.get_context("spawn").Pool(workers) as pool:
        for done in pool.imap_unordered(_compile, sorted(keys, key=repr)):
            print(done, flush=True)


def main(out_dir, run, peers):
    os.makedirs(out_dir, exist_ok=True)
    warm_gpu(torch)
    rows = []
    name = f"run{run}"
    for kind, d, causal, b, s, hq, hk in shapes():
        g = torch.Generator(device="cuda").manual_seed(run * 7919 + b * s + hq + d)
        q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
                for _ in range(2))
        row_keys = []

        def keys_of_row():
            if not row_keys:
                row_keys.extend(_keys_of(q, k, v, causal))
            return row_keys
        fns = {n: (lambda f=f: f(q, k, v))
               for n, f in methods(d, causal, keys_of_row, peers).items()}
        us, errors, outs = time_each(torch, fns, reps=20, keep_outputs=True)
        again, _, _ = time_each(torch, dict(reversed(list(fns.items()))), reps=20)
        us = {n: (min(u, again[n]) if u and again.get(n) else u) for n, u in us.items()}
        ref = outs["now"].float()
        peer, peer_us = fastest_peer(us)
        ours = [n for n in us if n not in ("sdpa_default", "sdpa_flash", "sdpa_cudnn",
                                           "flash_attn_4")]
        row = dict(kind=kind, head_dim=d, causal=causal, batch=b, seqlen=s, heads_q=hq,
                   heads_kv=hk, us=us, errors=errors, fastest_peer=peer,
                   keys=[repr(x) for x in row_keys],
                   old_bitwise_equal=bool(torch.equal(outs["old"], outs["now"])),
                   max_abs_vs_now={n: float((outs[n].float() - ref).abs().max())
                                   for n in ours if n in outs},
                   vs_fastest={n: round(peer_us / us[n], 3) for n in ours
                               if peer and us.get(n)},
                   tflops={n: round(flops(b, hq, s, d, causal) / u / 1e6, 1)
                           for n, u in us.items() if u})
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump(dict(rows=rows), f, indent=1)
        del q, k, v, fns, outs
        torch.cuda.empty_cache()
    result = dict(rows=rows, summary=summary(rows), decision=decide(rows))
    print(json.dumps(result["summary"], indent=1))
    print(json.dumps(result["decision"], indent=1))
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    if sys.argv[2] == "warm":
        warm()
    else:
        main(sys.argv[1], int(sys.argv[2]), len(sys.argv) > 3 and sys.argv[3] == "peers")
