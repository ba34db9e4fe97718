"""sm80-kernel tile A/B at head_dim 128: python abtile.py TAG bm:bn:thr ... (bf16, both causal)"""
import sys, statistics, time, torch
import cute_fa, cute_fa.interface as itf, cute_fa.tuning as tn
from torch.nn.attention import SDPBackend, sdpa_kernel
from abtiming import tms
F = torch.nn.functional
tag = sys.argv[1]
d, dtype = 128, torch.bfloat16
for spec in sys.argv[2:]:
    bm, bn, thr = map(int, spec.split(":"))
    tn.TILES[128, False] = tn.TILES[128, True] = [(bm, bn, thr)]
    itf._DISPATCH.clear()
    for causal in (False, True):
        for S in (1024, 4096, 8192, 16384):
            B, H = 16384 // S, 2048 // d
            q, k, v = (torch.randn(B, S, H, d, device="cuda", dtype=dtype) for _ in range(3))
            fl = 4 * B * H * S * S * d / (2 if causal else 1)
            t1 = tms(lambda: cute_fa.forward(q, k, v, causal=causal, backend="sm80"))
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                t2 = tms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
            print(f"AB {tag} {spec} c={int(causal)} S={S}: {fl/t1/1e9:.0f} TF flash {fl/t2/1e9:.0f} ratio {t2/t1:.3f}", flush=True)
