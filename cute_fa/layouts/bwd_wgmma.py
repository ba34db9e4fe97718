"""The Hopper backward's layouts (`kernels/bwd/sm90.py`): its wgmma tiles, the dS tile and the
shared storage. Q, dO, K and V are the forward's TMA tiles (`tma.tma_smem_layout`, Q and dO a
ring of q_stages), read transposed through `wgmma.transposed`; dS^T goes to shared memory by
`wgmma.stmatrix_copy_c`. The warp roles and their register split are `wgmma.WarpRoles`'.

Per (query block, key block) pair the backward computes five products. With the keys on M
(each consumer warpgroup owns 64 keys of the CTA's block_n; the forward puts the queries
there):

    S^T  = K Q^T      (keys x queries)   SS: A = K (key, d),   B = Q (query, d), both K-major
    dP^T = V dO^T     (keys x queries)   SS: A = V,            B = dO
    dV  += P^T dO     (keys x d)         RS: A = P^T, the S^T accumulator in registers;
                                             B = dO^T (d, query), the dO tile read MN-major
    dK  += dS^T Q     (keys x d)         RS: A = dS^T in registers; B = Q^T, MN-major
    dQ   = dS K       (queries x d)      SS: A = dS (query, key) from shared memory, MN-major
                                             (query contiguous); B = K^T (d, key), MN-major
    (dQ^T = K^T dS^T  (d x queries)      SS: A = K^T, B = dS, both MN-major: where block_m
                                             is not a multiple of 64, `tiled_mma_dq`)

so P never leaves registers and dS goes through shared memory once: each warpgroup writes its
64 keys' rows of dS^T there with stmatrix (row = key, 8 consecutive queries per 16 bytes),
and dQ reads the whole (query, key) tile back as its A operand: dQ's warpgroups split d (each
computes dQ's columns d_g for all block_m queries over all block_n keys), so each reads the
rows of dS written by every warpgroup.

Under split_d (head_dim past 128) the two warpgroups share one block of 64 keys and split
everything else: S^T and dP^T by queries (warpgroup g computes the 64 keys x block_m / 2
queries q_g), dV, dK and dQ by d (g holds the columns d_g). P^T then goes through shared
memory as dS^T does (the same layout, `smem_layout_ds`), and dV and dK read both from there
as K-major A operands (the transposed (key, query) view: queries contiguous):

    dV  += P^T dO     SS: A = P^T from sP,  B = dO^T (d_g, query), MN-major
    dK  += dS^T Q     SS: A = dS^T from sdS, B = Q^T (d_g, query), MN-major
"""

from .config import WgmmaBwdTileConfig
from .tma import tma_smem_layout
from .wgmma import WGMMA_M


def _dsl():
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90
    from cutlass.cute.nvgpu import warpgroup

    from ._types import cutlass_dtype

    return cutlass, cute, sm90, warpgroup, cutlass_dtype


