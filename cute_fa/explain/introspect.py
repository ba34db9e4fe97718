"""Host-side introspection of the layouts the kernels run: who holds what.

`FlashLayouts` traces the builders of this package once per configuration (on
the CPU, no GPU needed), partitions identity tensors through the very
TiledMMA / TiledCopy objects a kernel uses, and keeps the answers as arrays.
"""

from __future__ import annotations

import functools
import operator

import numpy as np

from ..layouts.config import WARP_SIZE, TileConfig


def _collect(cfg: TileConfig) -> dict:
    """Trace the builders for `cfg` and read every per-thread partition."""
    import cutlass
    import cutlass.cute as cute

    from ..layouts import _read, copies, mma as mma_mod, smem
    from ..layouts._types import cutlass_dtype

    out: dict = {}

    def read_all():
        bm, bn, dp = cfg.block_m, cfg.block_n, cfg.head_dim_padded
        # the MMA side is the kernels': the CTA's TiledMMA, or where the warps split the keys
        # one warp's, indexed by the lane, over that warp's slab and keys (`smem.warp_tiles`)
        tiled_mma = mma_mod.tiled_mma(cfg.mma_tile)
        g2s = copies.gmem_tiled_copy_qkv(cfg)
        s2r = {
            "Q": copies.smem_tiled_copy_q(cfg, tiled_mma),
            "K": copies.smem_tiled_copy_k(cfg, tiled_mma),
            "V": copies.smem_tiled_copy_v(cfg, tiled_mma),
        }
        cQ = cute.make_identity_tensor((bm, dp))
        cKV = cute.make_identity_tensor((bn, dp))
        cS = cute.make_identity_tensor((bm, bn))
        cVt = cute.make_identity_tensor((dp, bn))

        def coords(t):
            return _read.coordinates(t, 2)

        def mma_view(tid):
            """(MMA thread index, Q, K, V^T and S tiles) of thread tid, in tile coordinates."""
            if not cfg.warps_split_keys:
                return tid, cQ, cKV, cVt, cS
            warp = tid // WARP_SIZE
            slab, group = cfg.warp_place(warp)
            cQ_w, cKV_w, cVt_w = smem.warp_tiles(cQ, cKV, cVt, cfg, warp)
            return (tid % WARP_SIZE, cQ_w, cKV_w, cVt_w,
                    cute.local_tile(cS, (16, cfg.warp_keys), (slab, group)))

        tables = {name: [] for name in ("Q", "K", "S", "V", "O", "PV_A", "copy_Q", "copy_KV",
                                        "ldsm_Q", "ldsm_K", "ldsm_V")}
        for tid in range(cfg.num_threads):
            mma_tid, cQ_t, cK_t, cVt_t, cS_t = mma_view(tid)
            thr = tiled_mma.get_slice(mma_tid)
            tables["Q"].append(coords(thr.partition_A(cQ_t)))
            tables["K"].append(coords(thr.partition_B(cK_t)))
            tables["S"].append(coords(thr.partition_C(cS_t)))
            tables["V"].append(coords(thr.partition_B(cVt_t))[:, ::-1])  # (d,key) -> (key,d)
            tables["O"].append(coords(thr.partition_C(cQ_t)))
            tables["PV_A"].append(coords(thr.partition_A(cS_t)))
            g = g2s.get_slice(tid)
            tables["copy_Q"].append(coords(g.partition_S(cQ)))
            tables["copy_KV"].append(coords(g.partition_S(cKV)))
            tables["ldsm_Q"].append(coords(s2r["Q"].get_slice(mma_tid).partition_S(cQ_t)))
            tables["ldsm_K"].append(coords(s2r["K"].get_slice(mma_tid).partition_S(cK_t)))
            tables["ldsm_V"].append(coords(s2r["V"].get_slice(mma_tid).partition_S(cVt_t))
                                    [:, ::-1])
        out["tables"] = {k: np.stack(v) for k, v in tables.items()}
        # A few elements read through the DSL's own indexing, so tests can check
        # the numpy evaluation of the same partitions against it.
        samples = {}
        for tid in (0, 37 % cfg.num_threads, cfg.num_threads - 1):
            mma_tid, cQ_t, cK_t, _, cS_t = mma_view(tid)
            thr = tiled_mma.get_slice(mma_tid)
            for name, t in (("Q", thr.partition_A(cQ_t)), ("K", thr.partition_B(cK_t)),
                            ("S", thr.partition_C(cS_t)),
                            ("copy_Q", g2s.get_slice(tid).partition_S(cQ)),
                            ("ldsm_K", s2r["K"].get_slice(mma_tid).partition_S(cK_t))):
                samples[name, tid] = [tuple(int(x) for x in t[i]) for i in range(8)]
        out["dsl_samples"] = samples

        dtype = cutlass_dtype(cfg.dtype)
        wm, wn = cfg.mma_tile.block_m, cfg.mma_tile.block_n  # what one thread's MMAs cover
        tCrQ = cute.make_rmem_tensor(tiled_mma.partition_shape_A((wm, dp)), dtype)
        tCrK = cute.make_rmem_tensor(tiled_mma.partition_shape_B((wn, dp)), dtype)
        tCrS = cute.make_rmem_tensor(tiled_mma.partition_shape_C((wm, wn)), cutlass.Float32)
        tOrVt = cute.make_rmem_tensor(tiled_mma.partition_shape_B((dp, wn)), dtype)
        tOrO = cute.make_rmem_tensor(tiled_mma.partition_shape_C((wm, dp)), cutlass.Float32)
        views = {
            "tCrQ": tCrQ.layout,
            "tCrK": tCrK.layout,
            "tCrS": tCrS.layout,
            "tXrQ": s2r["Q"].get_slice(0).retile(tCrQ).layout,
            "tXrK": s2r["K"].get_slice(0).retile(tCrK).layout,
            "tOrVt": tOrVt.layout,
            "tXrVt": s2r["V"].get_slice(0).retile(tOrVt).layout,
            "tOrP": mma_mod.acc_to_a_layout(tCrS.layout),
            "tOrO": tOrO.layout,
        }
        out["fragments"] = {k: _read.mode_sizes(v) for k, v in views.items()}
        out["fragment_layouts"] = {k: str(v) for k, v in views.items()}
        rowcol = mma_mod.acc_rowcol_layout(tCrS.layout)
        out["s_rowcol"] = (_read.nested(rowcol.shape), _read.nested(rowcol.stride))
        n_rows = _read.mode_sizes(rowcol)[0]
        out["s_rowcol_index"] = _read.indices(rowcol).reshape((n_rows, -1), order="F")
        out["p_index"] = _read.indices(views["tOrP"])
        o_rowcol = mma_mod.acc_rowcol_layout(tOrO.layout)
        out["o_rowcol_index"] = _read.indices(o_rowcol).reshape((n_rows, -1), order="F")
        out["reduce_offsets"] = mma_mod.row_reduce_offsets(tiled_mma)

        out["swizzle"] = {}
        for name, shape in (("Q", (bm, dp)), ("KV", (bn, dp))):
            layout = smem.smem_layout(cfg, name[0])
            out["swizzle"][name] = np.array(
                [[layout((r, c)) for c in range(shape[1])] for r in range(shape[0])],
                dtype=np.int64,
            )
            out["cosize_" + name] = int(cute.cosize(layout))
        out["swizzle_atom"] = str(smem.smem_layout_atom(cfg))
        ring = smem.smem_layout_kv(cfg, 2)  # the TMA kernel's K/V ring, two stages
        out["swizzle"]["KV_ring"] = np.array(
            [[[ring((r, c, st)) for st in range(2)] for c in range(dp)] for r in range(bn)],
            dtype=np.int64,
        )
        # the same ring as handed to TMA: an unswizzled tile plus a swizzle of byte addresses
        from ..layouts import tma

        ring_tma = tma.tma_smem_layout(cfg, "K", 2)
        sw = ring_tma.inner
        out["tma_byte_swizzle"] = (int(sw.num_bits), int(sw.num_base), int(sw.num_shift))
        out["swizzle"]["KV_ring_tma_unswizzled"] = np.array(
            [[[ring_tma.outer((r, c, st)) for st in range(2)] for c in range(dp)]
             for r in range(bn)], dtype=np.int64,
        )

    return trace_builders(read_all, out)


