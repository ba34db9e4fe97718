"""Host-side introspection of the Hopper backward's layouts (`kernels/bwd/sm90.py`).

`WgmmaBwdLayouts` traces the builders of `cute_fa.layouts.bwd_wgmma` once per tile, on the
CPU, and keeps what each consumer thread holds as arrays: its S^T / dP^T / dS^T accumulator
elements ((key, query) pairs: the three share one TiledMMA, so one thread holds the same pairs
of each), its P^T and dS^T A operands of dV and dK (the accumulator seen through
`acc_to_a_layout`, the view the kernel hands to the RS-wgmma), its dK / dV (key, d) and its dQ
(query, d) accumulator elements, and the warp roles. dS goes through shared memory once: each
thread's dS^T elements are written (stmatrix, through the S^T TiledMMA's C layout) at their own
(key, query), and both consumer warpgroups' dQ wgmmas read the whole tile back as their A
operand, each for its own half of dQ's columns (a tile whose block_m is not a multiple of 64
computes dQ^T = K^T dS^T instead, d on wgmma's M, and reads dS as the B operand; `grad_q` still
gives (query, d)).

The split-d tile (`WgmmaBwdTileConfig.split_d`, head_dim past 128) splits the other way: its
two warpgroups share 64 keys, S^T and dP^T split by queries, dV, dK and dQ by d. Its P^T goes
through shared memory as dS^T does, and dV and dK read both back as SS-wgmma A operands, so
there is no register A view (no "Pt_A" table, no "Pt_view" layout).

Thread numbers are consumer thread indices, 0 ... num_threads - 1, as the kernel's `ctidx`:
CTA thread = ctidx + 128 (warpgroup 0 is the producer).
"""

from __future__ import annotations

import functools

import numpy as np

from ..layouts import bwd_wgmma, wgmma
from ..layouts.config import WARP_SIZE, WgmmaBwdTileConfig
from .introspect import check_tid, fmt_ranges, trace_builders

ARCH = "sm_90a"
IDLE = "idle (hands its registers to the consumers: setmaxnreg)"


def _roles(cfg: WgmmaBwdTileConfig) -> dict:
    """The producer warpgroup's warps and what each does in this tile's kernel."""
    writer = ("dQ writer: each step's dQ block, once the consumers have left it in shared "
              "memory, into dQaccum by one bulk reduction (deterministic: in its key block's "
              "turn)") if cfg.dq_writer else IDLE
    return {0: "TMA producer: K and V once, then Q and dO of every step",
            1: "row loader: each step's LSE and D rows into shared memory",
            2: writer, 3: IDLE}


def _collect(cfg: WgmmaBwdTileConfig) -> dict:
    import cutlass
    import cutlass.cute as cute

    from ..layouts import _read, bwd

    out: dict = {}

    def read_all():
        bm, bn, dp = cfg.block_m, cfg.block_n, cfg.head_dim_padded
        sdp, dkv, dq = (bwd_wgmma.tiled_mma_sdp(cfg), bwd_wgmma.tiled_mma_dkv(cfg),
                        bwd_wgmma.tiled_mma_dq(cfg))
        cS = cute.make_identity_tensor((bn, bm))
        cKV = cute.make_identity_tensor((bn, dp))
        cQ = cute.make_identity_tensor(bwd_wgmma.dq_shape(cfg))
        s_layout = sdp.get_slice(0).partition_C(cS).layout
        a_layout = wgmma.acc_to_a_layout(s_layout)
        tables = {name: [] for name in ("St", "Pt_A", "dKV", "dQ")}
        for t in range(cfg.num_threads):
            tScS = sdp.get_slice(t).partition_C(cS)
            tables["St"].append(_read.coordinates(tScS, 2))
            if not cfg.split_d:  # split_d reads P^T and dS^T from shared memory (SS-wgmma)
                tables["Pt_A"].append(_read.coordinates(cute.make_tensor(tScS.iterator,
                                                                         a_layout), 2))
            tables["dKV"].append(_read.coordinates(dkv.get_slice(t).partition_C(cKV), 2))
            dq_coords = _read.coordinates(dq.get_slice(t).partition_C(cQ), 2)
            # dQ^T's rows are d: kept as (query, d), as every other tile's
            tables["dQ"].append(dq_coords[:, ::-1] if cfg.dq_transposed else dq_coords)
        out["tables"] = {k: np.stack(v) for k, v in tables.items() if v}
        rS = cute.make_rmem_tensor(sdp.partition_shape_C((bn, bm)), cutlass.Float32)
        out["a_registers"] = (None if cfg.split_d else
                              _read.indices(wgmma.acc_to_a_layout(rS.layout)))
        out["layouts"] = {"tiled_mma_sdp": str(sdp), "tiled_mma_dkv": str(dkv),
                          "tiled_mma_dq": str(dq), "St_partition": str(s_layout),
                          "sdS": str(bwd_wgmma.smem_layout_ds(cfg))}
        if not cfg.split_d:  # the register view dV and dK take P^T and dS^T through
            out["layouts"]["Pt_view"] = str(a_layout)
        chunk = bwd.accum_chunk_layout(bm, dp, cfg.num_threads, bwd.dq_vector(ARCH))
        # index order (element, register run, thread): a row per thread, register order
        out["dq_offsets"] = _read.indices(chunk).reshape(cfg.num_threads, -1)
        out["layouts"]["dq_sums"] = str(chunk)

    return trace_builders(read_all, out, ARCH)  # the wgmma builders check the target


