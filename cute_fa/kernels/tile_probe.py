"""One-tile probe: S = Q K^T and O = fp16(S) V for a single CTA, built from every layout builder.

It exercises, in one small kernel, the pieces the forward kernel is made of:
cp.async gmem->smem into the swizzled tiles, ldmatrix (plain and transposed)
into the TiledMMA's fragments, mma.sync m16n8k16, the S->A register view that
feeds P@V from registers, and the O epilogue through smem (reusing sQ) with
128-bit stores. CI compiles it for every arch; on a GPU its two outputs are
checked against torch, which proves the layouts on hardware.

Inputs are exactly one tile: Q (block_m, D), K and V (block_n, D), D = head_dim_padded.
"""

from __future__ import annotations

import cutlass
import cutlass.memory
import cutlass.cute as cute

from ..layouts import TileConfig, copies, mma as mma_mod, smem
from ..layouts._types import cutlass_dtype


class TileProbe:
    def __init__(self, cfg: TileConfig):
        if cfg.head_dim != cfg.head_dim_padded:
            raise ValueError(
                f"head_dim must be a multiple of 32 for the tile probe, got {cfg.head_dim}"
            )
        self.cfg = cfg

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                 mS: cute.Tensor, mO: cute.Tensor, stream):
        cfg = self.cfg
        sQ_layout = smem.smem_layout_q(cfg)
        sKV_layout = smem.smem_layout_kv(cfg)
        SharedStorage = smem.shared_storage(cfg)

        self.kernel(mQ, mK, mV, mS, mO, sQ_layout, sKV_layout, SharedStorage).launch(
            grid=(1, 1, 1), block=(cfg.num_threads, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mS: cute.Tensor,
               mO: cute.Tensor, sQ_layout: cute.ComposedLayout, sKV_layout: cute.ComposedLayout,
               SharedStorage: cutlass.Constexpr):
        cfg = self.cfg
        dtype = cutlass_dtype(cfg.dtype)
        tidx, _, _ = cute.arch.thread_idx()

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK = storage.sK.get_tensor(sKV_layout)
        sV = storage.sV.get_tensor(sKV_layout)
        sVt = smem.transposed_v(sV, cfg)

        gmem_thr_copy = copies.gmem_tiled_copy_qkv(cfg).get_slice(tidx)
        g2s = copies.gmem_tiled_copy_qkv(cfg)
        cute.copy(g2s, gmem_thr_copy.partition_S(mQ), gmem_thr_copy.partition_D(sQ))
        cute.copy(g2s, gmem_thr_copy.partition_S(mK), gmem_thr_copy.partition_D(sK))
        cute.copy(g2s, gmem_thr_copy.partition_S(mV), gmem_thr_copy.partition_D(sV))
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()

        tiled_mma = mma_mod.tiled_mma(cfg)
        thr_mma = tiled_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt))

        s2r_q = copies.smem_tiled_copy_q(cfg, tiled_mma)
        s2r_k = copies.smem_tiled_copy_k(cfg, tiled_mma)
        s2r_v = copies.smem_tiled_copy_v(cfg, tiled_mma)
        tSsQ = s2r_q.get_slice(tidx).partition_S(sQ)
        tSrQ_view = s2r_q.get_slice(tidx).retile(tSrQ)
        tSsK = s2r_k.get_slice(tidx).partition_S(sK)
        tSrK_view = s2r_k.get_slice(tidx).retile(tSrK)
        tOsVt = s2r_v.get_slice(tidx).partition_S(sVt)
        tOrVt_view = s2r_v.get_slice(tidx).retile(tOrVt)

        tSrS = cute.make_rmem_tensor(
            thr_mma.partition_shape_C((cfg.block_m, cfg.block_n)), cutlass.Float32
        )
        tSrS.fill(0.0)
        for k in cutlass.range_constexpr(cute.size(tSsQ.shape[2])):
            cute.copy(s2r_q, tSsQ[None, None, k], tSrQ_view[None, None, k])
            cute.copy(s2r_k, tSsK[None, None, k], tSrK_view[None, None, k])
            cute.gemm(tiled_mma, tSrS, tSrQ[None, None, k], tSrK[None, None, k], tSrS)

        tSgS = thr_mma.partition_C(mS)
        tSgS.store(tSrS.load())

        rP = cute.make_fragment_like(tSrS, dtype)
        rP.store(tSrS.load().to(dtype))
        tOrP = cute.make_tensor(rP.iterator, mma_mod.acc_to_a_layout(rP.layout))
        tOrO = cute.make_rmem_tensor(
            thr_mma.partition_shape_C((cfg.block_m, cfg.head_dim_padded)), cutlass.Float32
        )
        tOrO.fill(0.0)
        for k in cutlass.range_constexpr(cute.size(tOrP.shape[2])):
            cute.copy(s2r_v, tOsVt[None, None, k], tOrVt_view[None, None, k])
            cute.gemm(tiled_mma, tOrO, tOrP[None, None, k], tOrVt[None, None, k], tOrO)

        rO = cute.make_fragment_like(tOrO, dtype)
        rO.store(tOrO.load().to(dtype))
        sO = cute.make_tensor(sQ.iterator, smem.smem_layout_o(cfg))
        r2s = copies.smem_tiled_copy_o(cfg, tiled_mma)
        cute.arch.barrier()  # every warp is done reading sQ before it becomes sO
        cute.copy(r2s, r2s.get_slice(tidx).retile(rO), r2s.get_slice(tidx).partition_D(sO))
        cute.arch.barrier()
        s2g = copies.gmem_tiled_copy_o(cfg)
        thr_s2g = s2g.get_slice(tidx)
        tOsO = thr_s2g.partition_S(sO)
        tOrO_out = cute.make_fragment_like(tOsO, dtype)
        cute.copy(s2g, tOsO, tOrO_out)
        cute.copy(s2g, tOrO_out, thr_s2g.partition_D(mO))


def fake_arguments(cfg: TileConfig):
    """Fake tensors and stream for compiling the probe without a GPU."""
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    dtype = cutlass_dtype(cfg.dtype)
    d = cfg.head_dim_padded

    def t(dt, rows, cols):
        return make_fake_compact_tensor(dt, (rows, cols), stride_order=(1, 0), assumed_align=16)

    return (t(dtype, cfg.block_m, d), t(dtype, cfg.block_n, d), t(dtype, cfg.block_n, d),
            t(cutlass.Float32, cfg.block_m, cfg.block_n), t(dtype, cfg.block_m, d),
            make_fake_stream())


def compile_probe(cfg: TileConfig, arch: str = "sm_80", dump_dir: str | None = None):
    """cute.compile the probe for `arch` ('sm_80', 'sm_90a', 'sm_120a'); no GPU needed.

    The PTX and cubin are kept (in `dump_dir`, a temporary folder by default)
    and readable as `.__ptx__` / `.__cubin__` of the result.
    """
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        options = f"--gpu-arch={arch} --keep-ptx --keep-cubin --dump-dir={dump_dir or tmp}"
        return cute.compile(TileProbe(cfg), *fake_arguments(cfg), options=options)