def trace_builders(read_all, out: dict, arch: str | None = None) -> dict:
    """Run read_all() inside a traced @cute.jit function, where the layout builders must be
    called (nothing runs on a GPU), and return `out`, which it fills. arch: the target to name
    for this compile where the builders check it (the wgmma ones), rather than through
    CUTE_DSL_ARCH, which the DSL reads once, at import; None: the default target."""
    import cutlass.cute as cute

    @cute.jit
    def trace():
        read_all()

    if arch is None:
        trace()
    else:
        cute.compile(trace, options=f"--gpu-arch={arch}")
    if "tables" not in out:
        raise RuntimeError("the DSL did not trace the builders (a cached compile?)")
    return out


@functools.lru_cache(maxsize=16)
def _tables_for(cfg: TileConfig) -> dict:
    return _collect(cfg)


_OPS = {"max": max, "sum": operator.add}


def fmt_ranges(values) -> str:
    """A set of ints, exactly, in few characters: runs of consecutive values as 'a..b', and
    a regular pattern of more than four equal runs as 'first, second, …, last (every P)'.
    {0..7} | {64..71} -> '0..7, 64..71'; {0,1,8,9,...,56,57} -> '0..1, 8..9, …, 56..57 (every 8)'.
    """
    values = sorted({int(v) for v in values})
    if not values:
        return "none"
    runs = [[values[0], values[0]]]
    for v in values[1:]:
        if v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    text = [f"{a}..{b}" if b > a else str(a) for a, b in runs]
    if len(runs) > 4:
        lengths = {b - a for a, b in runs}
        steps = {runs[i + 1][0] - runs[i][0] for i in range(len(runs) - 1)}
        if len(lengths) == 1 and len(steps) == 1:
            return f"{text[0]}, {text[1]}, …, {text[-1]} (every {steps.pop()})"
    return ", ".join(text)


