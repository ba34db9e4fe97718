"""One kernel's compile with an empty disk cache, split into the DSL's tracing
(`generate_original_ir`) and backend (`compile_and_cache`: MLIR passes, PTX, ptxas), in
seconds, as JSON. Usage: trace_time.py HEAD_DIM CAUSAL(0/1) BACKEND [ARCH]"""
import json
import os
import sys
import tempfile
import time

os.environ["CUTE_FA_CACHE_DIR"] = tempfile.mkdtemp()
import torch  # noqa: E402,F401  (imported before the clock starts, as a first call finds it)
import cutlass.cute  # noqa: E402,F401
from cutlass.base_dsl import dsl  # noqa: E402

from cute_fa.compile.build import compile_kernel  # noqa: E402
from cute_fa.tuning import kernel_key  # noqa: E402

times = {}


def timed(name, method):
    """BaseDSL.method, adding its wall time to times[name]."""
    inner = getattr(dsl.BaseDSL, method)

    def wrapper(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            times[name] = times.get(name, 0.0) + time.perf_counter() - start

    setattr(dsl.BaseDSL, method, wrapper)


timed("trace", "generate_original_ir")
timed("backend", "compile_and_cache")
head_dim, causal, backend = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
arch = sys.argv[4] if len(sys.argv) > 4 else "sm_90a"
start = time.perf_counter()
compile_kernel(kernel_key(arch, "bfloat16", head_dim, causal, backend))
times["total"] = time.perf_counter() - start
print(json.dumps({k: round(v, 3) for k, v in times.items()}))
