"""The backward pass's layouts: its shared-memory tiles, their transposed views, its three
TiledMMAs and the ldmatrix copies that feed them.

The backward computes five products per (query block, key block) pair:

    S  = Q K^T      (block_m x block_n)   A = Q (row-major),  B = K (row-major)
    dP = dO V^T     (block_m x block_n)   A = dO,             B = V
    dV += P^T dO    (block_n x head_dim)  A = P^T,            B = dO^T
    dK += dS^T Q    (block_n x head_dim)  A = dS^T,           B = Q^T
    dQ  = dS K      (block_m x head_dim)  A = dS,             B = K^T

mma.sync wants A as (M, K) and B as (N, K), K contiguous in each 8x8 matrix. Q, dO, K, V, P and
dS are stored row by row (their second index contiguous), so the first two products read them
as they are, and the last three read transposed views of the same bytes (`transposed`):
ldmatrix.trans hands each thread the transposed 8x8 matrices, so nothing is copied. The
swizzle (`smem.smem_layout_atom`) is the forward's: 16-byte chunks XORed by row, which keeps
both the row-wise and the transposed ldmatrix reads free of bank conflicts.
"""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warp

from ._types import cutlass_dtype
from .config import MMA_K, MMA_M, MMA_N, BwdTileConfig
from .smem import smem_layout_atom


def tiled_mma(cfg: BwdTileConfig, warps: tuple):
    """The m16n8k16 TiledMMA over a (wm x wn) = warps grid, tiling its product in
    (16 wm) x (16 wn) steps: warp w sits at (w % wm, w // wm) and takes m16 atoms w % wm,
    w % wm + wm, ... and n8 atoms w // wm, w // wm + wn, ..., so its two n8 atoms of a step are
    8 wn columns apart (one ldmatrix.x4 still feeds both B fragments; `explain.BwdLayouts`
    shows every thread's share)."""
    wm, wn = warps
    return cute.make_tiled_mma(
        warp.MmaF16BF16Op(cutlass_dtype(cfg.dtype), cutlass.Float32, (MMA_M, MMA_N, MMA_K)),
        (wm, wn, 1), permutation_mnk=(wm * MMA_M, wn * 2 * MMA_N, MMA_K))


def tiled_mma_sdp(cfg: BwdTileConfig):
    """S = Q K^T and dP = dO V^T: (block_m x block_n), the same thread layout for both, so a
    thread holds S and dP of the same (query, key) pairs."""
    return tiled_mma(cfg, cfg.warps_sdp)


def tiled_mma_dkv(cfg: BwdTileConfig):
    """dV += P^T dO and dK += dS^T Q: (block_n x head_dim)."""
    return tiled_mma(cfg, cfg.warps_dkv)


def tiled_mma_dq(cfg: BwdTileConfig):
    """dQ = dS K: (block_m x head_dim)."""
    return tiled_mma(cfg, cfg.warps_dq)


class _Atom:
    """A swizzle atom's parameters for a tile whose rows are `cols` elements wide."""

    def __init__(self, cols: int, cfg: BwdTileConfig):
        self.smem_atom_cols = cols
        self.swizzle_bits = (cols // cfg.vector_elems).bit_length() - 1


def smem_layout_q(cfg: BwdTileConfig):
    """(block_m, head_dim_padded, q_stages): Q's and dO's ring."""
    return cute.tile_to_shape(smem_layout_atom(cfg), (cfg.block_m, cfg.head_dim_padded,
                                                      cfg.q_stages), (0, 1, 2))


def smem_layout_kv(cfg: BwdTileConfig):
    """(block_n, head_dim_padded): K's and V's tile (and at the end dK's and dV's)."""
    return cute.tile_to_shape(smem_layout_atom(cfg), (cfg.block_n, cfg.head_dim_padded), (0, 1))


def smem_layout_ps(cfg: BwdTileConfig):
    """(block_m, block_n): P's and dS's tile, in the input dtype."""
    return cute.tile_to_shape(smem_layout_atom(_Atom(cfg.ps_atom_cols, cfg)),
                              (cfg.block_m, cfg.block_n), (0, 1))


def transposed(sX, rows: int, cols: int, stages: int = 0):
    """sXt(c, r[, stage]): the same bytes as sX(r, c[, stage]) (a rows x cols tile), read with
    the two indices swapped: the operand view of P^T, dS^T, dO^T, Q^T and K^T."""
    if not stages:
        return cute.composition(sX, cute.make_layout((cols, rows), stride=(rows, 1)))
    return cute.composition(sX, cute.make_layout((cols, rows, stages),
                                                 stride=(rows, 1, rows * cols)))


def shared_storage(cfg: BwdTileConfig):
    """Q, dO (q_stages each), K, V, P and dS, each 1024-byte aligned (whole swizzle atoms)."""
    dtype = cutlass_dtype(cfg.dtype)
    q = cute.cosize(smem_layout_q(cfg))
    kv = cute.cosize(smem_layout_kv(cfg))
    ps = cute.cosize(smem_layout_ps(cfg))

    @cute.struct
    class BwdStorage:
        sQ: cute.struct.Align[cute.struct.MemRange[dtype, q], 1024]
        sdO: cute.struct.Align[cute.struct.MemRange[dtype, q], 1024]
        sK: cute.struct.Align[cute.struct.MemRange[dtype, kv], 1024]
        sV: cute.struct.Align[cute.struct.MemRange[dtype, kv], 1024]
        sP: cute.struct.Align[cute.struct.MemRange[dtype, ps], 1024]
        sdS: cute.struct.Align[cute.struct.MemRange[dtype, ps], 1024]
    return BwdStorage


def _ldmatrix(cfg: BwdTileConfig, transpose: bool):
    return cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=transpose, num_matrices=4),
                               cutlass_dtype(cfg.dtype))


