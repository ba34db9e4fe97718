"""A ragged batch's forward with its tiles in a most-work-first list ("ordered",
`KernelKey.varlen_order`, `cute_fa.runtime.ragged_order`) against the plan's grid (entry after
entry; under causal each entry's longest query blocks first: "plain"), in one process on the
same inputs, timed by cute_fa.bench.common.time_each (host launch hidden alike), on each
forward backend. Batches of mixed lengths as servers pack them: a few long prompts among many
short ones, long ones last (the plain grid starts them last), and the prefill benchmark's
ragged batch. bf16, 32/8 heads, head_dim 128, causal and not. Outputs must be bitwise
equal (each tile's arithmetic is the same). Usage: ab_varlen_order.py OUT_DIR"""
import itertools
import json
import sys

import torch

import cute_fa
from cute_fa.bench.common import time_each, warm_gpu
from cute_fa.bench.prefill import VARLEN_MAX, VARLEN_MIN, VARLEN_PROMPTS
from cute_fa.runtime.plan import overriding

OUT = sys.argv[1]
HQ, HK, D = 32, 8, 128
BATCHES = {
    "short_then_long": [300] * 48 + [8192, 16384],
    "long_then_short": [16384, 8192] + [300] * 48,
    "mixed": [37, 1900, 4096, 130, 700, 12000, 2500, 64, 3000, 9000, 512, 1024] * 3,
    # the prefill benchmark's ragged batch (`bench.prefill.varlen_results`)
    "bench_prefill": torch.randint(VARLEN_MIN, VARLEN_MAX + 1, (VARLEN_PROMPTS,),
                                   generator=torch.Generator().manual_seed(0)).tolist(),
}


def main():
    warm_gpu(torch)
    rows = []
    for (name, lens), causal, backend in itertools.product(BATCHES.items(), (True, False),
                                                          ("auto", "sm80", "tma")):
        cu = torch.tensor([0, *itertools.accumulate(lens)], device="cuda", dtype=torch.int32)
        q = torch.randn(sum(lens), HQ, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(sum(lens), HK, D, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))

        def plain():
            return cute_fa.forward_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal,
                                          backend=backend)

        def ordered():
            with overriding(varlen_order=True, lpt=False):
                return plain()
        us, errors, outs = time_each(torch, {"plain": plain, "ordered": ordered}, reps=20,
                                     keep_outputs=True)
        row = dict(batch=name, tokens=sum(lens), causal=causal, backend=backend, us=us,
                   errors=errors)
        if len(outs) == 2:
            row["bitwise_equal"] = bool(torch.equal(outs["plain"], outs["ordered"]))
        if us.get("plain") and us.get("ordered"):
            row["ordered_speed_over_plain"] = us["plain"] / us["ordered"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(f"{OUT}/ab_varlen_order.json", "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
