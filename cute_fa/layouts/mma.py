"""The SM80 m16n8k16 TiledMMA and the register views of its accumulator.

Warps are stacked along M (query rows): warp w owns rows 16w..16w+15 of every
16*num_warps-row slab, and each warp sweeps all keys, so a softmax row never
leaves its warp. The N tile is 16 (two n8 atoms) so that one ldmatrix.x4
feeds two B fragments.
"""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warp

from ._types import cutlass_dtype
from .config import MMA_K, MMA_M, MMA_N, TileConfig


def tiled_mma(cfg: TileConfig):
    return cute.make_tiled_mma(
        warp.MmaF16BF16Op(cutlass_dtype(cfg.dtype), cutlass.Float32, (MMA_M, MMA_N, MMA_K)),
        (cfg.num_warps, 1, 1),
        permutation_mnk=(cfg.num_warps * MMA_M, 2 * MMA_N, MMA_K),
    )


def acc_rowcol_layout(acc_layout):
    """View an accumulator ((2,2), MMA_M, MMA_N) as (rows, cols) = ((2,MMA_M), (2,MMA_N)).

    Row mode: the thread's two rows g and g+8 of each M repeat; column mode: its
    two adjacent columns of each n8 atom. For the tCrS of docs/walkthrough.md §8 this is
    ((2,1),(2,8)):((2,0),(1,4)): register slot 2*mi + b + 4*nj.
    """
    flat = cute.make_layout(acc_layout.shape)
    rowcol = cute.make_layout(
        ((flat.shape[0][1], flat.shape[1]), (flat.shape[0][0], flat.shape[2])),
        stride=((flat.stride[0][1], flat.stride[1]), (flat.stride[0][0], flat.stride[2])),
    )
    return cute.composition(acc_layout, rowcol)


def acc_to_a_layout(acc_layout):
    """View the S accumulator (4, MMA_M, MMA_N) as the A operand of P@V: ((4,2), MMA_M, MMA_N/2).

    The m16n8 C fragment of two neighbouring n8 atoms holds exactly the values
    that one m16k16 A fragment needs, in the same thread, so P never moves.
    """
    divided = cute.logical_divide(acc_layout, (None, None, 2))
    return cute.make_layout(
        ((divided.shape[0], divided.shape[2][0]), divided.shape[1], divided.shape[2][1]),
        stride=((divided.stride[0], divided.stride[2][0]), divided.stride[1], divided.stride[2][1]),
    )


def row_reduce_offsets(mma) -> tuple:
    """XOR shuffle offsets that combine one accumulator row across its owner lanes.

    Read off the MMA atom's C layout: a lane bit belongs to the row reduction
    when flipping it keeps the lane on the same rows. Largest offset first, as
    the quad all-reduce of docs/walkthrough.md §9 (XOR 2, then XOR 1).
    """
    tv = mma.tv_layout_C  # (lane, value) -> column-major index in the 16x8 atom

    def rows(lane):
        return {tv((lane, v)) % MMA_M for v in range(cute.size(tv, mode=[1]))}

    num_lanes = cute.size(tv, mode=[0])
    offsets = [
        bit
        for bit in (1 << i for i in range(num_lanes.bit_length() - 1))
        if all(rows(lane) == rows(lane ^ bit) for lane in range(num_lanes))
    ]
    return tuple(sorted(offsets, reverse=True))