def tiled_mma_sdp(cfg: WgmmaBwdTileConfig):
    """S^T = K Q^T and dP^T = V dO^T: SS-wgmma 64 x block_m x 16, one atom per consumer
    warpgroup stacked along M (the keys); A and B K-major (head_dim contiguous). Under split_d
    the warpgroups sit side by side along N instead: 64 x block_m / 2 each."""
    cutlass, cute, sm90, _, dt = _dsl()
    K = cute.nvgpu.OperandMajorMode.K
    atoms, n = (((1, cfg.consumers, 1), cfg.block_m // cfg.consumers) if cfg.split_d
                else ((cfg.consumers, 1, 1), cfg.block_m))
    return sm90.make_trivial_tiled_mma(dt(cfg.dtype), dt(cfg.dtype), K, K, cutlass.Float32,
                                       atom_layout_mnk=atoms, tiler_mn=(WGMMA_M, n))


def tiled_mma_dkv(cfg: WgmmaBwdTileConfig):
    """dV += P^T dO and dK += dS^T Q: RS-wgmma 64 x head_dim_padded x 16, A from registers
    (the S^T accumulator's own thread layout), B (dO^T, Q^T) MN-major: the tiles read in
    place, d contiguous. Under split_d SS-wgmma 64 x head_dim_padded / 2 x 16 per
    warpgroup, side by side along N (d), A (P^T, dS^T) K-major from shared memory."""
    cutlass, cute, sm90, warpgroup, dt = _dsl()
    if cfg.split_d:
        return sm90.make_trivial_tiled_mma(
            dt(cfg.dtype), dt(cfg.dtype), cute.nvgpu.OperandMajorMode.K,
            cute.nvgpu.OperandMajorMode.MN, cutlass.Float32,
            atom_layout_mnk=(1, cfg.consumers, 1),
            tiler_mn=(WGMMA_M, cfg.head_dim_padded // cfg.consumers))
    return sm90.make_trivial_tiled_mma(
        dt(cfg.dtype), dt(cfg.dtype), cute.nvgpu.OperandMajorMode.K,
        cute.nvgpu.OperandMajorMode.MN, cutlass.Float32,
        atom_layout_mnk=(cfg.consumers, 1, 1), tiler_mn=(WGMMA_M, cfg.head_dim_padded),
        a_source=warpgroup.OperandSource.RMEM)


def tiled_mma_dq(cfg: WgmmaBwdTileConfig):
    """dQ = dS K: SS-wgmma 64 x (head_dim_padded / consumers) x 16, the consumer warpgroups
    side by side along N (d); A = dS MN-major (queries contiguous), B = K^T MN-major.
    Under cfg.dq_transposed dQ^T = K^T dS^T: 64 x block_m x 16, the warpgroups stacked along
    M (d, 64 columns each); A = K^T MN-major (d contiguous), B = dS^T (query, key) MN-major,
    the same dS tile read as the other operand. Its C is (d, query): `dq_shape`."""
    cutlass, cute, sm90, _, dt = _dsl()
    MN = cute.nvgpu.OperandMajorMode.MN
    if cfg.dq_transposed:
        return sm90.make_trivial_tiled_mma(
            dt(cfg.dtype), dt(cfg.dtype), MN, MN, cutlass.Float32,
            atom_layout_mnk=(cfg.consumers, 1, 1), tiler_mn=(WGMMA_M, cfg.block_m))
    return sm90.make_trivial_tiled_mma(
        dt(cfg.dtype), dt(cfg.dtype), MN, MN, cutlass.Float32,
        atom_layout_mnk=(1, cfg.consumers, 1),
        tiler_mn=(WGMMA_M, cfg.head_dim_padded // cfg.consumers))


def dq_shape(cfg: WgmmaBwdTileConfig) -> tuple:
    """The (M, N) of `tiled_mma_dq`'s C: (block_m, head_dim_padded), or (head_dim_padded,
    block_m) under cfg.dq_transposed (the rows of the product are d)."""
    dp = cfg.head_dim_padded
    return (dp, cfg.block_m) if cfg.dq_transposed else (cfg.block_m, dp)


def smem_layout_ds(cfg: WgmmaBwdTileConfig):
    """(block_m, block_n): dS, queries contiguous (dQ's MN-major A operand), 128-byte
    swizzle where block_m is a multiple of 64, else 64- or 32-byte."""
    _, cute, _, warpgroup, dt = _dsl()
    kind = {0: warpgroup.SmemLayoutAtomKind.MN_SW128, 32: warpgroup.SmemLayoutAtomKind.MN_SW64,
            16: warpgroup.SmemLayoutAtomKind.MN_SW32}[
        0 if cfg.block_m % 64 == 0 else (32 if cfg.block_m % 32 == 0 else 16)]
    atom = warpgroup.make_smem_layout_atom(kind, dt(cfg.dtype))
    return cute.tile_to_shape(atom, (cfg.block_m, cfg.block_n), (0, 1))


def shared_storage(cfg: WgmmaBwdTileConfig, n_barriers: int):
    """K, V, the Q and dO rings, dS (and under split_d P, as dS), the LSE and D rows of each
    stage (float32) and the mbarriers, each tile 1024-byte aligned (whole swizzle atoms)."""
    cutlass, cute, _, _, dt = _dsl()
    dtype = dt(cfg.dtype)
    q = cute.cosize(tma_smem_layout(cfg, "Q", cfg.q_stages))
    kv = cute.cosize(tma_smem_layout(cfg, "K"))
    ds = cute.cosize(smem_layout_ds(cfg))
    rows = cfg.block_m * cfg.q_stages
    dq = cfg.block_m * cfg.head_dim_padded

    @cute.struct
    class BwdSm90Storage:
        mbar: cute.struct.MemRange[cutlass.Int64, n_barriers]
        sLSE: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, rows], 128]
        sD: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, rows], 128]
        sK: cute.struct.Align[cute.struct.MemRange[dtype, kv], 1024]
        sV: cute.struct.Align[cute.struct.MemRange[dtype, kv], 1024]
        sQ: cute.struct.Align[cute.struct.MemRange[dtype, q], 1024]
        sdO: cute.struct.Align[cute.struct.MemRange[dtype, q], 1024]
        sdS: cute.struct.Align[cute.struct.MemRange[dtype, ds], 1024]
        if cfg.split_d:
            sP: cute.struct.Align[cute.struct.MemRange[dtype, ds], 1024]
        if cfg.dq_writer:
            sdQ: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, dq], 1024]
    return BwdSm90Storage


class QBarriers:
    """Where the Hopper backward's mbarriers sit: K and V landed (one, for the CTA's key
    block); per stage Q full and dO full (TMA bytes; one arrival, the producer's expect_tx),
    LSE/D full (the row loader warp's 32 lanes), and empty (one arrival per consumer
    thread, once every product reading the stage is done and its LSE/D rows are read). With
    a dQ writer (`WgmmaBwdTileConfig.dq_writer`) two more: dQ full (one arrival per consumer
    thread, its share of the block stored) and dQ empty (the writer's one, once the bulk
    reduction has read the block). A persistent kernel (`BwdSm90Key.persistent`) has one more
    last: K/V empty (one arrival per consumer thread, once a tile's dK and dV have left the K
    and V tiles they are staged in), before which the next tile's K and V are not loaded."""

    def __init__(self, stages: int, dq_writer: bool = False, persistent: bool = False):
        self.stages = stages
        self.dq_writer = dq_writer
        self.persistent = persistent

    kv = 0
    q_full = 1

    @property
    def do_full(self) -> int:
        return 1 + self.stages

    @property
    def rows_full(self) -> int:
        return 1 + 2 * self.stages

    @property
    def empty(self) -> int:
        return 1 + 3 * self.stages

    @property
    def dq_full(self) -> int:
        return 1 + 4 * self.stages

    @property
    def dq_empty(self) -> int:
        return 2 + 4 * self.stages

    @property
    def kv_empty(self) -> int:
        if not self.persistent:
            raise AttributeError("only a persistent kernel has a K/V empty barrier")
        return self.count - 1

    @property
    def count(self) -> int:
        return 1 + 4 * self.stages + (2 if self.dq_writer else 0) + int(self.persistent)
