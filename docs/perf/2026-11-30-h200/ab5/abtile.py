"""sm80-kernel tile A/B at head_dim 128: python abtile.py TAG bm:bn:thr ... (bf16, both causal)"""
import sys, torch
import cute_fa, cute_fa.interface as itf, cute_fa.tuning as tn
from abtiming import vs_flash
tag = sys.argv[1]
d, dtype = 128, torch.bfloat16
for spec in sys.argv[2:]:
    bm, bn, thr = map(int, spec.split(":"))
    tn.TILES[128, False] = tn.TILES[128, True] = [(bm, bn, thr)]
    itf._DISPATCH.clear()
    for causal in (False, True):
        for S in (1024, 4096, 8192, 16384):
            tf, tf_flash, ratio = vs_flash(
                lambda q, k, v, c: cute_fa.forward(q, k, v, causal=c, backend="sm80"),
                d, dtype, causal, S)
            print(f"AB {tag} {spec} c={int(causal)} S={S}: {tf:.0f} TF flash {tf_flash:.0f} ratio {ratio:.3f}", flush=True)
