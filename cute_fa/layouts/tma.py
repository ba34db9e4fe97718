"""TMA (cp.async.bulk.tensor) loads of Q, K and V, and the K/V ring they fill.

The swizzled smem layouts of `smem.py` are already the patterns the TMA unit
writes: an atom of 8 rows of 64 elements (128-byte rows) under Swizzle<3,3,3> is
TMA's 128-byte swizzle, and the 32-element atom under Swizzle<2,3,3> its 64-byte
swizzle. A tile (rows, head_dim_padded) is a column of such atoms per
`smem_atom_cols` columns, so one tensor map box is (smem_atom_cols columns,
rows) and a tile takes head_dim_padded / smem_atom_cols boxes.

The global tensors are viewed as (seqlen, head_dim, heads, batch), so one tensor
map covers every batch, head (GQA picks a K/V head by coordinate) and stride, and
rows past seqlen or columns past head_dim come back as zeros (TMA's out-of-bounds
fill): no predicates and no padding copies.

The ring's bookkeeping (which stage and mbarrier phase a round uses, where the
mbarriers sit) is in `ring.py`; how many stages a tile gets is `cute_fa.tuning`'s choice.
"""

from dataclasses import dataclass

from .config import TileConfig

TMA_ORDER = (1, 3, 2, 0)  # (batch, seqlen, heads, head_dim) -> (seqlen, head_dim, heads, batch)


@dataclass(frozen=True)
class TmaBox:
    """What one tensor map moves: the box, its swizzle, and the boxes per tile."""

    rows: int
    cols: int
    swizzle_bytes: int
    boxes_per_tile: int
    tile_bytes: int


def tma_box(cfg: TileConfig, tensor: str) -> TmaBox:
    rows = cfg.block_m if tensor in ("Q", "O") else cfg.block_n
    cols = cfg.smem_atom_cols
    return TmaBox(rows=rows, cols=cols, swizzle_bytes=cols * cfg.elem_bytes,
                  boxes_per_tile=cfg.head_dim_padded // cols,
                  tile_bytes=rows * cfg.head_dim_padded * cfg.elem_bytes)


def tma_view(t, group: int = 1):
    """A (batch, seqlen, heads, head_dim) global tensor as (seqlen, head_dim, heads, batch).

    group > 1 (GQA packing, `kernels.sched.seqlen.QueryRows`): as ((group, seqlen), head_dim,
    heads / group, batch), the query heads of each K/V head's group folded into the rows, head
    fastest: packed row r of K/V head h is query r // group of head h * group + r % group, and
    a block of block_m rows (group dividing block_m) is one tensor-map box of (head_dim
    columns, group heads, block_m / group queries). Queries past seqlen are out of bounds in
    their own dimension, so TMA zero-fills them on load and leaves them out of a store."""
    import cutlass.cute as cute

    if group == 1:
        return cute.make_tensor(t.iterator, cute.select(t.layout, mode=list(TMA_ORDER)))
    (batch, seqlen, heads, head_dim), (s_b, s_s, s_h, s_d) = t.shape, t.stride
    layout = cute.make_layout(((group, seqlen), head_dim, heads // group, batch),
                              stride=((s_h, s_s), s_d, s_h * group, s_b))
    return cute.make_tensor(t.iterator, layout)


def tma_smem_layout(cfg: TileConfig, tensor: str, stages: int = 0):
    """The smem layout of `smem.py` for 'Q' or 'K'/'V', in the copy engine's notation; with
    `stages`, a ring of them (the forward's K/V ring, the backward's Q/dO ring).

    `smem.py` swizzles element offsets: Swizzle<3,3,3> on 2-byte elements. The DSL's TMA
    builder reads swizzles in bytes, as the hardware defines them: the same map is
    Swizzle<3,4,3> (128-byte swizzle; Swizzle<2,4,3> for 64-byte rows) applied to byte
    addresses, over the unswizzled tile. The kernel hands this one to `tma_load` and to
    the TMA side of `tma_partition`, and reads the same bytes through `smem.py`'s layout
    with ldmatrix; tests/test_tma_layouts.py checks that both name the same byte for
    every element.
    """
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import warpgroup

    from ._types import cutlass_dtype

    kind = (warpgroup.SmemLayoutAtomKind.K_SW128 if cfg.smem_atom_cols == 64
            else warpgroup.SmemLayoutAtomKind.K_SW64)
    atom = warpgroup.make_smem_layout_atom(kind, cutlass_dtype(cfg.dtype))
    if tensor in ("Q", "O"):
        rows = cfg.block_m
    elif tensor in ("K", "V"):
        rows = cfg.block_n
    else:
        raise ValueError(f"tensor must be 'Q', 'K' or 'V', got {tensor!r}")
    if not stages:
        return cute.tile_to_shape(atom, (rows, cfg.head_dim_padded), (0, 1))
    return cute.tile_to_shape(atom, (rows, cfg.head_dim_padded, stages), (0, 1, 2))


def tma_load(cfg: TileConfig, tensor: str, gmem):
    """(atom, tma_tensor) loading one `tensor` tile ('Q', 'K' or 'V') of `gmem` (TMA order)."""
    from cutlass.cute.nvgpu import cpasync

    rows = cfg.block_m if tensor == "Q" else cfg.block_n
    layout = tma_smem_layout(cfg, tensor)
    return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), gmem, layout,
                                       (rows, cfg.head_dim_padded))


def tma_store(cfg: TileConfig, gmem):
    """(atom, tma_tensor) storing one O tile of `gmem` (TMA order) from shared memory laid out
    as `tma_smem_layout(cfg, "Q")`; rows past seqlen and columns past head_dim are not
    written (the tensor map's bounds)."""
    from cutlass.cute.nvgpu import cpasync

    return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), gmem,
                                       tma_smem_layout(cfg, "Q"),
                                       (cfg.block_m, cfg.head_dim_padded))
