"""The Hopper kernel's MMAs: warpgroup MMA (wgmma) tiles, their accumulator views and the
warp roles of the warp-specialized kernel (`kernels/fwd/sm90.py`).

A wgmma is issued by a warpgroup (4 warps, 128 threads) and computes a 64 x N tile: A comes
from shared memory through a descriptor (S = Q K^T: both operands in smem, "SS") or from
registers (O += P V: P stays where the softmax left it, "RS"), B always from shared memory.
Consumer warpgroup g owns query rows 64 g ... 64 g + 63 of the CTA's tile, so a row never
leaves its warpgroup; inside it warp w holds rows 16 w ... 16 w + 15, and each lane two of
them (g and g + 8, as in mma.sync's m16n8 C fragment) and two adjacent columns of every
8-column slice of N.

The shared-memory operands are the TMA tiles of `tma.tma_smem_layout` as they land: K-major
(head_dim contiguous) 128-byte (64-byte) swizzled atoms for Q and K, and the same bytes of V
read as an MN-major B operand (V is (key, d) with d contiguous; P V wants B as (d, key)). The
descriptors the DSL builds from these layouts carry their swizzle mode.
"""

from dataclasses import dataclass

from .config import TileConfig

WARPGROUP_THREADS = 128
WGMMA_M = 64  # rows of one warpgroup's MMA
WGMMA_K = 16  # k of one 16-bit wgmma instruction

# (ctas_per_sm, consumer warpgroups) -> (producer, consumer) registers per thread after
# setmaxnreg (multiples of 8 in [24, 256]) within 64K / ctas_per_sm registers per CTA: the
# producer keeps the fewest its TMA loop and row loads need (one consumer at one CTA per SM
# is capped by 256 and leaves the rest unused).
_REGISTER_SPLITS = {(1, 1): (56, 256), (1, 2): (24, 240), (1, 3): (32, 160), (2, 1): (24, 232)}


@dataclass(frozen=True)
class WarpRoles:
    """Who does what in the warp-specialized CTA: warpgroup 0 is the producer (its warp 0
    issues every TMA load; in the forward the other three warps only hand their registers back,
    in the backward warp 1 also loads the LSE and D rows, and warp 2 adds dQ's sums where the
    tile has a dQ writer), warpgroups 1 ... consumers run the
    MMAs and the softmax. setmaxnreg moves registers from the producer to the consumers: the
    register file's share of one CTA (64K registers / ctas_per_sm) is split as
    producer_regs x 128 + consumer_regs x 128 x consumers."""

    consumers: int
    ctas_per_sm: int = 1

    def __post_init__(self):
        if (self.ctas_per_sm, self.consumers) not in _REGISTER_SPLITS:
            raise ValueError(f"no register split for {self.consumers} consumer warpgroups at "
                             f"{self.ctas_per_sm} CTAs per SM; have "
                             f"{sorted(_REGISTER_SPLITS)} as (ctas_per_sm, consumers)")

    @property
    def threads(self) -> int:
        return WARPGROUP_THREADS * (self.consumers + 1)

    @property
    def consumer_threads(self) -> int:
        return WARPGROUP_THREADS * self.consumers

    @property
    def producer_regs(self) -> int:
        return _REGISTER_SPLITS[self.ctas_per_sm, self.consumers][0]

    @property
    def consumer_regs(self) -> int:
        return _REGISTER_SPLITS[self.ctas_per_sm, self.consumers][1]

    def role(self, warp: int) -> str:
        """'tma' (warp 0), 'idle' (warps 1-3) or 'consumer <g>' for a warp index of the CTA."""
        if warp == 0:
            return "tma"
        if warp < 4:
            return "idle"
        return f"consumer {warp // 4 - 1}"