@functools.lru_cache(maxsize=8)
def _tables_for(cfg: WgmmaBwdTileConfig) -> dict:
    return _collect(cfg)


class WgmmaBwdLayouts:
    """What each consumer thread of the wgmma backward holds. `cfg`: a `WgmmaBwdTileConfig`
    (default: the shipped bf16 tile of head_dim 128, `tuning_bwd.bwd_sm90_tile`)."""

    def __init__(self, cfg: WgmmaBwdTileConfig | None = None):
        if cfg is None:
            from ..tuning_bwd import bwd_sm90_tile

            cfg = bwd_sm90_tile("bfloat16", 128)
        if not isinstance(cfg, WgmmaBwdTileConfig):
            raise TypeError(f"cfg must be a WgmmaBwdTileConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        data = _tables_for(cfg)
        self.tables = data["tables"]
        self.layouts = data["layouts"]
        self.a_registers = data["a_registers"]
        self.dq_offsets = data["dq_offsets"]

    def role(self, warp: int) -> str:
        """The role of CTA warp `warp` (0-3: the producer warpgroup; then the consumers)."""
        n_warps = wgmma.WarpRoles(self.cfg.consumers, self.cfg.ctas_per_sm).threads // WARP_SIZE
        if not 0 <= warp < n_warps:
            raise ValueError(f"warp must be in [0, {n_warps}), got {warp}")
        if warp < 4:
            return _roles(self.cfg)[warp]
        g = warp // 4 - 1
        d0, d1 = g * self.dq_columns, (g + 1) * self.dq_columns - 1
        if self.cfg.split_d:
            q = self.cfg.block_m // self.cfg.consumers
            return (f"consumer warpgroup {g}: queries {g * q}-{(g + 1) * q - 1} of the step "
                    f"(S^T, dP^T over all 64 keys), d columns {d0}-{d1} (dV, dK, dQ)")
        return (f"consumer warpgroup {g}: keys {64 * g}-{64 * g + 63} of the block "
                f"(S^T, dP^T, dV, dK), dQ's columns {d0}-{d1}")

    @property
    def dq_columns(self) -> int:
        return self.cfg.head_dim_padded // self.cfg.consumers

    def scores(self, tid: int) -> np.ndarray:
        """(key, query) of each S^T (= dP^T = dS^T) accumulator register of thread tid."""
        return self.tables["St"][check_tid(tid, self.cfg.num_threads)]

    def grads_kv(self, tid: int) -> np.ndarray:
        """(key, d) of each dK (= dV) accumulator register of thread tid."""
        return self.tables["dKV"][check_tid(tid, self.cfg.num_threads)]

    def grad_q(self, tid: int) -> np.ndarray:
        """(query, d) of each dQ accumulator register of thread tid."""
        return self.tables["dQ"][check_tid(tid, self.cfg.num_threads)]

    def dq_sums(self, tid: int) -> np.ndarray:
        """Where each dQ accumulator register of thread tid goes in its query block's float32
        sums: a float offset into the block of dQaccum (`layouts.bwd.accum_chunk_layout`),
        and under dq_writer the same offset into the shared block that the writer warp adds
        there whole."""
        return self.dq_offsets[check_tid(tid, self.cfg.num_threads)]

    def describe(self, tid: int) -> str:
        """Thread tid's share of the five products, in words."""
        cfg = self.cfg
        s, kv, q = self.scores(tid), self.grads_kv(tid), self.grad_q(tid)
        g = tid // 128
        if cfg.split_d:
            p_line = (f"P^T and dS^T: its {len(s)} values of each go to shared memory at their "
                      f"own (key, query) (stmatrix); dV and dK read all {cfg.block_n} x "
                      f"{cfg.block_m} of both back, every warpgroup's queries, as their A "
                      f"operands (SS-wgmma)")
            ds_line = "dS: the dQ wgmmas"
        else:
            p_line = (f"P^T and dS^T are the A operands of dV and dK as they are (no lane "
                      f"exchange): k-step s takes registers {fmt_ranges(self.a_registers[:8])}"
                      f" + 8 s")
            ds_line = (f"dS: its {len(s)} dS^T values go to shared memory at their own (key, "
                       f"query); the dQ wgmmas")
        operands = [
            p_line,
            f"dK, dV: {len(kv)} registers each, keys {fmt_ranges(kv[:, 0])} x d "
            f"{fmt_ranges(kv[:, 1])}",
            f"{ds_line} of both warpgroups read all {cfg.block_m} x {cfg.block_n} of dS back"
            + (" (the B operand of dQ^T = K^T dS^T: block_m is not a multiple of 64)"
               if cfg.dq_transposed else "")]
        return "\n".join([
            f"consumer thread {tid} (CTA thread {tid + 128}), warpgroup {g}, warp "
            f"{tid // WARP_SIZE % 4} of it, lane {tid % WARP_SIZE}",
            f"S^T, dP^T, dS^T: {len(s)} registers each, keys {fmt_ranges(s[:, 0])} x queries "
            f"{fmt_ranges(s[:, 1])} of the {cfg.block_n} x {cfg.block_m} tile",
            *operands,
            f"dQ: {len(q)} registers, queries {fmt_ranges(q[:, 0])} x d {fmt_ranges(q[:, 1])},"
            + (f" stored to the shared dQ block at floats {fmt_ranges(self.dq_sums(tid))} "
               f"(16-byte runs), which warp 2 adds into dQaccum" if cfg.dq_writer else
               f" added into dQaccum at floats {fmt_ranges(self.dq_sums(tid))} of its block by "
               f"float32 vector reductions"),
        ])
