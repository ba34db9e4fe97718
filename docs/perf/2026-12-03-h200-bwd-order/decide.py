"""Read ab_order.json, choose per table slot (rule fixed before the run): the candidate with the
highest geometric-mean speedup over the slot's reference on the slot's rows, taken only if that
mean >= 1.01, no row below 0.98, deterministic ones bitwise on every row."""
import json, math, sys
sys.path.insert(0, "docs/perf/2026-12-03-h200-bwd-order")
from ab_order import VARIANTS

rows = json.load(open(sys.argv[1]))
SLOTS = {("BWD_SM90_TILES", 128): ("d128", ["d128q", "d128q2", "d128_80q"]),
         ("BWD_SM90_DETERMINISTIC_TILES", 128): ("d128_det", ["d128q_det"]),
         ("BWD_SM90_SOFTCAP_TILES", 128): ("d128_sc", ["d128q_sc"]),
         ("BWD_SM90_TILES", 64): ("d64", ["d64q"]),
         ("BWD_SM90_DETERMINISTIC_TILES", 64): ("d64_det", ["d64q_det"])}
chosen, forced, report = {}, {}, []
for (table, cls), (ref, cands) in SLOTS.items():
    best = None
    for c in cands:
        r = [row["us"][ref] / row["us"][c] for row in rows
             if row["us"].get(ref) and row["us"].get(c)]
        bit = all(row["det_bitwise"].get(c, True) for row in rows)
        if not r:
            continue
        g = math.exp(sum(map(math.log, r)) / len(r))
        report.append(f"{table}[{cls}] {c} vs {ref}: geomean {g:.3f} min {min(r):.3f} max {max(r):.3f} n {len(r)} bitwise {bit}")
        if g >= 1.01 and min(r) >= 0.98 and bit and (best is None or g > best[1]):
            best = (c, g)
    if best:
        chosen.setdefault(table, {})[cls] = list(VARIANTS[best[0]].entry)
    pick = best[0] if best else cands[0]
    forced.setdefault(table, {})[cls] = list(VARIANTS[pick].entry)
    report.append(f"  -> {table}[{cls}]: {best[0] if best else 'keep ' + ref}")
json.dump({"chosen": chosen, "forced": forced}, open("/tmp/choice.json", "w"), indent=1)
print("\n".join(report)); print(json.dumps({"chosen": chosen}))
