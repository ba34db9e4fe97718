"""sha256 of the PTX of every kernel the CPU compile tests build: run before and after a
refactor that should not change generated code, and compare (python tests/ptx_hashes.py).

The kernels are those of tests/test_compile_forward.py: the sm80 kernel on sm_80, sm_90a and
sm_120a and the TMA kernel on sm_90a and sm_120a, for every head_dim class, dtype and
causality of the tile tables, plus the padded and eager cases; and the wgmma kernel's shipped
configurations on sm_90a (tests/test_compile_sm90.py); then the backward's kernels of
tests/test_compile_bwd.py, last.
"""

import hashlib
import re
import sys
from concurrent.futures import ProcessPoolExecutor

from cute_fa.compiler import compile_kernel
from cute_fa.tuning import kernel_key
from test_compile_forward import ARCHS, CASES, TMA_CASES
from test_compile_bwd import PLAIN as BWD_PLAIN
from test_compile_sm90 import PLAIN
from cute_fa.tuning import bwd_keys


def keys() -> list:
    """The keys of test_compile_forward.py's two parametrisations, in its order."""
    out = [kernel_key(arch, dtype, head_dim, causal, "sm80")
           for arch in ARCHS for head_dim, causal, dtype in CASES]
    out += [kernel_key(arch, dtype, head_dim, causal, "tma", lazy_rescale=lazy)
            for arch, head_dim, causal, dtype, lazy in TMA_CASES]
    out += [kernel_key("sm_90a", dtype, head_dim, causal, "sm90")
            for head_dim, dtype, causal in PLAIN]
    out += [key for arch, head_dim, dtype, causal in BWD_PLAIN
            for key in bwd_keys(arch, dtype, head_dim, causal)]
    return list(dict.fromkeys(out))  # the backward's row kernels repeat across its keys


def ptx_hash(key) -> str:
    """The hash of the PTX with the kernel's symbol replaced: the symbol spells the kernel
    class's module path and argument types, which a move or a rename changes, not the code."""
    ptx = compile_kernel(key, keep_ptx=True).__ptx__
    for name in set(re.findall(r"\.entry\s+([A-Za-z0-9_$]+)", ptx)):
        ptx = ptx.replace(name, "KERNEL")
    return hashlib.sha256(ptx.encode()).hexdigest()[:16]


if __name__ == "__main__":
    all_keys = keys()
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with ProcessPoolExecutor(workers) as pool:
        for key, digest in zip(all_keys, pool.map(ptx_hash, all_keys)):
            print(digest, key.arch, key.backend, key.tile.head_dim, key.tile.dtype,
                  "causal" if getattr(key, "causal", False) else "full",
                  getattr(key, "kv_stages", 0), getattr(key, "lazy_rescale", False),
                  getattr(key, "ctas_per_sm", 0), flush=True)
