"""Fake arguments for `cute.compile`: one per argument of a kernel's backend that its key takes
(None for those it does not), with symbolic extents and strides, so a new shape never
recompiles."""

from __future__ import annotations

from .keys import KernelKey
from .registry import backend_of, used_arguments


def fake_arguments(key: KernelKey) -> tuple:
    """Fake tensors and scalars for `cute.compile`, one per argument of the key's backend (None
    where the key does not take it, `registry.used_arguments`), then the stream: batch,
    sequence and head extents and strides symbolic, so a new shape never recompiles."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from ..layouts._types import cutlass_dtype

    if hasattr(key, "tile"):
        dtype, head_dim = cutlass_dtype(key.tile.dtype), key.tile.head_dim
        # split-KV kernels write float32 partials
        out_dtype = cutlass.Float32 if getattr(key, "split_kv", False) else dtype
    else:  # the merge
        dtype, head_dim, out_dtype = cutlass_dtype(key.in_dtype), key.head_dim, \
            cutlass_dtype(key.out_dtype)

    def qkvo(element=dtype, rank=4):
        stride = tuple(cute.sym_int64(divisibility=8) for _ in range(rank - 1)) + (1,)
        shape = tuple(cute.sym_int() for _ in range(rank - 1)) + (head_dim,)
        return make_fake_tensor(element, shape, stride=stride, assumed_align=16)

    def lse():
        return make_fake_tensor(cutlass.Float32, (cute.sym_int(), cute.sym_int(), cute.sym_int()),
                                stride=(cute.sym_int64(), cute.sym_int64(), 1), assumed_align=4)

    def int32_vector():
        return make_fake_tensor(cutlass.Int32, (cute.sym_int(),), stride=(1,), assumed_align=4)

    def int32_matrix():
        return make_fake_tensor(cutlass.Int32, (cute.sym_int(), cute.sym_int()),
                                stride=(cute.sym_int64(), 1), assumed_align=4)

    def lse_parts():
        return make_fake_tensor(cutlass.Float32, tuple(cute.sym_int() for _ in range(4)),
                                stride=tuple(cute.sym_int64() for _ in range(3)) + (1,),
                                assumed_align=4)

    def int32_tensor3():
        return make_fake_tensor(cutlass.Int32, tuple(cute.sym_int() for _ in range(3)),
                                stride=(cute.sym_int64(), cute.sym_int64(), 1), assumed_align=4)

    def accum3():
        return make_fake_tensor(cutlass.Float32, tuple(cute.sym_int() for _ in range(3)),
                                stride=(cute.sym_int64(), cute.sym_int64(), 1), assumed_align=16)

    def score_tensors():
        """The mods' captured tensors, in slot order: any extents and strides (a table may
        be a broadcast view), element-aligned (a 0-d capture travels as one element); then
        the sink logits, float32 (heads_q,); then a block mask's counts and indices; then a
        float32 gradient per `BwdKey.capture_grads` slot, of that capture's rank."""
        from ..kernels.common.mods import DTYPES

        return tuple(make_fake_tensor(
            DTYPES[c.dtype], tuple(cute.sym_int() for _ in range(max(c.ndim, 1))),
            stride=tuple(cute.sym_int64() for _ in range(max(c.ndim, 1))),
            assumed_align=max(DTYPES[c.dtype].width // 8, 1)) for c in key.mod_captures
        ) + ((make_fake_tensor(cutlass.Float32, (cute.sym_int(),), stride=(1,),
                               assumed_align=4),) if key.sinks else ()) + (
            (int32_tensor(3), int32_tensor(4)) if key.block_sparse else ()) + tuple(
            make_fake_tensor(cutlass.Float32, tuple(cute.sym_int() for _ in range(max(
                key.score_mod.captures[slot].ndim, 1))), stride=tuple(cute.sym_int64() for _ in
                range(max(key.score_mod.captures[slot].ndim, 1))), assumed_align=4)
            for slot in getattr(key, "capture_grads", ()))

    def int32_tensor(rank):
        """A block mask's counts (batch, heads, query blocks) or indices (..., key blocks):
        batch and heads may be broadcast (stride 0)."""
        return make_fake_tensor(cutlass.Int32, tuple(cute.sym_int() for _ in range(rank)),
                                stride=tuple(cute.sym_int64() for _ in range(rank - 1)) + (1,),
                                assumed_align=4)

    make = {"qkvo": qkvo, "score_tensors": score_tensors, "accum3": accum3, "int32_tensor3": int32_tensor3,
            "out": lambda: qkvo(out_dtype), "lse": lse,
            "o_parts": lambda: qkvo(dtype, 5), "lse_parts": lse_parts,
            "int32_vector": int32_vector, "int32_matrix": int32_matrix,
            "float32": lambda: cutlass.Float32(1.0), "int32": lambda: cutlass.Int32(0)}
    arguments = zip(backend_of(key).arguments, used_arguments(key))
    return tuple(make[a.kind]() if used else None for a, used in arguments) + (
        make_fake_stream(use_tvm_ffi_env_stream=True),)
