"""A/B of the pipelined TMA kernel at head_dim 64: python abpipe.py TAG base|pipe (bf16+fp16, both causal)"""
import sys, dataclasses, torch
import cute_fa, cute_fa.interface as itf, cute_fa.tuning as tn
from cute_fa.kernels import fwd_tma
from abtiming import vs_flash
tag, mode = sys.argv[1], sys.argv[2]
if mode == "pipe":
    orig = fwd_tma.FlashFwdTma.__init__
    def init(self, *a, **k):
        orig(self, *a, **k); self.pipelined = True
    fwd_tma.FlashFwdTma.__init__ = init
    okk = tn.kernel_key
    def kk(arch, dtype, head_dim, causal, backend="auto", lazy_rescale=True):
        key = okk(arch, dtype, head_dim, causal, backend, False)
        return dataclasses.replace(key, ctas_per_sm=0) if key.backend == "tma" else key
    tn.kernel_key = kk; itf.kernel_key = kk
torch.manual_seed(1)
for (b, sq, sk, hq, hk, causal, dt) in [(2, 17, 17, 4, 2, True, torch.bfloat16), (1, 1000, 1000, 8, 2, False, torch.float16),
                                        (1, 4097, 4097, 2, 2, True, torch.bfloat16), (1, 17, 1000, 8, 1, True, torch.float16),
                                        (1, 1000, 17, 8, 8, True, torch.bfloat16), (1, 129, 130, 2, 2, False, torch.bfloat16)]:
    q = torch.randn(b, sq, hq, 64, device="cuda", dtype=dt); k = torch.randn(b, sk, hk, 64, device="cuda", dtype=dt); v = torch.randn_like(k)
    out = torch.full_like(q, float("nan"))
    o, lse = cute_fa.forward(q, k, v, causal=causal, out=out, return_lse=True, backend="tma")
    qf = q.double().transpose(1, 2); kf = k.double().transpose(1, 2).repeat_interleave(hq // hk, 1); vf = v.double().transpose(1, 2).repeat_interleave(hq // hk, 1)
    s_ = qf @ kf.transpose(-1, -2) / 8.0
    if causal:
        vis = torch.arange(sk, device="cuda")[None, :] <= torch.arange(sq, device="cuda")[:, None] + (sk - sq)
        s_ = s_.masked_fill(~vis, float("-inf"))
    p_ = torch.softmax(s_, -1).nan_to_num(0.0)
    ref = (p_ @ vf).transpose(1, 2)
    err = (o.double() - ref.double()).abs().max().item()
    print(f"CHK {tag} {mode} {sq}x{sk} c={int(causal)} maxerr {err:.2e} nan {torch.isnan(o).any().item()}", flush=True)
for dtype in (torch.bfloat16, torch.float16):
    for causal in (False, True):
        for S in (1024, 2048, 4096, 8192, 16384):
            tf, tf_flash, ratio = vs_flash(
                lambda q, k, v, c: cute_fa.forward(q, k, v, causal=c, backend="tma"),
                64, dtype, causal, S)
            print(f"AB {tag} {mode} {str(dtype)[6:]} c={int(causal)} S={S}: {tf:.0f} TF flash {tf_flash:.0f} ratio {ratio:.3f}", flush=True)