def check_tid(tid, num_threads: int) -> int:
    """A thread index of a CTA of num_threads threads, as a Python int."""
    if isinstance(tid, bool) or not isinstance(tid, (int, np.integer)):
        raise TypeError(f"tid must be an int, got {tid!r}")
    if not 0 <= tid < num_threads:
        raise ValueError(f"tid must be in [0, {num_threads}), got {tid}")
    return int(tid)


def packed_row_owners(layouts, group: int, seqlen_q: int, m_block: int) -> list:
    """GQA packing of query block m_block of a tile (`cute_fa.kernels.sched.seqlen.QueryRows`,
    the object the kernels use), for `FlashLayouts` and `WgmmaLayouts` alike: per tile row, the
    query and head offset it holds (None past the seqlen_q * group packed rows) and the threads
    whose S accumulator (`layouts.s_coords`) holds it."""
    from ..kernels.sched.seqlen import QueryRows

    cfg, rows = layouts.config, QueryRows(group)
    holders: dict = {}
    for tid in range(cfg.num_threads):
        for row, _ in layouts.s_coords(tid):
            holders.setdefault(row, set()).add(tid)
    out = []
    for r in range(cfg.block_m):
        packed = m_block * cfg.block_m + r
        useful = packed < rows.count(seqlen_q)
        out.append(dict(row=r, query=rows.query(packed) if useful else None,
                        head=packed % group if useful else None, threads=sorted(holders[r])))
    return out


