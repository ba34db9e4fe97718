"""Masked calls of the wgmma kernels for compute-sanitizer: the forward with the bit-mask form
(`mask.apply_mask`) on causal tiles of two and three consumer warpgroups, a window with a
softcap, a ragged batch, odd lengths with Sq != Sk, and the wgmma backward's transposed mask
(`mask.apply_mask_transposed`). Each output is checked against a float32 reference.
Usage: san.py   (run under compute-sanitizer --tool memcheck or racecheck)"""
import torch

import cute_fa
from cute_fa.layouts import TileConfig
from cute_fa.runtime.plan import overriding


def reference(q, k, v, causal, window=None):
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    kf = kf.repeat_interleave(q.shape[2] // k.shape[2], 1)
    vf = vf.repeat_interleave(q.shape[2] // k.shape[2], 1)
    s = qf @ kf.transpose(-1, -2) / q.shape[-1] ** 0.5
    sq, sk = q.shape[1], k.shape[1]
    i = torch.arange(sq, device=q.device)[:, None] + sk - sq
    j = torch.arange(sk, device=q.device)[None, :]
    hidden = torch.zeros(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        hidden |= j > i
    if window is not None:
        hidden |= j < i - window[0]
    s = s.masked_fill(hidden, float("-inf"))
    return (s.softmax(-1) @ vf).transpose(1, 2)


g = torch.Generator(device="cuda").manual_seed(11)
three = TileConfig(head_dim=64, block_m=192, block_n=128, num_threads=384, dtype="bfloat16",
                   wgmma=True)
for b, sq, sk, hq, hk, d in ((2, 300, 300, 8, 2, 64), (1, 200, 517, 4, 4, 128),
                             (1, 333, 333, 4, 1, 256)):
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    ref = reference(q, k, v, True)
    o = cute_fa.forward(q, k, v, causal=True, backend="sm90")
    assert (o.float() - ref).abs().max() < 2e-2, (b, sq, sk, d)
    if d == 64:
        with overriding(tile=three):
            o3 = cute_fa.forward(q, k, v, causal=True, backend="sm90")
        assert (o3.float() - ref).abs().max() < 2e-2
    ow = cute_fa.forward(q, k, v, causal=True, window_size=(64, 0), backend="sm90")
    assert (ow.float() - reference(q, k, v, True, (64, 0))).abs().max() < 2e-2
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    cute_fa.forward(qg, kg, vg, causal=True).float().sum().backward()
    torch.cuda.synchronize()
    print("ok", b, sq, sk, hq, hk, d, flush=True)
lens = [37, 300, 129]
cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
q = torch.randn(sum(lens), 4, 128, device="cuda", dtype=torch.bfloat16, generator=g)
k, v = (torch.randn(sum(lens), 2, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        for _ in range(2))
o = cute_fa.forward_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, backend="sm90")
for i, n in enumerate(lens):
    part = slice(int(cu[i]), int(cu[i + 1]))
    ref = reference(q[None, part], k[None, part], v[None, part], True)[0]
    assert (o[part].float() - ref).abs().max() < 2e-2, i
torch.cuda.synchronize()
print("ok varlen")
