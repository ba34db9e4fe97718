import sys, time, os, tempfile, json
os.environ["CUTE_FA_CACHE_DIR"] = tempfile.mkdtemp()
import torch
import cutlass, cutlass.cute
from cutlass.base_dsl import dsl as dslmod
from cute_fa.compile.build import compile_kernel
from cute_fa.tuning import kernel_key
times = {}
orig_gen = dslmod.BaseDSL.generate_original_ir
orig_cc = dslmod.BaseDSL.compile_and_cache
def gen(self, *a, **k):
    t = time.perf_counter(); r = orig_gen(self, *a, **k); times["trace"] = times.get("trace", 0) + time.perf_counter() - t; return r
def cc(self, *a, **k):
    t = time.perf_counter(); r = orig_cc(self, *a, **k); times["backend"] = times.get("backend", 0) + time.perf_counter() - t; return r
dslmod.BaseDSL.generate_original_ir = gen
dslmod.BaseDSL.compile_and_cache = cc
d, causal, backend = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
t = time.perf_counter()
compile_kernel(kernel_key(sys.argv[4] if len(sys.argv) > 4 else "sm_90a", "bfloat16", d, causal, backend))
times["total"] = time.perf_counter() - t
print(json.dumps({k: round(v, 3) for k, v in times.items()}))
