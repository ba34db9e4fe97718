"""Float32 accumulators into 16-bit MMA operands, two values per instruction.

`pack_pairs` writes each pair of neighbouring values with one `cvt.rn.{bf16,f16}x2.f32` into
one 32-bit register. The plain `tensor.load().to(dtype)` leaves a truncation per value, and
in a loop whose P is carried into the next round (the wgmma kernel's intra-warpgroup overlap)
LLVM folds the round's truncations through the loop's phi: the next round then carries P as
float32 (twice the registers, live next to the new S and O) and converts one value at a time.
An inline conversion is not a cast LLVM can move, so P stays packed where it is written.
"""

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


@dsl_user_op
def _cvt_x2(lo, hi, ptx_type: str, *, loc=None, ip=None) -> cutlass.Int32:
    """lo in the low half, hi in the high half (cvt's first source is the high one), rounded
    to nearest even as `.to(dtype)` rounds."""
    packed = llvm.inline_asm(
        T.i32(),
        [cutlass.Float32(hi).ir_value(loc=loc, ip=ip),
         cutlass.Float32(lo).ir_value(loc=loc, ip=ip)],
        f"cvt.rn.{ptx_type}x2.f32 $0, $1, $2;", "=r,f,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    return cutlass.Int32(packed)


@cute.jit
def pack_pairs(src: cute.Tensor, dst: cute.Tensor):
    """dst (16-bit, a register tensor of src's compact shape) = src (float32), value 2i and
    2i + 1 of the storage order in one 32-bit register: the pair an MMA's A fragment holds in
    one register, where dst is the accumulator's own layout read as an operand."""
    ptx_type = "bf16" if cutlass.const_expr(dst.element_type is cutlass.BFloat16) else "f16"
    words = cute.make_tensor(cute.recast_ptr(dst.iterator, dtype=cutlass.Int32),
                             cute.make_layout(cute.size(dst) // 2))
    for i in cutlass.range_constexpr(cute.size(words)):
        words[i] = _cvt_x2(src[2 * i], src[2 * i + 1], ptx_type)
