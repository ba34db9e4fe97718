"""Where a first call's time goes on the GPU machine: each head_dim class's first forward in a
fresh process with an empty disk cache (then once more with the cache warm), split into
torch's CUDA start, the DSL's import, the plan, tracing (the kernel's Python building its
MLIR), the MLIR passes and the binary (LLVM to PTX and ptxas: the DSL's CudaToBinaryPass).
Usage: cold_gpu.py OUT.json"""
import json
import os
import re
import subprocess
import sys
import tempfile

PROBE = r'''
import json, re, sys, time, io, contextlib
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import cute_fa
q, k, v = (torch.randn(1, 128, 16, {d}, device="cuda", dtype=torch.bfloat16) for _ in range(3))
torch.cuda.synchronize()
t2 = time.perf_counter()
parts = {{}}
def add(name, dt):
    parts[name] = parts.get(name, 0.0) + dt
def wrap(owner, name, label):
    f = getattr(owner, name)
    def w(*a, **kw):
        t = time.perf_counter()
        try:
            return f(*a, **kw)
        finally:
            add(label, time.perf_counter() - t)
    setattr(owner, name, w)
split = {split}
if split:
    import cutlass, cutlass.cute
    from cutlass.base_dsl import dsl as _dsl, compiler as _comp
    from cutlass.cutlass_dsl import cutlass as _cd
    from cute_fa.compile import cache as _cache
    from cute_fa.runtime import plan as _plan
    t3 = time.perf_counter()
    add("dsl_import", t3 - t2)
    wrap(_dsl.BaseDSL, "generate_original_ir", "trace")
    wrap(_comp.Compiler, "compile", "mlir_and_binary")
    wrap(_cache, "_load", "disk_load")
    wrap(_cache, "compile_kernel", "compile_kernel")
    wrap(_plan, "plan", "plan")
    orig = _comp.Compiler.compile
    def comp(self, module, pipeline, *a, **kw):
        PM = self.passmanager.PassManager
        oparse = PM.parse
        def parse(p, *aa, **kk):
            pm = oparse(p, *aa, **kk)
            pm.enable_timing()
            return pm
        PM.parse = parse
        try:
            return orig(self, module, pipeline, *a, **kw)
        finally:
            PM.parse = oparse
    _comp.Compiler.compile = comp
t4 = time.perf_counter()
o = cute_fa.forward(q, k, v, causal={causal})
torch.cuda.synchronize()
t5 = time.perf_counter()
o = cute_fa.forward(q, k, v, causal={causal})
torch.cuda.synchronize()
t6 = time.perf_counter()
print("RESULT", json.dumps(dict(import_torch=t1 - t0, import_cute_fa_and_cuda_start=t2 - t1,
      first_call=t5 - t4, second_call=t6 - t5, after_torch=t5 - t1, **parts)))
'''


def main(out_path):
    rows = []
    for d, causal in ((64, True), (128, False), (128, True), (192, True), (256, False)):
        for split in (False, True):
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, CUTE_FA_CACHE_DIR=cache)
                for cache_state in ("cold", "warm"):
                    res = subprocess.run([sys.executable, "-c", PROBE.format(
                        d=d, causal=causal, split=split)], env=env, capture_output=True,
                        text=True)
                    line = [x for x in res.stdout.splitlines() if x.startswith("RESULT")]
                    if not line:
                        print(res.stdout[-2000:], res.stderr[-3000:])
                        continue
                    row = dict(head_dim=d, causal=causal, split=split, cache=cache_state,
                               **json.loads(line[0][7:]))
                    passes = {}
                    for m in re.finditer(r"^\s+([\d.]+) \(\s*[\d.]+%\)\s+(\w+)\s*$",
                                         res.stderr, re.M):
                        passes[m.group(2)] = passes.get(m.group(2), 0.0) + float(m.group(1))
                    if passes:
                        row["binary"] = passes.get("CudaToBinaryPass")
                        row["mlir_passes_total"] = passes.get("Total")
                    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                      for k, v in row.items()}), flush=True)
                    rows.append(row)
    json.dump(dict(cpus=os.cpu_count(), rows=rows), open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
