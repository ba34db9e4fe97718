"""Where a first call's compile time goes, on a CPU (no GPU: the wgmma forward for sm_90a, as
the first call on an H200 compiles it, less the module load): the DSL's import, tracing (the
kernel's Python building its MLIR) and the backend (MLIR passes, PTX, ptxas), each kernel in a
fresh process with an empty disk cache. Usage: cold_split.py OUT.json"""
import json
import os
import subprocess
import sys
import tempfile

PROBE = r'''
import cProfile, json, pstats, time
import torch
t0 = time.perf_counter()
import cutlass, cutlass.cute
t1 = time.perf_counter()
from cute_fa.compile.build import compile_kernel
from cute_fa.tuning import kernel_key
key = kernel_key("sm_90a", "bfloat16", {d}, {causal}, "sm90")
pr = cProfile.Profile()
t2 = time.perf_counter()
pr.enable()
compile_kernel(key)
pr.disable()
t3 = time.perf_counter()
cum = {{f[2]: v[3] for f, v in pstats.Stats(pr).stats.items()}}
print(json.dumps(dict(dsl_import=t1 - t0, compile=t3 - t2,
                      trace=cum["generate_original_ir"], backend=cum["compile_and_cache"])))
'''

rows = []
for d, causal in ((64, True), (128, False), (128, True), (192, True), (256, False)):
    for rep in range(2):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, CUTE_FA_CACHE_DIR=cache)
            out = subprocess.run([sys.executable, "-c", PROBE.format(d=d, causal=causal)],
                                 env=env, capture_output=True, text=True, check=True)
        row = dict(head_dim=d, causal=causal, rep=rep, **json.loads(out.stdout.splitlines()[-1]))
        print(json.dumps(row), flush=True)
        rows.append(row)
json.dump(dict(cpus=os.cpu_count(), rows=rows), open(sys.argv[1], "w"), indent=1)