def smem_copy_a(cfg: BwdTileConfig, mma, transpose: bool = False):
    """ldmatrix.x4 into A fragments of `mma`; transpose: from a transposed view (P^T, dS^T)."""
    return cute.make_tiled_copy_A(_ldmatrix(cfg, transpose), mma)


def smem_copy_b(cfg: BwdTileConfig, mma, transpose: bool = False):
    """ldmatrix.x4 into B fragments of `mma`; transpose: from a transposed view (dO^T, Q^T,
    K^T)."""
    return cute.make_tiled_copy_B(_ldmatrix(cfg, transpose), mma)


def r2s_copy_ps(cfg: BwdTileConfig, mma):
    """Stores of P and dS from the S/dP accumulator's layout into their smem tiles, two
    neighbouring columns (32 bits) at a time."""
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass_dtype(cfg.dtype),
                               num_bits_per_copy=2 * 8 * cfg.elem_bytes)
    return cute.make_tiled_copy_C(atom, mma)


def dq_block(m_block, batch, block_m: int, cu_seqlens_q=None):
    """Where query block m_block of entry `batch` sits in dQaccum: m_block, or in a ragged batch
    cu_seqlens_q[batch] // block_m + batch + m_block (each entry's blocks start on a block of
    their own, past the previous entry's last, partial one; `config.dq_accum_blocks` sizes the
    buffer by the same rule). The wgmma backward's dK/dV sums place key blocks by it too, with
    block_n and cu_seqlens_k."""
    if cu_seqlens_q is None:
        return m_block
    return cu_seqlens_q[batch] // block_m + batch + m_block


def dq_vector(arch: str) -> int:
    """Floats one thread adds into dQaccum per reduction: 4 where red.global.add.v4.f32 exists
    (sm90 on), else 1."""
    from ..arch import Arch

    return 4 if Arch.of_name(arch).major >= 9 else 1


def accum_chunk(maccum, batch, head, block, rows: int, cols: int, num_threads: int,
                vec: int = 1):
    """The float32 sums of one block (rows x cols) of a gradient, in its TiledMMA's register
    order rather than row by row: thread t's accumulator elements vec * r ... vec * r + vec - 1
    live at (r * num_threads + t) * vec, so a warp's reductions (and the postprocess's loads)
    cover 32 * vec consecutive floats, where the rows of an MMA fragment would scatter them over
    8 rows. Indexed [element, thread]. maccum: (batch, heads, blocks * rows * cols)."""
    return cute.make_tensor(maccum[batch, head, None].iterator + block * rows * cols,
                            accum_chunk_layout(rows, cols, num_threads, vec))


def accum_chunk_layout(rows: int, cols: int, num_threads: int, vec: int = 1):
    """The [element, thread] layout of one block's float32 sums (`accum_chunk`): the same over
    a block of dQaccum and over the shared-memory image of it that the Hopper backward's dQ
    writer adds in one bulk reduction (`WgmmaBwdTileConfig.dq_writer`)."""
    size = rows * cols
    return cute.make_layout(((vec, size // (num_threads * vec)), num_threads),
                            stride=((1, num_threads * vec), vec))


def dq_accum_chunk(mdQaccum, batch, head, block, cfg: BwdTileConfig, vec: int = 1):
    """`accum_chunk` of one query block's dQ (block_m x head_dim_padded, the dQ TiledMMA's
    threads)."""
    return accum_chunk(mdQaccum, batch, head, block, cfg.block_m, cfg.head_dim_padded,
                       cfg.num_threads, vec)


def kv_accum_chunk(mKVaccum, batch, head_kv, block, cfg, vec: int = 1):
    """`accum_chunk` of one key block's dK or dV (block_n x head_dim_padded, the dK/dV
    TiledMMA's threads): the wgmma backward's float32 sums where several CTAs share a key
    block (a K/V group's query heads split over CTAs)."""
    return accum_chunk(mKVaccum, batch, head_kv, block, cfg.block_n, cfg.head_dim_padded,
                       cfg.num_threads, vec)
