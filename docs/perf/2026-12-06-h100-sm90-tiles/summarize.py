"""The tables of README.md from run1.json and run2.json: per class, old/now and each candidate's
speedup over now (both runs), and in run 1 (the peers' run) each row's ratio to the fastest
peer for the kernels `auto` runs before (old) and after this change (`tuning.SM90_PACKED_P`:
now in the classes it names, old elsewhere). Usage: summarize.py [DIR]"""
import json
import math
import os
import sys

PACKED = {(128, False), (192, True), (256, False), (256, True)}  # tuning.SM90_PACKED_P


def geo(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main(here):
    runs = [json.load(open(os.path.join(here, f"run{i}.json"))) for i in (1, 2)]
    print("| class | old / now, run 1 | run 2 | n176 / now, run 1 | run 2 | n192 / now, run 1 "
          "| run 2 |")
    print("|---|---|---|---|---|---|---|")
    for cls, entry in runs[0]["summary"].items():
        cells = []
        for name in ("old", "n176", "n192"):
            for run in runs:
                parts = [f"{k.split('/')[1]} {v['geo']:.3f} ({v['lo']:.3f}-{v['hi']:.3f})"
                         for k, v in run["summary"][cls].items() if k.startswith(name + "/")]
                cells.append("; ".join(parts) or "-")
        print(f"| {cls} | " + " | ".join(cells) + " |")
    print()
    print("| kind | head_dim | causal | B | S | Hq/Hkv | fastest peer | before: old | after | "
          "after TFLOPs/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    before, after = {}, {}
    for r in runs[0]["rows"]:
        pick = "now" if (r["head_dim"], r["causal"]) in PACKED else "old"
        vf = r["vs_fastest"]
        print(f"| {r['kind']} | {r['head_dim']} | {r['causal']} | {r['batch']} | {r['seqlen']} | "
              f"{r['heads_q']}/{r['heads_kv']} | {r['fastest_peer']} | {vf['old']:.3f} | "
              f"{vf[pick]:.3f} | {r['tflops'][pick]} |")
        group = (r["kind"], r["head_dim"] in (64, 128))
        before.setdefault(group, []).append(vf["old"])
        after.setdefault(group, []).append(vf[pick])
    print()
    for group in before:
        b, a = before[group], after[group]
        print(f"{group}: before {min(b):.3f}-{max(b):.3f} mean {sum(b)/len(b):.3f} geo "
              f"{geo(b):.3f}; after {min(a):.3f}-{max(a):.3f} mean {sum(a)/len(a):.3f} geo "
              f"{geo(a):.3f}; >= 1.0: {sum(x >= 1 for x in a)} of {len(a)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
