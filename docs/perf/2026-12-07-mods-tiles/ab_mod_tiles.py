"""The wgmma forward's tile for calls with mods at head_dim 64 (`tuning.SM90_MOD_TILES`), and
block masks' tiles fitted to their blocks (`tuning.mods_tile`), A/B in one process on the same
inputs: each mod on the tile the plan now gives ("new") and on the tile it gave before
("old": 192 x 128 at head_dim 64, 128 x 112 at 192 and 128 x 80 at 256), timed by
cute_fa.bench.common.time_each (the host launch hidden alike), bf16, 16k tokens per call
(batch 16384 // S), 16 query heads, 4 K/V heads. The outputs of the two are compared (max
|diff|). Usage: ab_mod_tiles.py OUT_DIR [SEQLENS, e.g. 1024,4096,16384]"""
import json
import sys

import torch

import cute_fa
import cute_fa.api.forward as forward_module
from cute_fa.bench.common import time_each, warm_gpu
from cute_fa.layouts import TileConfig
from cute_fa.mods.block_mask import create_block_mask
from cute_fa.runtime.plan import clear_plans, overriding

OUT = sys.argv[1]
HQ, HK = 16, 4
OLD = {64: (192, 128, 384), 192: (128, 112, 256), 256: (128, 80, 256)}


def cases(batch, s):
    gen = torch.Generator().manual_seed(0)
    docs = torch.sort(torch.randint(0, 6, (batch, s), generator=gen), 1).values.int().cuda()
    slopes = torch.exp2(-8 * torch.arange(1, HQ + 1) / HQ).cuda()

    def alibi(sc, b, h, q, kv):
        return sc + slopes[h] * (kv - q)

    def document(b, h, q, kv):
        return (docs[b, q] == docs[b, kv]) & (q >= kv)

    return {  # name -> (head_dims, kwargs of forward)
        "causal_mask_mod": ((64,), dict(mask_mod=lambda b, h, q, kv: q >= kv)),
        "alibi_causal": ((64,), dict(score_mod=alibi, mask_mod=lambda b, h, q, kv: q >= kv)),
        "softcap_30": ((64,), dict(score_mod=lambda sc, b, h, q, kv: torch.tanh(sc / 30) * 30)),
        "document_block_mask": ((64, 192, 256), dict(block_mask=create_block_mask(
            document, batch, None, s, s, device="cuda"))),
    }


def main():
    warm_gpu(torch)
    rows = []
    seqlens = (1024, 4096, 16384) if len(sys.argv) < 3 else tuple(map(int, sys.argv[2].split(",")))
    for s in seqlens:
        batch = 16384 // s
        for name, (head_dims, kwargs) in cases(batch, s).items():
            for d in head_dims:
                q = torch.randn(batch, s, HQ, d, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(batch, s, HK, d, device="cuda", dtype=torch.bfloat16)
                        for _ in range(2))
                m, n, t = OLD[d]
                old = TileConfig(head_dim=d, block_m=m, block_n=n, num_threads=t,
                                 dtype="bfloat16", wgmma=True)

                def run_old():  # the tile as before, and no blocks' kinds on it (the masks
                    # here come from create_block_mask: their mask_mod is exact on any tile)
                    saved = forward_module.exact_blocks
                    forward_module.exact_blocks = lambda call, mods, planned, of: (call, mods,
                                                                                   planned)
                    try:
                        with overriding(tile=old):
                            return cute_fa.forward(q, k, v, backend="sm90", **kwargs)
                    finally:
                        forward_module.exact_blocks = saved

                fns = {"new": lambda: cute_fa.forward(q, k, v, backend="sm90", **kwargs),
                       "old": run_old}
                us, errors, outs = time_each(torch, fns, reps=20, keep_outputs=True)
                clear_plans()
                row = dict(seqlen=s, batch=batch, head_dim=d, mod=name, us=us, errors=errors)
                if "new" in outs and "old" in outs:
                    row["max_diff"] = (outs["new"].float() - outs["old"].float()).abs().max().item()
                if us.get("new") and us.get("old"):
                    row["new_speed_over_old"] = us["old"] / us["new"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    with open(f"{OUT}/ab_mod_tiles.json", "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
