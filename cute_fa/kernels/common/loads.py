"""cp.async tile loads with their edges: rows past a sequence's end and columns past head_dim
arrive as zeros, so the MMAs need no predicates (a zero row of Q or dO contributes nothing; a
zero K or V row is masked or weighs nothing)."""

import cutlass
import cutlass.cute as cute


@cute.jit
def copy_row(cfg: cutlass.Constexpr, g2s: cute.TiledCopy, src: cute.Tensor, dst: cute.Tensor,
             coords: cute.Tensor):
    """Copy one row-pass of a tile; the padding columns past head_dim become zeros."""
    if cutlass.const_expr(cfg.head_dim == cfg.head_dim_padded):
        cute.copy(g2s, src, dst)
    else:
        for k in cutlass.range_constexpr(cute.size(src.shape[1])):
            if coords[0, k][1] < cfg.head_dim:
                cute.copy(g2s, src[None, k], dst[None, k])
            else:
                dst[None, k].fill(0.0)


@cute.jit
def load_rows(cfg: cutlass.Constexpr, g2s: cute.TiledCopy, tXgX: cute.Tensor,
              tXsX: cute.Tensor, tXcX: cute.Tensor, row0, n_rows):
    """Start the cp.async of a thread's share of one tile (tXgX -> tXsX, (CPY, rows, cols));
    tXcX: the tile's identity coordinates, row0: the tile's first row; rows from n_rows on
    are zeros."""
    for m in cutlass.range_constexpr(cute.size(tXsX.shape[1])):
        if row0 + tXcX[0, m, 0][0] < n_rows:
            copy_row(cfg, g2s, tXgX[None, m, None], tXsX[None, m, None], tXcX[None, m, None])
        else:
            tXsX[None, m, None].fill(0.0)
