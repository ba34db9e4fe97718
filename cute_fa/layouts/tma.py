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

`ring_slot` is the one rule for which stage and mbarrier phase a K/V round uses;
it runs on Python ints (introspection, notebooks) and on DSL integers (kernel).
"""

from dataclasses import dataclass

from .config import TileConfig

TMA_ORDER = (1, 3, 2, 0)  # (batch, seqlen, heads, head_dim) -> (seqlen, head_dim, heads, batch)


def ring_slot(round_index, stages: int):
    """(stage, phase) of K/V round `round_index` in a ring of `stages` buffers.

    Round i fills stage i % stages; each stage's mbarrier completes once per lap,
    so the phase to wait for flips every lap: (i // stages) % 2.
    """
    return round_index % stages, (round_index // stages) % 2


@dataclass(frozen=True)
class RingBarriers:
    """Where the TMA kernel's mbarriers sit in its array: Q's, then one per stage for K
    landed, V landed, and "empty" (every thread has read the stage)."""

    stages: int
    q = 0
    k = 1

    @property
    def v(self) -> int:
        return 1 + self.stages

    @property
    def empty(self) -> int:
        return 1 + 2 * self.stages

    @property
    def count(self) -> int:
        return 1 + 3 * self.stages


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


def max_kv_stages(cfg: TileConfig, smem_budget: int, ctas_per_sm: int = 2, cap: int = 4) -> int:
    """Stages of the K/V ring: as many as fit while `ctas_per_sm` CTAs share the SM
    (or one CTA, if even two stages do not fit that way), at most `cap`."""
    for per_cta in (smem_budget // ctas_per_sm, smem_budget):
        stages = min(cap, (per_cta - cfg.smem_bytes(0) - 1024) // cfg.smem_bytes_kv_stage())
        if stages >= 2:
            return stages
    return 1


def tma_view(t):
    """A (batch, seqlen, heads, head_dim) global tensor as (seqlen, head_dim, heads, batch)."""
    import cutlass.cute as cute

    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=list(TMA_ORDER)))


def tma_smem_layout(cfg: TileConfig, tensor: str, stages: int = 0):
    """The smem layout of `smem.py` for 'Q' or 'K'/'V', in the copy engine's notation.

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
        return cute.tile_to_shape(atom, (cfg.block_m, cfg.head_dim_padded), (0, 1))
    if tensor not in ("K", "V"):
        raise ValueError(f"tensor must be 'Q', 'K' or 'V', got {tensor!r}")
    if not stages:
        return cute.tile_to_shape(atom, (cfg.block_n, cfg.head_dim_padded), (0, 1))
    return cute.tile_to_shape(atom, (cfg.block_n, cfg.head_dim_padded, stages), (0, 1, 2))


def tma_load(cfg: TileConfig, tensor: str, gmem):
    """(atom, tma_tensor) loading one `tensor` tile ('Q', 'K' or 'V') of `gmem` (TMA order)."""
    from cutlass.cute.nvgpu import cpasync

    rows = cfg.block_m if tensor == "Q" else cfg.block_n
    layout = tma_smem_layout(cfg, tensor)
    return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), gmem, layout,
                                       (rows, cfg.head_dim_padded))


def describe(cfg: TileConfig, stages: int = 2, arch: str = "sm_90a") -> dict:
    """The real TMA objects of the K tile, as the DSL prints them: the copy atom, the TMA
    tensor (global view), the smem ring in both notations (`smem_ring`: what ldmatrix
    reads; `smem_ring_tma`: what the copy engine is given) and both sides of
    `tma_partition`.

    Built by `cute.compile` of a tiny function on a fake tensor of dynamic
    shape and strides (no GPU needed), the way the kernel builds them.
    """
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import cpasync
    from cutlass.cute.runtime import make_fake_tensor

    from . import smem
    from ._types import cutlass_dtype

    out: dict = {}

    @cute.jit
    def build(mK: cute.Tensor):
        atom, tma_K = tma_load(cfg, "K", tma_view(mK))
        ring = smem.smem_layout_kv(cfg, stages)
        ring_tma = tma_smem_layout(cfg, "K", stages)
        sK = cute.make_tensor(cute.make_ptr(cutlass_dtype(cfg.dtype), 0, cute.AddressSpace.smem,
                                            assumed_align=1024), ring_tma)
        gK = cute.local_tile(tma_K[None, None, 0, 0], (cfg.block_n, cfg.head_dim_padded),
                             (None, 0))
        tKsK, tKgK = cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                           cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
        out.update(atom=str(atom), tma_tensor=str(tma_K), smem_ring=str(ring),
                   smem_ring_tma=str(ring_tma), tKsK=str(tKsK), tKgK=str(tKgK))

    stride = tuple(cute.sym_int64(divisibility=8) for _ in range(3)) + (1,)
    shape = (cute.sym_int(), cute.sym_int(), cute.sym_int(), cfg.head_dim)
    cute.compile(build, make_fake_tensor(cutlass_dtype(cfg.dtype), shape, stride=stride,
                                         assumed_align=16), options=f"--gpu-arch={arch}")
    return out