class FlashLayouts:
    """Which tile elements each thread copies, holds and combines.

    Defaults are the configuration of docs/walkthrough.md §3: fp16, d=64, a 64x64 tile,
    4 warps (128 threads). Coordinates are tile-local: add 64*m_block to a
    query and 64*n_block to a key for the global position.
    """

    def __init__(self, head_dim=64, block_m=64, block_n=64, num_threads=128, dtype="float16",
                 warps_split_keys=False):
        self.config = TileConfig(head_dim=head_dim, block_m=block_m, block_n=block_n,
                                 num_threads=num_threads, dtype=dtype,
                                 warps_split_keys=warps_split_keys)

    @classmethod
    def of(cls, cfg: TileConfig) -> "FlashLayouts":
        """The layouts of a kernel's own tile, e.g. `FlashLayouts.of(key.tile)` for a key of
        `cute_fa.tuning.decode_key`."""
        return cls(head_dim=cfg.head_dim, block_m=cfg.block_m, block_n=cfg.block_n,
                   num_threads=cfg.num_threads, dtype=cfg.dtype,
                   warps_split_keys=cfg.warps_split_keys)

    def __repr__(self):
        c = self.config
        split = ", warps_split_keys=True" if c.warps_split_keys else ""
        return (f"FlashLayouts(head_dim={c.head_dim}, block_m={c.block_m}, block_n={c.block_n}, "
                f"num_threads={c.num_threads}, dtype={c.dtype}{split})")

    @property
    def _t(self) -> dict:
        return _tables_for(self.config)

    def _check_tid(self, tid) -> int:
        return check_tid(tid, self.config.num_threads)

    def _pairs(self, table: str, tid) -> list:
        return [tuple(int(x) for x in rc) for rc in self._t["tables"][table][self._check_tid(tid)]]

    def smem_offset(self, tensor: str, row: int, col: int) -> int:
        """Element offset of logical (row, col) of the 'Q', 'K', 'V' or 'O' tile after swizzle."""
        if tensor not in ("Q", "K", "V", "O"):
            raise ValueError(f"tensor must be one of 'Q', 'K', 'V', 'O', got {tensor!r}")
        table = self._t["swizzle"]["Q" if tensor in ("Q", "O") else "KV"]
        rows, cols = table.shape
        if not (0 <= row < rows):
            raise ValueError(f"row must be in [0, {rows}) for {tensor}, got {row}")
        if not (0 <= col < cols):
            raise ValueError(f"col must be in [0, {cols}) for {tensor}, got {col}")
        return int(table[row, col])

    def swizzle_table(self, tensor: str = "Q") -> np.ndarray:
        """(rows, cols) array of element offsets of one tile after swizzle."""
        if tensor not in ("Q", "K", "V", "O"):
            raise ValueError(f"tensor must be one of 'Q', 'K', 'V', 'O', got {tensor!r}")
        return self._t["swizzle"]["Q" if tensor in ("Q", "O") else "KV"].copy()

    def copy_coords(self, tid: int, tensor: str = "Q") -> list:
        """Every (row, col) of a Q/K/V tile that `tid` copies gmem->smem, ascending.

        Q's tile is block_m rows, K's and V's block_n rows: the same threads' pattern, so the
        rows differ where block_m != block_n. Columns from head_dim up to the padded width are
        zero-filled, not copied.
        """
        if tensor not in ("Q", "K", "V"):
            raise ValueError(f"tensor must be one of 'Q', 'K', 'V', got {tensor!r}")
        pairs = self._pairs("copy_Q" if tensor == "Q" else "copy_KV", tid)
        return sorted(p for p in pairs if p[1] < self.config.head_dim)

    def ldmatrix_coords(self, tid: int, tensor: str = "Q") -> list:
        """(row, col) of the smem tile whose row addresses `tid` feeds to ldmatrix, in copy order.

        For V the tile is (key, d), read transposed.
        """
        if tensor not in ("Q", "K", "V"):
            raise ValueError(f"tensor must be one of 'Q', 'K', 'V', got {tensor!r}")
        return self._pairs("ldsm_" + tensor, tid)

    def q_coords(self, tid: int) -> list:
        """(query, d) of the A fragment of Q@K^T held by `tid`, in register-slot order."""
        return self._pairs("Q", tid)

    def k_coords(self, tid: int) -> list:
        """(key, d) of the B fragment of Q@K^T held by `tid`, in register-slot order."""
        return self._pairs("K", tid)

    def s_coords(self, tid: int) -> list:
        """(query, key) of each S accumulator slot of `tid`, in register-slot order."""
        return self._pairs("S", tid)

    def v_coords(self, tid: int) -> list:
        """(key, d) of the B fragment of P@V held by `tid`, in register-slot order."""
        return self._pairs("V", tid)

    def o_coords(self, tid: int) -> list:
        """(query, d) of each O accumulator slot of `tid`, in register-slot order."""
        return self._pairs("O", tid)

    def p_coords(self, tid: int) -> list:
        """(query, key) of each A-operand slot of P@V, read through the S->A register view."""
        s = self._t["tables"]["S"][self._check_tid(tid)]
        return [tuple(int(x) for x in s[i]) for i in self._t["p_index"]]

    def pv_a_coords(self, tid: int) -> list:
        """(query, key) the TiledMMA expects in each A slot of P@V (its own partition_A)."""
        return self._pairs("PV_A", tid)

    def s_rowcol(self, tid: int) -> list:
        """The accumulator's row view: for each of `tid`'s rows, (query, [keys in column order])."""
        s = self._t["tables"]["S"][self._check_tid(tid)]
        index = self._t["s_rowcol_index"]
        return [(int(s[row[0], 0]), [int(s[i, 1]) for i in row]) for row in index]

    @property
    def s_rowcol_layout(self) -> tuple:
        """(shape, stride) of the S accumulator's (row, col) view, as CuTe prints it."""
        return self._t["s_rowcol"]

    @property
    def fragment_shapes(self) -> dict:
        """Top-level mode sizes of each per-thread register tensor (docs/walkthrough.md §7)."""
        return dict(self._t["fragments"])

    @property
    def fragment_layouts(self) -> dict:
        return dict(self._t["fragment_layouts"])

    @property
    def reduce_offsets(self) -> tuple:
        """XOR offsets of the row all-reduce, in shuffle order."""
        return self._t["reduce_offsets"]

    def quad_partners(self, tid: int) -> list:
        """Threads (in `tid`'s warp) whose values `tid` combines in a row reduction, in shuffle order."""
        tid = self._check_tid(tid)
        return [tid ^ off for off in self.reduce_offsets]

    def reduce_group(self, tid: int) -> list:
        """All threads holding the same accumulator rows as `tid` (its quad), ascending."""
        tid = self._check_tid(tid)
        group = {tid}
        for off in self.reduce_offsets:
            group |= {t ^ off for t in group}
        return sorted(group)

    def allreduce_steps(self, local: dict, op: str = "max") -> list:
        """Butterfly all-reduce of per-thread values, as the kernel's shuffles run it.

        `local` maps each thread of one reduce group to its value. Returns the
        values after each step: [local, after XOR offsets[0], after XOR offsets[1], ...].
        """
        if op not in _OPS:
            raise ValueError(f"op must be 'max' or 'sum', got {op!r}")
        fn = _OPS[op]
        state = dict(local)
        steps = [dict(state)]
        for off in self.reduce_offsets:
            state = {t: fn(state[t], state[t ^ off]) for t in state}
            steps.append(dict(state))
        return steps

    def reduce_steps(self, row_values, tid: int = 0, op: str = "max") -> list:
        """Reduce one S row laid out across `tid`'s quad: thread-local first, then shuffles.

        `row_values[k]` is the score of key k (tile-local) for one of the rows
        that `tid`'s group holds.
        """
        row_values = list(row_values)
        if len(row_values) != self.config.block_n:
            raise ValueError(f"row_values must have block_n={self.config.block_n} entries")
        if op not in _OPS:
            raise ValueError(f"op must be 'max' or 'sum', got {op!r}")
        local = {}
        for t in self.reduce_group(tid):
            keys = self.s_rowcol(t)[0][1]
            local[t] = functools.reduce(_OPS[op], (row_values[k] for k in keys))
        return self.allreduce_steps(local, op)

    def causal_keep(self, tid: int, m_block: int = 0, n_block: int = 0) -> dict:
        """Keys each of `tid`'s queries keeps under top-left causal masking (key <= query).

        Global positions: query = block_m*m_block + row, key = block_n*n_block + col.
        """
        from ..visibility import key_visible

        c = self.config
        keep: dict = {}
        for query, keys in self.s_rowcol(tid):
            q = c.block_m * m_block + query
            ks = [c.block_n * n_block + k for k in keys]
            keep[q] = [k for k in ks if key_visible(q, k, causal=True, causal_offset=0)]
        return keep

    def mod_values(self, tid: int, *, mask_mod=None, score_mod=None, m_block: int = 0,
                   n_block: int = 0, b: int = 0, h: int = 0, scores=None) -> dict:
        """What a mod computes in `tid`'s score registers (`cute_fa.mods`, FlexAttention's
        signatures): for each of its queries, [(key, value)] in register order, the mod
        evaluated at the (b, h, query, key) that register holds (query = block_m * m_block +
        row, key = block_n * n_block + col). mask_mod: True where the key is kept; score_mod:
        its value at the scaled score `scores[query][key]` (a (block_m, block_n) table of the
        tile's rows and columns; zeros if None)."""
        import torch

        from ..mods import evaluate, trace_mask_mod, trace_score_mod

        if (mask_mod is None) == (score_mod is None):
            raise ValueError("pass one of mask_mod and score_mod")
        c = self.config
        graph, captured = (trace_mask_mod(mask_mod) if score_mod is None
                           else trace_score_mod(score_mod))
        out: dict = {}
        for row, cols in self.s_rowcol(tid):
            q = c.block_m * m_block + row
            keys = torch.tensor([c.block_n * n_block + col for col in cols])
            score = None
            if score_mod is not None:
                score = torch.tensor([0.0 if scores is None else float(scores[row][col])
                                      for col in cols], dtype=torch.float64)
            values = evaluate(graph, captured, b=torch.tensor(b), h=torch.tensor(h),
                              q_idx=torch.tensor(q), kv_idx=keys, score=score)
            out[q] = [(int(k), v.item()) for k, v in zip(keys, values.expand(len(cols)))]
        return out

    def ring_offset(self, tensor: str, row: int, col: int, stage: int) -> int:
        """Element offset of (row, col) of stage `stage` of the TMA kernel's two-stage K/V ring."""
        if tensor not in ("K", "V"):
            raise ValueError(f"tensor must be 'K' or 'V', got {tensor!r}")
        table = self._t["swizzle"]["KV_ring"]
        rows, cols, stages = table.shape
        for name, value, limit in (("row", row, rows), ("col", col, cols),
                                   ("stage", stage, stages)):
            if not 0 <= value < limit:
                raise ValueError(f"{name} must be in [0, {limit}), got {value}")
        return int(table[row, col, stage])

    def ring_byte_tma(self, row: int, col: int, stage: int) -> int:
        """Byte offset TMA writes K's (row, col) of `stage` to, from the layout handed to TMA:
        its unswizzled offset in bytes, then its byte swizzle Swizzle<B,M,S>."""
        b, m, sh = self._t["tma_byte_swizzle"]
        linear = int(self._t["swizzle"]["KV_ring_tma_unswizzled"][row, col, stage])
        byte = linear * self.config.elem_bytes
        yyy = ((1 << b) - 1) << (m + sh)
        return byte ^ ((byte & yyy) >> sh)

    def tma_box(self, tensor: str = "K"):
        """The TMA box of one tile: rows, columns, swizzle bytes, boxes per tile, bytes per tile."""
        from ..layouts.tma import tma_box

        if tensor not in ("Q", "K", "V"):
            raise ValueError(f"tensor must be one of 'Q', 'K', 'V', got {tensor!r}")
        return tma_box(self.config, tensor)

    def tma_objects(self, stages: int = 2) -> dict:
        """The TMA copy atom, TMA tensor, smem ring and tma_partition of K, as the DSL prints them."""
        from .tma_objects import describe

        return describe(self.config, stages)

    @staticmethod
    def ring_rounds(n_blocks: int, stages: int = 2) -> list:
        """The TMA kernel's K/V rounds: which key block, stage and mbarrier phase each uses,
        and which block's load it starts when it frees its stage."""
        from ..layouts.ring import ring_slot

        rounds = []
        for i in range(n_blocks):
            stage, phase = ring_slot(i, stages)
            refill = n_blocks - 1 - (i + stages) if i + stages < n_blocks else None
            rounds.append({"round": i, "key_block": n_blocks - 1 - i, "stage": stage,
                           "wait_phase": phase, "refills_with_block": refill})
        return rounds

    def packed_rows(self, group: int, seqlen_q: int = 1, m_block: int = 0) -> list:
        """Decode's GQA packing of this tile (`cute_fa.kernels.sched.seqlen.QueryRows`, the object
        the kernels use): for each of its block_m rows, a dict with the query and the head offset
        within the group it holds (None for a padding row past the group's seqlen_q * group rows),
        the threads whose S accumulator holds that row (one quad per warp holding it) and their
        warps: one, or every warp where the warps split the keys."""
        if isinstance(group, bool) or not isinstance(group, int) or group < 1:
            raise ValueError(f"group must be a positive int, got {group!r}")
        if isinstance(seqlen_q, bool) or not isinstance(seqlen_q, int) or seqlen_q < 1:
            raise ValueError(f"seqlen_q must be a positive int, got {seqlen_q!r}")
        return [dict(r, warps=sorted({t // WARP_SIZE for t in r["threads"]}))
                for r in packed_row_owners(self, group, seqlen_q, m_block)]

    def describe_packing(self, group: int, seqlen_q: int = 1) -> str:
        """Which rows of a decode tile (query block 0) do useful work under GQA packing, and
        which warps hold them: on a tile of 16-row slabs per warp, the other warps compute on
        zero rows; where the warps split the keys, every warp holds every row."""
        table = self.packed_rows(group, seqlen_q)
        useful = [r for r in table if r["query"] is not None]
        warps = sorted({w for r in useful for w in r["warps"]})
        idle = sorted({w for r in table for w in r["warps"]} - set(warps))
        lines = [f"{group} query heads per K/V head, {seqlen_q} "
                 f"quer{'y' if seqlen_q == 1 else 'ies'}: {len(useful)} of "
                 f"{self.config.block_m} rows hold a (query, head) pair, in warp"
                 f"{'' if len(warps) == 1 else 's'} {join_and(warps)}"]
        for r in useful[:8]:
            lines.append(f"  row {r['row']:3d}: query {r['query']}, head h0+{r['head']}, "
                         f"threads {fmt_ranges(r['threads'])}")
        if len(useful) > 8:
            lines.append(f"  ... {len(useful) - 8} more rows")
        if idle:
            lines.append(f"  warp{'' if len(idle) == 1 else 's'} {join_and(idle)}: padding rows "
                         f"only; {'it reads' if len(idle) == 1 else 'each reads'} all of K and V "
                         f"from shared memory for nothing")
        if self.config.warps_split_keys:
            c = self.config
            slabs = c.row_slabs > 1  # name each warp's rows only where they differ

            def place(w):
                s, g = c.warp_place(w)
                rows = f" rows {16 * s}..{16 * s + 15}" if slabs else ""
                return f"warp {w}{rows} keys {g * c.warp_keys}..{(g + 1) * c.warp_keys - 1}"

            whose = "its slab's rows and its own keys" if slabs else "its own keys"
            lines.append(f"  each warp for {whose} of every K/V tile: "
                         + ", ".join(place(w) for w in range(c.num_warps)))
        return "\n".join(lines)

    def _copy_summary(self, tid: int, table: str) -> tuple:
        """(rows, cols, elements) that `tid` copies of one tile ('copy_Q' or 'copy_KV'), as
        describe_lane prints them. A thread whose chunks all lie in the zero-filled padding
        past head_dim copies nothing: then (None, those padding cols, 0)."""
        pairs = self._pairs(table, tid)
        copy = [p for p in pairs if p[1] < self.config.head_dim]
        if not copy:
            return None, fmt_ranges(c for _, c in pairs), 0
        return fmt_ranges(r for r, _ in copy), fmt_ranges(c for _, c in copy), len(copy)

    def describe_lane(self, tid: int) -> str:
        """A human-readable account of what `tid` holds and whom it talks to."""
        tid = self._check_tid(tid)
        rows = self.s_rowcol(tid)
        queries = [q for q, _ in rows]
        keys = rows[0][1]
        partners = [t % WARP_SIZE for t in self.quad_partners(tid)]
        o_dims = sorted({d for _, d in self.o_coords(tid) if d < self.config.head_dim})
        warp, lane = divmod(tid, WARP_SIZE)
        lines = [
            f"thread {tid} (warp {warp}, lane {lane}) holds query {join_and(queries)}, "
            f"keys {fmt_ranges(keys)}, talks to lanes {join_and(partners)}",
            f"  Q@K^T  A (Q):  {len(self.q_coords(tid))} values, queries {join_and(queries)} x "
            f"d {fmt_ranges(d for _, d in self.q_coords(tid))}",
            f"  Q@K^T  B (K):  {len(self.k_coords(tid))} values, keys "
            f"{fmt_ranges(k for k, _ in self.k_coords(tid))} x "
            f"d {fmt_ranges(d for _, d in self.k_coords(tid))}",
            f"  S accumulator: {len(self.s_coords(tid))} floats, first slots "
            + " ".join(str(p) for p in self.s_coords(tid)[:4]),
            f"  P@V    B (V):  {len(self.v_coords(tid))} values, keys "
            f"{fmt_ranges(k for k, _ in self.v_coords(tid))} x "
            f"d {fmt_ranges(d for _, d in self.v_coords(tid))}",
            f"  O accumulator: {len(self.o_coords(tid))} floats, queries {join_and(queries)} x "
            f"d {fmt_ranges(o_dims)}",
            f"  row max/sum:   shuffles XOR {join_and(self.reduce_offsets)} "
            f"with lanes {join_and(partners)} (threads {self.reduce_group(tid)})",
        ]
        # Q's tile is block_m rows, K's and V's block_n: each its own rows. Where the two
        # summaries read the same (block_m == block_n), one line is exact for all three.
        copied = {"Q": self._copy_summary(tid, "copy_Q"),
                  "K/V": self._copy_summary(tid, "copy_KV")}
        if copied["Q"] == copied["K/V"]:
            copied = {"Q/K/V": copied["Q"]}
        for tile, (copy_rows, copy_cols, n) in copied.items():
            if copy_rows is None:
                lines.append(f"  cp.async:      nothing: its cols {copy_cols} of every {tile} "
                             f"tile lie past head_dim {self.config.head_dim}, so it zero-fills "
                             f"them")
            else:
                lines.append(f"  cp.async:      rows {copy_rows}, cols {copy_cols} of every "
                             f"{tile} tile ({n} elements)")
        if self.config.warps_split_keys:
            c = self.config
            _, group = c.warp_place(warp)
            lines.append(f"  warp split:    its softmax and O are warp {warp}'s over keys "
                         f"{group * c.warp_keys}..{(group + 1) * c.warp_keys - 1} of each tile; "
                         f"the {c.key_groups} warps' O, max and sum are combined in shared "
                         f"memory at the end")
        return "\n".join(lines)


def join_and(values) -> str:
    """Ints as prose: [0] -> '0', [0, 8] -> '0 and 8', [0, 8, 64] -> '0, 8 and 64'."""
    values = [str(int(v)) for v in values]
    if len(values) <= 1:
        return "".join(values)
    return ", ".join(values[:-1]) + " and " + values[-1]
