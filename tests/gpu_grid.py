"""The GPU correctness grid.

KERNELS lists the (head_dim, dtype, causal) kernels the grid launches, so that a cache can be
compiled ahead of a GPU run (`cute_fa.precompile(..., arch="sm_90a")` works without a GPU).
"""

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, dtype)
SHAPES = [
    (2, 1, 1, 4, 4, 64, False, "bfloat16"),
    (2, 17, 17, 4, 2, 64, True, "bfloat16"),
    (1, 127, 127, 8, 1, 128, True, "bfloat16"),      # MQA
    (1, 1000, 1000, 8, 2, 128, False, "bfloat16"),   # GQA 4
    (1, 4097, 4097, 2, 2, 64, True, "bfloat16"),
    (1, 17, 1000, 8, 1, 64, True, "float16"),        # Sq < Sk, MQA
    (1, 1000, 17, 8, 8, 128, True, "float16"),       # Sq > Sk: fully masked rows
    (1, 1000, 17, 8, 8, 128, False, "float16"),
    (1, 127, 4097, 16, 2, 128, False, "float16"),    # GQA 8
    (1, 300, 300, 4, 4, 32, False, "float16"),
    (1, 300, 300, 4, 4, 32, True, "bfloat16"),
    (1, 300, 251, 4, 2, 96, True, "bfloat16"),
    (1, 300, 251, 4, 2, 96, False, "float16"),
    (1, 200, 333, 4, 4, 192, False, "bfloat16"),
    (1, 333, 200, 4, 4, 192, True, "float16"),
    (1, 257, 257, 2, 1, 256, False, "float16"),
    (1, 257, 513, 2, 1, 256, True, "bfloat16"),
    (1, 129, 130, 2, 2, 40, False, "float16"),       # head_dim padded to 64
    (1, 129, 130, 2, 2, 8, True, "bfloat16"),        # head_dim padded to 32
    (1, 77, 77, 2, 2, 200, False, "bfloat16"),       # head_dim padded to 224
]

# (head_dim, dtype, causal) of every kernel the GPU tests launch
KERNELS = sorted({(s[5], s[7], s[6]) for s in SHAPES} | {(64, "bfloat16", False),
                  (64, "float16", False), (64, "float16", True), (128, "bfloat16", True),
                  (128, "bfloat16", False)})

# (tile arch, backend) pairs of the other archs' tables the grid also runs (test_forward_gpu):
# sm_120a (consumer Blackwell, ~99 KB of shared memory, TMA but no wgmma) with both kernels,
# sm_86 (~99 KB, no TMA) with the cp.async one
OTHER_ARCH_TILES = [("sm_120a", "sm80"), ("sm_120a", "tma"), ("sm_86", "sm80")]


def kernel_keys(arch: str = "sm_90a") -> list:
    """Every KernelKey the GPU tests launch on a GPU of `arch`: both backends on the arch's
    own tables, the eager TMA kernels of the rescale test, and the other archs' tables."""
    from cute_fa.tuning import kernel_key

    keys = set()
    for head_dim, dtype, causal in KERNELS:
        for backend in ("sm80", "tma", "sm90"):
            keys.add(kernel_key(arch, dtype, head_dim, causal, backend))
        for tile_arch, backend in OTHER_ARCH_TILES:
            keys.add(kernel_key(arch, dtype, head_dim, causal, backend, tile_arch=tile_arch))
    for causal in (False, True):
        keys.add(kernel_key(arch, "bfloat16", 128, causal, "tma", lazy_rescale=False))
    return sorted(keys, key=repr)


if __name__ == "__main__":
    # python tests/gpu_grid.py [ARCH] [WORKERS]: compile the GPU tests' kernels into the disk
    # cache ($CUTE_FA_CACHE_DIR) ahead of a GPU run, on a machine without a GPU
    import sys
    from concurrent.futures import ProcessPoolExecutor

    from cute_fa.compile.cache import get_kernel, wait_for_saves

    def _compile(key):
        get_kernel(key)
        wait_for_saves()
        return key

    arch = sys.argv[1] if len(sys.argv) > 1 else "sm_90a"
    keys = kernel_keys(arch)
    with ProcessPoolExecutor(int(sys.argv[2]) if len(sys.argv) > 2 else 2) as pool:
        for i, key in enumerate(pool.map(_compile, keys)):
            print(f"{i + 1}/{len(keys)} {key.backend} {key.tile}", flush=True)