def warp_roles(cfg: TileConfig) -> WarpRoles:
    """The roles of a wgmma tile: one consumer warpgroup per 64 query rows."""
    return WarpRoles(cfg.num_threads // WARPGROUP_THREADS)


def check_tile(cfg: TileConfig) -> None:
    """The wgmma kernel's tile rules, before any tracing: 64 query rows per consumer
    warpgroup (1-3 of them), key blocks a multiple of 16 (P V's k) up to 256 (S's N)."""
    if cfg.num_threads % WARPGROUP_THREADS or not 1 <= cfg.num_threads // 128 <= 3:
        raise ValueError(f"num_threads must be 128, 256 or 384 (1-3 consumer warpgroups) for "
                         f"the wgmma kernel, got {cfg.num_threads}")
    if cfg.block_m != WGMMA_M * (cfg.num_threads // WARPGROUP_THREADS):
        raise ValueError(f"block_m must be 64 per consumer warpgroup = "
                         f"{WGMMA_M * (cfg.num_threads // WARPGROUP_THREADS)}, got {cfg.block_m}")
    if cfg.block_n % 16 or not 16 <= cfg.block_n <= 256:
        raise ValueError(f"block_n must be a multiple of 16 in [16, 256] for the wgmma kernel, "
                         f"got {cfg.block_n}")


def tiled_mma_qk(cfg: TileConfig):
    """S = Q K^T: SS-wgmma 64 x block_n x 16, one atom per consumer warpgroup stacked along M;
    both operands K-major (head_dim contiguous)."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90

    from ._types import cutlass_dtype

    dtype = cutlass_dtype(cfg.dtype)
    return sm90.make_trivial_tiled_mma(
        dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K,
        cutlass.Float32, atom_layout_mnk=(cfg.block_m // WGMMA_M, 1, 1),
        tiler_mn=(WGMMA_M, cfg.block_n))


def tiled_mma_pv(cfg: TileConfig):
    """O += P V: RS-wgmma 64 x head_dim_padded x 16, A (P) from registers, B (V^T) MN-major:
    the V tile read in place, d contiguous."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90
    from cutlass.cute.nvgpu import warpgroup

    from ._types import cutlass_dtype

    dtype = cutlass_dtype(cfg.dtype)
    return sm90.make_trivial_tiled_mma(
        dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN,
        cutlass.Float32, atom_layout_mnk=(cfg.block_m // WGMMA_M, 1, 1),
        tiler_mn=(WGMMA_M, cfg.head_dim_padded), a_source=warpgroup.OperandSource.RMEM)


def transposed(sX):
    """sXt(c, r[, stage]): a tile sX(r, c[, stage]) read with its first two indices swapped, in
    place: the MN-major operand views whose descriptors the DSL builds from the same swizzled
    bytes (the forward's V^T for P V; the backward's dO^T, Q^T, K^T, and dS^T over dS)."""
    import cutlass.cute as cute

    shape = (sX.shape[1], sX.shape[0], *sX.shape[2:])
    order = (1, 0, *range(2, cute.rank(sX)))
    return cute.composition(sX, cute.make_ordered_layout(shape, order=order))


def stmatrix_copy_c(cfg: TileConfig, tiled_mma):
    """stmatrix (8x8 16-bit matrices, four per instruction) of a converted wgmma accumulator
    into a 16-bit shared-memory tile addressed by the accumulator's coordinates (the forward's O
    as the TMA store reads it, the backward's dS^T into dS's transposed view): a warp's C
    fragment of m64nNk16 is, per 8x8 block, exactly one stmatrix matrix (lane l holds row
    l // 4, columns 2 (l % 4) and + 1), so each thread writes 16 bytes per instruction instead
    of 4."""
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import warp

    from ._types import cutlass_dtype

    atom = cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4),
                               cutlass_dtype(cfg.dtype))
    return cute.make_tiled_copy_C(atom, tiled_mma)


def acc_rowcol_layout(acc_layout):
    """A wgmma accumulator ((2, 2, N/8), MMA_M, MMA_N) as (rows, cols) =
    ((2, MMA_M), ((2, N/8), MMA_N)): value (j, i, k) is row i (g or g + 8) and column
    j + 8 k of the thread's share (j: the two adjacent columns, k: the 8-column slice)."""
    import cutlass.cute as cute

    flat = cute.make_layout(acc_layout.shape)
    s0, st0 = flat.shape[0], flat.stride[0]
    rowcol = cute.make_layout(
        ((s0[1], flat.shape[1]), ((s0[0], s0[2]), flat.shape[2])),
        stride=((st0[1], flat.stride[1]), ((st0[0], st0[2]), flat.stride[2])))
    return cute.composition(acc_layout, rowcol)


def acc_to_a_layout(acc_layout):
    """The S accumulator ((2, 2, N/8), MMA_M, MMA_N) as the register A operand of P V,
    ((2, 2, 2), MMA_M, (N/16, MMA_N)): two neighbouring 8-column slices of the C fragment are
    exactly one k16 A fragment of the same thread (rows g, g + 8; columns 2 (l % 4) + {0, 1}
    and + 8), so P never moves between lanes."""
    import cutlass.cute as cute

    div = cute.logical_divide(acc_layout, ((None, None, 2), None, None))
    return cute.make_layout(
        ((div.shape[0][0], div.shape[0][1], div.shape[0][2][0]), div.shape[1],
         (div.shape[0][2][1], div.shape[2])),
        stride=((div.stride[0][0], div.stride[0][1], div.stride[0][2][0]), div.stride[1],
                (div.stride[0][2][1], div.stride[2])))


def row_reduce_offsets(tiled_mma) -> tuple:
    """XOR shuffle offsets that combine one accumulator row across the lanes holding it, read
    off the wgmma atom's C layout (threads of a warpgroup x values -> column-major index in
    the 64 x N tile): a lane bit belongs to the reduction when flipping it keeps every lane of
    a warp on the same rows. Only lane bits qualify (other warps hold other rows), and a
    thread's rows all appear among its first 8 values (two columns x two rows x two 8-column
    slices; the slices repeat the rows), which keeps this cheap while a kernel is traced.
    Largest first."""
    import cutlass.cute as cute

    tv = tiled_mma.tv_layout_C
    n_values = min(8, cute.size(tv, mode=[1]))
    rows = [{tv((t, v)) % WGMMA_M for v in range(n_values)} for t in range(32)]
    offsets = [bit for bit in (1, 2, 4, 8, 16) if all(rows[t] == rows[t ^ bit] for t in range(32))]
    return tuple(sorted(offsets, reverse=True))
