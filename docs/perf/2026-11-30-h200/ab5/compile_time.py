"""Compile time of one kernel in a new process, after importing the DSL (CPU is enough):
python compile_time.py HEAD_DIM CAUSAL(0|1) BACKEND(sm80|tma)"""
import time, sys
import torch
t0 = time.perf_counter()
import cute_fa
from cute_fa import compiler, tuning
t1 = time.perf_counter()
import cutlass, cutlass.cute as cute
t2 = time.perf_counter()
key = tuning.kernel_key("sm_90a", "bfloat16", int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3])
c = compiler.compile_kernel(key)
t3 = time.perf_counter()
c2 = compiler.compile_kernel(key)
t4 = time.perf_counter()
print(f"import cute_fa {t1-t0:.2f} import DSL {t2-t1:.2f} compile1 {t3-t2:.2f} compile2 {t4-t3:.2f}")
