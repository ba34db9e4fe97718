"""Split-KV decode in one launch (`Sm80Key.fused_merge`) for compute-sanitizer: dense and paged
caches, GQA 4 and 8, head_dim 64, 128 and 256, entries of 0 and 1 keys (splits that see
nothing), split counts from 2 to 64, repeated calls (each launch finds its counters back at
zero). Each output is checked against a float32 reference, and against the two-launch form bit
for bit. Usage: san.py   (run under compute-sanitizer --tool memcheck, racecheck or synccheck)"""
import torch

import cute_fa
from cute_fa import tuning
from cute_fa.runtime.plan import clear_plans


def reference(q, k, v, lens):
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    kf = kf.repeat_interleave(q.shape[2] // k.shape[2], 1)
    vf = vf.repeat_interleave(q.shape[2] // k.shape[2], 1)
    s = qf @ kf.transpose(-1, -2) / q.shape[-1] ** 0.5
    sq, sk = q.shape[1], k.shape[1]
    i = torch.arange(sq, device=q.device)[None, :, None] + lens[:, None, None] - sq
    j = torch.arange(sk, device=q.device)[None, None, :]
    hidden = (j > i) | (j >= lens[:, None, None])
    s = s.masked_fill(hidden[:, None], float("-inf"))
    p = torch.nan_to_num(s.softmax(-1), nan=0.0)
    return (p @ vf).transpose(1, 2)


def forms(call):
    out = []
    for form in ("never", "always"):
        tuning.DECODE_FUSED_MERGE = form
        clear_plans()
        out.append(call())
    return out


g = torch.Generator(device="cuda").manual_seed(12)
for b, sq, sk, hq, hk, d, page, splits in ((3, 1, 3000, 16, 4, 128, None, 7),
                                           (2, 4, 2048, 16, 2, 64, 64, 16),
                                           (4, 1, 1024, 8, 1, 256, None, 64),
                                           (2, 2, 4096, 32, 8, 64, 256, 3)):
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    lens = torch.randint(0, sk + 1, (b,), device="cuda", generator=g).to(torch.int32)
    lens[0], lens[1] = 0, 1
    kw = dict(seqused_k=lens)
    kc, vc = k, v
    if page:
        n = sk // page
        table = torch.randperm(b * n, device="cuda", generator=g).to(torch.int32)
        kc, vc = (torch.empty(b * n, page, hk, d, device="cuda", dtype=t.dtype) for t in (k, v))
        kc[table] = k.reshape(b * n, page, hk, d)
        vc[table] = v.reshape(b * n, page, hk, d)
        kw["page_table"] = table.view(b, n)
    ref = reference(q, k, v, lens)
    (o2, l2), (o1, l1) = forms(lambda: cute_fa.forward(q, kc, vc, causal=True, num_splits=splits,
                                                       return_lse=True, **kw))
    assert torch.equal(o1, o2) and torch.equal(l1, l2), (b, sq, sk, d)
    assert (o1.float() - ref).abs().max() < 2e-2, (b, sq, sk, d)
    for _ in range(3):
        assert torch.equal(cute_fa.forward(q, kc, vc, causal=True, num_splits=splits, **kw), o1)
    torch.cuda.synchronize()
    print("ok", b, sq, sk, hq, hk, d, page, splits, flush=True)
