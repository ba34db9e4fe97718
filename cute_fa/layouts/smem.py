"""Swizzled shared-memory layouts for the Q, K, V and O tiles.

One swizzle atom is 8 rows of `smem_atom_cols` elements (128 bytes for a
64-wide atom). Swizzle<B,3,3> XORs the row's low B bits into the index of the
16-byte chunk, so the 8 rows that one ldmatrix reads land in 8 different bank
groups, while each 16-byte chunk stays contiguous for cp.async.
For d=64 this is `composition(Swizzle<3,3,3>, (8,64):(64,1))` (docs/walkthrough.md §5):
offset(r, c) = 64*r + (c XOR 8*(r % 8)).
"""

import cutlass.cute as cute

from .config import TileConfig


def smem_layout_atom(cfg: TileConfig):
    cols = cfg.smem_atom_cols
    return cute.make_composed_layout(
        cute.make_swizzle(cfg.swizzle_bits, 3, 3),
        0,
        cute.make_layout((8, cols), stride=(cols, 1)),
    )


def smem_layout_q(cfg: TileConfig):
    """(block_m, head_dim_padded) -> element offset; also the layout of sO."""
    return cute.tile_to_shape(smem_layout_atom(cfg), (cfg.block_m, cfg.head_dim_padded), (0, 1))


def smem_layout_kv(cfg: TileConfig, stages: int = 0):
    """(block_n, head_dim_padded) -> element offset, for one K or V stage; with `stages`,
    (block_n, head_dim_padded, stages) for a ring of them, each stage a whole number of atoms."""
    if not stages:
        return cute.tile_to_shape(smem_layout_atom(cfg), (cfg.block_n, cfg.head_dim_padded),
                                  (0, 1))
    return cute.tile_to_shape(smem_layout_atom(cfg),
                              (cfg.block_n, cfg.head_dim_padded, stages), (0, 1, 2))


smem_layout_o = smem_layout_q


def qkv_tensors(storage, sQ_layout, sKV_layout, cfg: TileConfig, stages: int = 0) -> tuple:
    """(sQ, sK, sV, sVt) of a forward kernel's shared storage: the tiles in their layouts and
    V's transposed view for P @ V (`transposed_v`)."""
    sQ = storage.sQ.get_tensor(sQ_layout)
    sK = storage.sK.get_tensor(sKV_layout)
    sV = storage.sV.get_tensor(sKV_layout)
    return sQ, sK, sV, transposed_v(sV, cfg, stages)


def transposed_v(sV, cfg: TileConfig, stages: int = 0):
    """sVt(d, key[, stage]): the same smem as sV(key, d[, stage]), read as the B operand of P@V."""
    dp, bn = cfg.head_dim_padded, cfg.block_n
    if not stages:
        return cute.composition(sV, cute.make_layout((dp, bn), stride=(bn, 1)))
    return cute.composition(sV, cute.make_layout((dp, bn, stages), stride=(bn, 1, bn * dp)))


def warp_tiles(sQ, sK, sVt, cfg: TileConfig, warp, stages: int = 0):
    """With `cfg.warps_split_keys`: what warp `warp` reads (`TileConfig.warp_place`): its slab's
    16 rows of the Q tile sQ(row, d), and its keys of the K tile sK(key, d[, stage]) and of
    sVt(d, key[, stage]), rows (columns) group * warp_keys ... + warp_keys - 1. Slices of whole
    8-row swizzle atoms, so every row keeps the tile's swizzle."""
    slab, group = cfg.warp_place(warp)
    wk, dp = cfg.warp_keys, cfg.head_dim_padded
    sQ_w = cute.local_tile(sQ, (16, dp), (slab, 0))
    if not stages:
        return (sQ_w, cute.local_tile(sK, (wk, dp), (group, 0)),
                cute.local_tile(sVt, (dp, wk), (0, group)))
    return (sQ_w, cute.local_tile(sK, (wk, dp, stages), (group, 0, 0)),
            cute.local_tile(sVt, (dp, wk, stages), (0, group, 0)))


def smem_layout(cfg: TileConfig, tensor: str):
    """The layout of one named tile: 'Q', 'K', 'V' or 'O'."""
    builders = {"Q": smem_layout_q, "O": smem_layout_o, "K": smem_layout_kv, "V": smem_layout_kv}
    if tensor not in builders:
        raise ValueError(f"tensor must be one of 'Q', 'K', 'V', 'O', got {tensor!r}")
    return builders[tensor](cfg)


def shared_storage(cfg: TileConfig, stages: int = 0, barriers: int = 0,
                   separate_o: bool = False):
    """The CTA's shared memory: one Q tile (reused for O) and one K and one V tile, or with
    `stages` a ring of K and V tiles and its mbarriers: one for Q; per stage one for K and one
    for V (the tile has landed) and one "empty" (every thread is done reading the stage).

    1024-byte alignment keeps every swizzle atom on the bank pattern it was laid out for
    (TMA's 128-byte swizzle requires it). barriers: the mbarrier count where it is not the
    TMA kernel's ring's (`ring.RingBarriers`; the wgmma kernel's `ring.PipelineBarriers`).
    separate_o: O gets its own tile (sO, Q's size) after them, instead of Q's bytes (a
    persistent kernel loads the next tile's Q while this tile's O leaves), and the index of
    the tile that Q is of (`tile`, for the consumers).
    """
    import cutlass

    from ._types import cutlass_dtype
    from .ring import RingBarriers

    dtype = cutlass_dtype(cfg.dtype)
    q_elems = cute.cosize(smem_layout_q(cfg))
    kv_elems = cute.cosize(smem_layout_kv(cfg, stages))

    if not stages:
        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, q_elems], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, kv_elems], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, kv_elems], 1024]
        return SharedStorage

    if separate_o:
        @cute.struct
        class PersistentStorage:
            mbar: cute.struct.Align[cute.struct.MemRange[cutlass.Int64, barriers], 8]
            tile: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, 4], 16]
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, q_elems], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, kv_elems], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, kv_elems], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[dtype, q_elems], 1024]
        return PersistentStorage

    @cute.struct
    class RingStorage:
        mbar: cute.struct.Align[cute.struct.MemRange[cutlass.Int64,
                                                     barriers or RingBarriers(stages).count], 8]
        sQ: cute.struct.Align[cute.struct.MemRange[dtype, q_elems], 1024]
        sK: cute.struct.Align[cute.struct.MemRange[dtype, kv_elems], 1024]
        sV: cute.struct.Align[cute.struct.MemRange[dtype, kv_elems], 1024]
    return RingStorage
