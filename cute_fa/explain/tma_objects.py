"""The TMA objects of one tile as the DSL builds and prints them (for the notebook and docs).

Host-side only: the kernel builds the same objects from `cute_fa.layouts.tma`.
"""

from ..layouts.config import TileConfig


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

    from ..layouts import smem
    from ..layouts._types import cutlass_dtype
    from ..layouts.tma import tma_load, tma_smem_layout, tma_view

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
