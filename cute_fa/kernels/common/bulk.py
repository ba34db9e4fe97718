"""Bulk (non-tensor) asynchronous copies between shared and global memory, which the DSL's
`cute.arch` has no op for."""

import cutlass
import cutlass.cute as cute


@cute.jit
def reduce_add_f32(dst: cute.Pointer, src: cute.Pointer, nbytes: cutlass.Constexpr):
    """dst[i] += src[i] over nbytes of float32 (a multiple of 16), as float32 reductions at L2
    issued by one instruction (cp.reduce.async.bulk, a bulk-async group of its own once the
    caller commits): dst in global memory, src in this CTA's shared memory, both 16-byte
    aligned. The caller commits and waits (`cute.arch.cp_async_bulk_commit_group`,
    `cp_async_bulk_wait_group`) before it rewrites src (read=True) or hands the sums on."""
    cute.arch.inline_ptx(
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [{$r0}], [{$r1}], {$r2};",
        read_only_args=[dst.toint(), src.toint(), cutlass.Int32(nbytes)])
