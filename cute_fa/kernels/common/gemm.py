"""Warp-level GEMM from shared memory with ldmatrix, shared by the kernels.

A fragment of B for one k-step of a head_dim-128 tile is 16 (K) or 32 (V) registers;
loading a whole k-step ahead (double buffering) on top of the O and S accumulators
pushes the kernel past 255 registers. With `fine` (the default) B is loaded one
ldmatrix ahead instead, and the MMAs of each ldmatrix run as soon as it lands;
without it, one k-step ahead (the classic FA2 loop). A (Q) is loaded a k-step ahead;
when A is already in registers (P) it is not loaded at all. Which one spills less is
ptxas's call, measured per kernel (tests/test_compile_forward.py).

The k-step loops are `cutlass.range(..., unroll_full=True)`: traced once and unrolled by the
compiler, where the loop index becomes a constant again, so every fragment index is static
as before. Unrolled in Python (`range_constexpr`) the DSL traced every ldmatrix and MMA one by
one, which took about a third of a first call's compile time. The one exception: the causal
TMA kernel's S GEMM, whose fp16 head_dim-64 kernel, register-capped, spills 4 bytes when the
compiler unrolls it (ptxas sees a differently ordered loop body) and none when Python does.
"""

import cutlass
import cutlass.cute as cute


def _with_unit_mode(t):
    """(V, ...) -> (V, ..., 1): the rank the GEMM dispatch wants for a single MMA column."""
    return cute.make_tensor(t.iterator, cute.append(t.layout, cute.make_layout(1)))


def _load_next_then_mma(tiled_mma, acc, tCrA, tCrB, s2r_b, tCsB, tCrB_view, s2r_a, tCsA,
                        tCrA_view, k):
    """One k-step of the k-step path: ldmatrix k-step k + 1 (A only if s2r_a is given), then
    the MMAs of k-step k."""
    if s2r_a is not None:
        cute.copy(s2r_a, tCsA[None, None, k + 1], tCrA_view[None, None, k + 1])
    cute.copy(s2r_b, tCsB[None, None, k + 1], tCrB_view[None, None, k + 1])
    cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)


@cute.jit
def gemm_ldmatrix(tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
                  s2r_b: cute.TiledCopy, tCsB: cute.Tensor, tCrB_view: cute.Tensor,
                  s2r_a: cute.TiledCopy = None, tCsA: cute.Tensor = None,
                  tCrA_view: cute.Tensor = None, fine: cutlass.Constexpr = True,
                  python_unrolled: cutlass.Constexpr = False):
    """acc += A @ B over all k-steps; B (and A if s2r_a is given) read from smem with ldmatrix.

    tCrB_view[None, c, k] is the c-th ldmatrix of k-step k; it covers MMA columns
    c * per_copy ... (c + 1) * per_copy - 1 of tCrB. python_unrolled (k-step path only) traces
    each k-step in Python instead of letting the compiler unroll the loop.
    """
    num_k = cute.size(tCrB.shape[2])
    if cutlass.const_expr(not fine):
        if cutlass.const_expr(s2r_a is not None):
            cute.copy(s2r_a, tCsA[None, None, 0], tCrA_view[None, None, 0])
        cute.copy(s2r_b, tCsB[None, None, 0], tCrB_view[None, None, 0])
        # k-steps 0 .. num_k - 2 load the next k-step first; the last one has nothing to load
        if cutlass.const_expr(python_unrolled):
            for k in cutlass.range_constexpr(num_k - 1):
                _load_next_then_mma(tiled_mma, acc, tCrA, tCrB, s2r_b, tCsB, tCrB_view, s2r_a,
                                    tCsA, tCrA_view, k)
        else:
            for k in cutlass.range(num_k - 1, unroll_full=True):
                _load_next_then_mma(tiled_mma, acc, tCrA, tCrB, s2r_b, tCsB, tCrB_view, s2r_a,
                                    tCsA, tCrA_view, k)
        cute.gemm(tiled_mma, acc, tCrA[None, None, num_k - 1], tCrB[None, None, num_k - 1], acc)
        return
    n_copy = cute.size(tCrB_view.shape[1])
    per_copy = cute.size(tCrB.shape[1]) // n_copy
    n_steps = num_k * n_copy  # step i is ldmatrix c = i % n_copy of k-step k = i // n_copy
    if cutlass.const_expr(s2r_a is not None):
        cute.copy(s2r_a, tCsA[None, None, 0], tCrA_view[None, None, 0])
    cute.copy(s2r_b, tCsB[None, 0, 0], tCrB_view[None, 0, 0])
    for i in cutlass.range(n_steps, unroll_full=True):
        k, c = i // n_copy, i % n_copy
        if cutlass.const_expr(s2r_a is not None):
            if c == 0 and k + 1 < num_k:
                cute.copy(s2r_a, tCsA[None, None, k + 1], tCrA_view[None, None, k + 1])
        if i + 1 < n_steps:
            k1, c1 = (i + 1) // n_copy, (i + 1) % n_copy
            cute.copy(s2r_b, tCsB[None, c1, k1], tCrB_view[None, c1, k1])
        for j in cutlass.range_constexpr(per_copy):
            n = c * per_copy + j
            acc_n = _with_unit_mode(acc[None, None, n])
            cute.gemm(tiled_mma, acc_n, tCrA[None, None, k], _with_unit_mode(tCrB[None, n, k]),
                      acc_n)
