"""Run the one-tile probe kernel on a GPU and check it against torch.

S must equal Q K^T (fp32 accumulation of fp16/bf16 inputs) and O must equal
P V with P = S rounded to the input dtype, both up to accumulation-order
rounding. A wrong layout anywhere (copy, swizzle, ldmatrix, MMA, S->A view,
epilogue) scrambles whole rows or columns, far beyond these tolerances.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..layouts import TileConfig


@dataclass
class ProbeReport:
    config: TileConfig
    s_err: float
    o_err: float
    s_tol: float
    o_tol: float
    unwritten: int

    @property
    def ok(self) -> bool:
        return self.s_err <= self.s_tol and self.o_err <= self.o_tol and self.unwritten == 0

    def summary(self) -> str:
        c = self.config
        verdict = "OK" if self.ok else "MISMATCH"
        return (f"probe {c.dtype} d={c.head_dim} tile {c.block_m}x{c.block_n} {c.num_threads} threads: "
                f"{verdict}  max|S-QK^T|={self.s_err:.3g} (tol {self.s_tol:.3g})  "
                f"max|O-PV|={self.o_err:.3g} (tol {self.o_tol:.3g})  unwritten={self.unwritten}")


def run_probe_check(cfg: TileConfig, seed: int = 0) -> ProbeReport:
    import cutlass.cute as cute
    import torch
    from cuda.bindings import driver as cuda
    from cutlass.cute.runtime import from_dlpack

    from ..kernels.tile_probe import TileProbe

    dtype = getattr(torch, cfg.dtype)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    d = cfg.head_dim_padded
    q = torch.randn(cfg.block_m, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(cfg.block_n, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(cfg.block_n, d, device="cuda", dtype=dtype, generator=gen)
    s = torch.full((cfg.block_m, cfg.block_n), float("nan"), device="cuda", dtype=torch.float32)
    o = torch.full((cfg.block_m, d), float("nan"), device="cuda", dtype=dtype)

    def wrap(t):
        return from_dlpack(t, assumed_align=16)

    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    args = [wrap(x) for x in (q, k, v, s, o)]
    compiled = cute.compile(TileProbe(cfg), *args, stream)
    compiled(*args, stream)
    torch.cuda.synchronize()

    s_ref = q.float() @ k.float().T
    p = s_ref.to(dtype).float()
    o_ref = p @ v.float()
    unwritten = int(torch.isnan(s).sum() + torch.isnan(o.float()).sum())
    s_err = float((s - s_ref).abs().nan_to_num(float("inf")).max())
    o_err = float((o.float() - o_ref).abs().nan_to_num(float("inf")).max())
    # S: fp32 sums of exact products, only the summation order differs.
    # O: rounded to dtype once, and a P entry may round the other way where S
    # differs from s_ref in its last bits (one ulp of P times |V|, a few times).
    eps = torch.finfo(dtype).eps
    s_max, v_max = float(s_ref.abs().max()), float(v.float().abs().max())
    s_tol = 1e-5 * max(1.0, s_max)
    o_tol = 2 * eps * float(o_ref.abs().max()) + 4 * eps * s_max * v_max
    return ProbeReport(cfg, s_err, o_err, s_tol, o_tol, unwritten)
