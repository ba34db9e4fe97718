"""cute_fa with score_mod / mask_mod against torch's FlexAttention (its default, Triton,
kernels: torch.compile(flex_attention), block masks from create_block_mask) and against the
built-in feature a mod equals (causal, a window, a softcap), forward, bf16, side by side in one
process on the same inputs, timed by cute_fa.bench.common.time_each (the host launch hidden
for every method alike). For masks, cute_fa runs twice: with the mask_mod alone (evaluated on
every key block) and with torch's block mask (`block_mask=`: only the listed key tiles; the
GPU time includes converting the mask to the kernel's tiles, as every call does). Shapes: 16k tokens per call (batch = 16384 // S), 16 query heads,
4 K/V heads (GQA), head_dim 128, S 1k / 4k / 16k. Each cute_fa output is checked against
FlexAttention's (max |diff| printed). Usage: bench_mods.py OUT_DIR [SEQLENS, e.g. 4096,16384]
[NAME of the json, default bench_mods]"""
import json
import sys

import torch

import cute_fa
from cute_fa.bench.common import time_each, warm_gpu

OUT = sys.argv[1]
HQ, HK, D = 16, 4, 128


def cases(batch, s):
    gen = torch.Generator().manual_seed(0)
    docs = torch.sort(torch.randint(0, 6, (batch, s), generator=gen), 1).values.int().cuda()
    slopes = torch.exp2(-8 * torch.arange(1, HQ + 1) / HQ).cuda()

    def alibi(sc, b, h, q, kv):
        return sc + slopes[h] * (kv - q)

    return {  # name -> (score_mod, mask_mod, the built-in equivalent's forward kwargs or None)
        "causal": (None, lambda b, h, q, kv: q >= kv, dict(causal=True)),
        "sliding_window_256": (None, lambda b, h, q, kv: (q >= kv) & (q - kv <= 256),
                               dict(causal=True, window_size=(256, 0))),
        "softcap_30": (lambda sc, b, h, q, kv: torch.tanh(sc / 30) * 30, None,
                       dict(softcap=30.0)),
        "alibi_causal": (alibi, lambda b, h, q, kv: q >= kv, None),
        "document_causal": (None, lambda b, h, q, kv: (docs[b, q] == docs[b, kv]) & (q >= kv),
                            None),
        "prefix_lm_512": (None, lambda b, h, q, kv: (kv < 512) | (q >= kv), None),
    }


def main():
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # every mod is a new function to torch.compile: past the default limit of 8 recompiles it
    # falls back to eager (the first run did, bench_mods_first_try.log)
    torch._dynamo.config.cache_size_limit = 256
    torch._dynamo.config.accumulated_cache_size_limit = 4096

    flex = torch.compile(flex_attention)
    warm_gpu(torch)
    rows = []
    seqlens = (1024, 4096, 16384) if len(sys.argv) < 3 else tuple(map(int, sys.argv[2].split(",")))
    for s in seqlens:
        batch = 16384 // s
        q = torch.randn(batch, s, HQ, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, s, HK, D, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        for name, (score_mod, mask_mod, builtin) in cases(batch, s).items():
            bm = None if mask_mod is None else create_block_mask(mask_mod, batch, HQ, s, s,
                                                                 device="cuda")
            fns = {"cute_fa": lambda: cute_fa.forward(q, k, v, score_mod=score_mod,
                                                      mask_mod=mask_mod),
                   "cute_fa_block_mask": lambda: cute_fa.forward(q, k, v, score_mod=score_mod,
                                                                 block_mask=bm),
                   "flex": lambda: flex(qt, kt, vt, score_mod=score_mod, block_mask=bm,
                                        enable_gqa=True).transpose(1, 2)}
            if bm is None:
                del fns["cute_fa_block_mask"]
            if builtin is not None:
                fns["builtin"] = lambda: cute_fa.forward(q, k, v, **builtin)
            us, errors, outs = time_each(torch, fns, reps=20, keep_outputs=True)
            diff = None
            if "cute_fa" in outs and "flex" in outs:
                diff = (outs["cute_fa"].float() - outs["flex"].float()).abs().max().item()
            row = dict(seqlen=s, batch=batch, mod=name, us=us, errors=errors,
                       max_diff_vs_flex=diff)
            for method in ("cute_fa", "cute_fa_block_mask"):
                if us.get(method) and us.get("flex"):
                    row[f"{method}_vs_flex"] = us["flex"] / us[method]
            if "cute_fa_block_mask" in outs and "flex" in outs:
                row["block_mask_max_diff_vs_flex"] = (
                    outs["cute_fa_block_mask"].float() - outs["flex"].float()).abs().max().item()
            if us.get("cute_fa") and us.get("builtin"):
                row["vs_builtin"] = us["builtin"] / us["cute_fa"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            del outs
    name = sys.argv[3] if len(sys.argv) > 3 else "bench_mods"
    with open(f"{OUT}/{name}.json", "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
