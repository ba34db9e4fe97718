"""Copies: gmem->smem with cp.async, smem->registers with ldmatrix, O stores.

The gmem<->smem copies move 128 bits per thread per instruction: a row of the
swizzle atom is split over `copy_threads_per_row` threads, and the thread
block covers `copy_rows_per_pass` rows per pass (for the configuration of
docs/walkthrough.md §4: threads (16,8):(8,1), values (1,8), so thread t copies row t/8 + 16r,
columns 8*(t%8)...+7).
"""

import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from ._types import cutlass_dtype
from .config import COPY_BITS, TileConfig


def _copy_thread_layout(cfg: TileConfig):
    per_row = cfg.copy_threads_per_row
    return cute.make_layout((cfg.num_threads // per_row, per_row), stride=(per_row, 1))


def _copy_value_layout(cfg: TileConfig):
    return cute.make_layout((1, cfg.vector_elems))


def gmem_tiled_copy_qkv(cfg: TileConfig):
    """cp.async.cg 16-byte copies of a Q, K or V tile into shared memory."""
    atom = cute.make_copy_atom(
        cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
        cutlass_dtype(cfg.dtype),
        num_bits_per_copy=COPY_BITS,
    )
    return cute.make_tiled_copy_tv(atom, _copy_thread_layout(cfg), _copy_value_layout(cfg))


def gmem_tiled_copy_o(cfg: TileConfig):
    """16-byte vector stores of the O tile, with the same thread split as the loads."""
    atom = cute.make_copy_atom(
        cute.nvgpu.CopyUniversalOp(), cutlass_dtype(cfg.dtype), num_bits_per_copy=COPY_BITS
    )
    return cute.make_tiled_copy_tv(atom, _copy_thread_layout(cfg), _copy_value_layout(cfg))


def _ldmatrix(cfg: TileConfig, transpose: bool):
    return cute.make_copy_atom(
        warp.LdMatrix8x8x16bOp(transpose=transpose, num_matrices=4), cutlass_dtype(cfg.dtype)
    )


def smem_tiled_copy_q(cfg: TileConfig, tiled_mma):
    """ldmatrix.x4 of Q into the A fragments of Q@K^T."""
    return cute.make_tiled_copy_A(_ldmatrix(cfg, transpose=False), tiled_mma)


def smem_tiled_copy_k(cfg: TileConfig, tiled_mma):
    """ldmatrix.x4 of K into the B fragments of Q@K^T (K(key,d) is already K-major)."""
    return cute.make_tiled_copy_B(_ldmatrix(cfg, transpose=False), tiled_mma)


def smem_tiled_copy_v(cfg: TileConfig, tiled_mma):
    """ldmatrix.x4.trans of V: V is stored (key, d) but P@V wants B as (d, key)."""
    return cute.make_tiled_copy_B(_ldmatrix(cfg, transpose=True), tiled_mma)


def smem_tiled_copy_o(cfg: TileConfig, tiled_mma):
    """Accumulator-shaped stores of the converted O fragment into sO."""
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass_dtype(cfg.dtype))
    return cute.make_tiled_copy_C(atom, tiled_mma)
