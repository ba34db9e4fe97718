"""The block masks' two host-side switches, each A/B in one process on the same inputs, timed
by cute_fa.bench.common.time_each (host launch hidden alike), bf16, 16k tokens per call (batch
16384 // S), 16 query heads, 4 K/V heads, head_dim 128, masks from torch's create_block_mask:
- `block_mask.WHOLE_TILES`, the forward: tiles that meet full blocks alone listed as such, the
  mask_mod skipped there ("whole"), or every listed tile masked ("masked");
- `block_mask.SPARSE_BACKWARD`, the backward alone (autograd.grad of a kept forward's output):
  each key tile walks the query tiles the lists give ("sparse"), or every one ("dense").
The outputs and gradients of each pair are compared (max |diff|).
Usage: ab_switches.py OUT_DIR [SEQLENS, e.g. 4096,16384]"""
import json
import sys

import torch

import cute_fa
from cute_fa.bench.backward import autograd_pair
from cute_fa.bench.common import time_each, warm_gpu
from cute_fa.mods import block_mask as switches

OUT = sys.argv[1]
HQ, HK, D = 16, 4, 128


def masks(batch: int, s: int) -> dict:
    gen = torch.Generator().manual_seed(7)
    docs = torch.sort(torch.randint(0, 8, (batch, s), generator=gen), dim=1).values.cuda()
    return {
        "causal": lambda b, h, q, kv: q >= kv,
        "sliding_window_256": lambda b, h, q, kv: (q >= kv) & (q - kv < 256),
        "document_causal": lambda b, h, q, kv: (docs[b, q] == docs[b, kv]) & (q >= kv),
        "prefix_lm_512": lambda b, h, q, kv: (q >= kv) | (kv < 512),
    }


def under(module, name: str, value, fn):
    """fn with module.name set to value for its call."""
    def call():
        saved = getattr(module, name)
        setattr(module, name, value)
        try:
            return fn()
        finally:
            setattr(module, name, saved)
    return call


def diff(a, b) -> float:
    a, b = (a,) if torch.is_tensor(a) else a, (b,) if torch.is_tensor(b) else b
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def main():
    from torch.nn.attention.flex_attention import create_block_mask

    warm_gpu(torch)
    rows = []
    seqlens = (4096, 16384) if len(sys.argv) < 3 else tuple(map(int, sys.argv[2].split(",")))
    for s in seqlens:
        batch = 16384 // s
        q = torch.randn(batch, s, HQ, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, s, HK, D, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        dout = torch.randn_like(q)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        for name, mask_mod in masks(batch, s).items():
            bm = create_block_mask(mask_mod, batch, None, s, s, device="cuda")

            def forward():
                return cute_fa.forward(q, k, v, block_mask=bm)

            fwd = {"whole": under(switches, "WHOLE_TILES", True, forward),
                   "masked": under(switches, "WHOLE_TILES", False, forward)}
            us, errors, outs = time_each(torch, fwd, reps=20, keep_outputs=True)
            row = dict(seqlen=s, batch=batch, mask=name, fwd_us=us, fwd_errors=errors)
            if len(outs) == 2:
                row["fwd_max_diff"] = diff(outs["whole"], outs["masked"])
            if us.get("whole") and us.get("masked"):
                row["whole_speed_over_masked"] = us["masked"] / us["whole"]
            bwd = {}
            for label, sparse in (("sparse", True), ("dense", False)):
                bwd[label] = under(switches, "SPARSE_BACKWARD", sparse, lambda: autograd_pair(
                    torch, lambda: cute_fa.forward(*leaves, block_mask=bm), leaves, dout))()[0]
            us, errors, grads = time_each(torch, bwd, reps=10, keep_outputs=True)
            row.update(bwd_us=us, bwd_errors=errors)
            if len(grads) == 2:
                row["bwd_max_diff"] = diff(grads["sparse"], grads["dense"])
            if us.get("sparse") and us.get("dense"):
                row["sparse_speed_over_dense"] = us["dense"] / us["sparse"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            del grads, bwd
    with open(f"{OUT}/ab_switches.json", "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
