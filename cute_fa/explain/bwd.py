"""Host-side introspection of the backward kernel's layouts (`kernels/bwd/sm80.py`).

`BwdLayouts` traces the builders of `cute_fa.layouts.bwd` once per tile, on the CPU, the way
`bwd_thread` builds a thread's state, and keeps as arrays what every thread of the CTA holds in
the three TiledMMAs (A, B and accumulator coordinates, k-step by k-step), the rows it addresses
in each ldmatrix, where those rows sit in shared memory under the tiles' swizzle, and which
thread stores each element of the P (and dS) tile.

The three products and their operands, each named in the orientation the MMA reads it:

    "sdp"  S = Q K^T, dP = dO V^T         A (query, d)    B (key, d)     C (query, key)
    "dkv"  dV += P^T dO, dK += dS^T Q     A (key, query)  B (d, query)   C (key, d)
    "dq"   dQ = dS K                      A (query, key)  B (d, key)     C (query, d)

The second product of a pair reads its operands through the same layouts as the first (dO's
tile is Q's, V's is K's, dS's is P's), so every answer about S, P, dO^T or dV holds for dP, dS,
Q^T or dK too. What makes the backward different from the forward is P: the S accumulator that
becomes P is split between threads by the S TiledMMA, and the A operand of P^T dO by another
TiledMMA over transposed coordinates, so a thread needs mostly P values other threads computed.
P goes through shared memory, and `writers` and `own_share` say how far it travels.
"""

from __future__ import annotations

import functools

import numpy as np

from ..layouts.config import WARP_SIZE, BwdTileConfig
from .introspect import check_tid, fmt_ranges, join_and, trace_builders

PRODUCTS = ("sdp", "dkv", "dq")
OPERANDS = ("A", "B")
# (product, operand) -> (stored tile, read transposed): dO^T and Q^T share dO's layout, K^T K's
OPERAND_TILES = {("sdp", "A"): ("Q", False), ("sdp", "B"): ("K", False),
                 ("dkv", "A"): ("P", True), ("dkv", "B"): ("dO", True),
                 ("dq", "A"): ("dS", False), ("dq", "B"): ("K", True)}
PHASE_LANES = 8  # ldmatrix serves one 8x8 matrix (8 row addresses of 16 bytes) per phase
BANK_GROUPS = 8  # a 128-byte line of shared memory: 8 groups of four 4-byte banks


def _shapes(cfg: BwdTileConfig) -> dict:
    """Each product's (M, N, K) extents."""
    bm, bn, dp = cfg.block_m, cfg.block_n, cfg.head_dim_padded
    return {"sdp": (bm, bn, dp), "dkv": (bn, dp, bm), "dq": (bm, dp, bn)}


def _swizzled(x: np.ndarray, swizzle: tuple) -> np.ndarray:
    """CuTe's Swizzle<B,M,S>, swizzle = (B, M, S), applied to offsets: bits [M+S, M+S+B) XORed
    into [M, M+B)."""
    bits, base, shift = (int(v) for v in swizzle)
    mask = ((1 << bits) - 1) << (base + shift)
    return x ^ ((x & mask) >> shift)


def _collect(cfg: BwdTileConfig) -> dict:
    """Trace the builders for `cfg` and read every thread's partitions and the smem views."""
    import cutlass.cute as cute

    from ..layouts import _read, bwd

    out: dict = {}

    def coords(t):
        return _read.coordinates(t, 2)

    def view_offsets(view, shape, probes):
        """Unswizzled element offsets of an smem view over its first two modes (stage 0),
        read as numpy; their swizzle (the view's own) checked on `probes` against the DSL's
        evaluation of the view."""
        full = _read.mode_sizes(view.outer)
        stage = (0,) * (len(full) - 2)
        table = _read.indices(view.outer).reshape(full, order="F")[(slice(None),) * 2 + stage]
        assert table.shape == shape, (table.shape, shape)
        for rc in probes:
            want = _swizzled(table[rc], (view.inner.num_bits, view.inner.num_base,
                                         view.inner.num_shift))
            assert int(view(rc + stage)) == int(want), (rc, view)
        return table

    def read_all():
        bm, bn, dp, st = cfg.block_m, cfg.block_n, cfg.head_dim_padded, cfg.q_stages
        shapes = _shapes(cfg)
        mmas = {"sdp": bwd.tiled_mma_sdp(cfg), "dkv": bwd.tiled_mma_dkv(cfg),
                "dq": bwd.tiled_mma_dq(cfg)}
        sQ, sKV, sPS = bwd.smem_layout_q(cfg), bwd.smem_layout_kv(cfg), bwd.smem_layout_ps(cfg)
        # the views bwd_thread partitions, as layouts: the kernel's sQ/sdO carry a stage mode
        views = {("sdp", "A"): sQ, ("sdp", "B"): sKV,
                 ("dkv", "A"): bwd.transposed(sPS, bm, bn),
                 ("dkv", "B"): bwd.transposed(sQ, bm, dp, st),
                 ("dq", "A"): sPS, ("dq", "B"): bwd.transposed(sKV, bn, dp)}
        copies = {}
        for p in PRODUCTS:
            for op, make in (("A", bwd.smem_copy_a), ("B", bwd.smem_copy_b)):
                copies[p, op] = make(cfg, mmas[p], transpose=OPERAND_TILES[p, op][1])
        r2s = bwd.r2s_copy_ps(cfg, mmas["sdp"])

        ids = {}
        for p, (m, n, k) in shapes.items():
            ids[p, "A"] = cute.make_identity_tensor((m, k))
            ids[p, "B"] = cute.make_identity_tensor((n, k))
            ids[p, "C"] = cute.make_identity_tensor((m, n))
        tables: dict = {key: [] for key in ids}
        tables.update({("ldsm",) + key: [] for key in copies})
        tables["P_written"] = []
        samples = {}
        for t in range(cfg.num_threads):
            for p in PRODUCTS:
                thr = mmas[p].get_slice(t)
                for op, part in (("A", thr.partition_A), ("B", thr.partition_B),
                                 ("C", thr.partition_C)):
                    tensor = part(ids[p, op])
                    tables[p, op].append(coords(tensor))
                    if t in (0, 37, cfg.num_threads - 1):
                        samples[p, op, t] = [tuple(int(x) for x in tensor[i]) for i in range(8)]
            for (p, op), cp in copies.items():
                # ((8, 1), copies along M or N, k-steps): each group of 8 is one 16-byte row
                tables["ldsm", p, op].append(coords(cp.get_slice(t).partition_S(ids[p, op])))
            tables["P_written"].append(coords(r2s.get_slice(t).partition_D(ids["sdp", "C"])))
        out["tables"] = {key: np.stack(v) for key, v in tables.items()}
        out["dsl_samples"] = samples
        out["ldsm_modes"] = {key: _read.mode_sizes(cp.get_slice(0).partition_S(ids[key]).layout)
                             for key, cp in copies.items()}

        out["plain"], out["offsets"], out["swizzle"] = {}, {}, {}
        for key, view in views.items():
            m, n, k = shapes[key[0]]
            shape = (m, k) if key[1] == "A" else (n, k)
            probes = [(0, 0), (1, 0), (0, 8), (shape[0] - 1, shape[1] - 1), (5, 13 % shape[1])]
            sw = view.inner
            out["swizzle"][key] = (int(sw.num_bits), int(sw.num_base), int(sw.num_shift))
            out["plain"][key] = view_offsets(view, shape, probes)
            out["offsets"][key] = _swizzled(out["plain"][key], out["swizzle"][key])
        out["layouts"] = {f"tiled_mma_{p}": str(mma) for p, mma in mmas.items()}
        out["layouts"].update({f"smem_{name}": str(v) for name, v in
                               (("Q", sQ), ("KV", sKV), ("PS", sPS), ("Pt", views["dkv", "A"]))})

    return trace_builders(read_all, out)


@functools.lru_cache(maxsize=8)
def _tables_for(cfg: BwdTileConfig) -> dict:
    return _collect(cfg)


class BwdLayouts:
    """What each thread of the backward kernel's CTA holds, reads and writes.

    `cfg` is a backward tile (`cute_fa.tuning_bwd.bwd_tile`); the default is the bf16 head_dim 128
    tile of sm_80. Coordinates are tile-local and named in each operand's MMA orientation
    (module docstring); `p_written`, `p_read` and the ldmatrix rows' 'tile' entries are in the
    stored tiles' (row, column) orientation: P and dS (query, key), Q and dO (query, d), K and
    V (key, d).
    """

    def __init__(self, cfg: BwdTileConfig | None = None):
        if cfg is None:
            from ..tuning_bwd import bwd_tile

            cfg = bwd_tile("sm_80", "bfloat16", 128)
        if not isinstance(cfg, BwdTileConfig):
            raise TypeError(f"cfg must be a BwdTileConfig, got {cfg!r}")
        self.config = cfg

    def __repr__(self):
        return f"BwdLayouts({self.config!r})"

    @property
    def _t(self) -> dict:
        return _tables_for(self.config)

    def _check_tid(self, tid) -> int:
        return check_tid(tid, self.config.num_threads)

    @staticmethod
    def _check_product(product) -> str:
        if product not in PRODUCTS:
            raise ValueError(f"product must be one of {PRODUCTS}, got {product!r}")
        return product

    def _check_k(self, product, k) -> int:
        n = self.k_steps(product)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < n:
            raise ValueError(f"k must be a k-step of {product} in [0, {n}), got {k!r}")
        return int(k)

    @staticmethod
    def _pairs(array) -> list:
        return [tuple(int(x) for x in rc) for rc in array]

    # ---- the MMA fragments ----

    def k_steps(self, product: str) -> int:
        """16-wide k-steps of a product: head_dim / 16 for S, block_m / 16 for dV and dK (the
        queries), block_n / 16 for dQ (the keys)."""
        return _shapes(self.config)[self._check_product(product)][2] // 16

    def _fragment(self, product, operand, tid, k) -> list:
        table = self._t["tables"][self._check_product(product), operand][self._check_tid(tid)]
        k = self._check_k(product, k)
        # A ((2,2,2), M atoms, k-steps) and B ((2,2), N atoms, k-steps), colexicographic:
        # entry i + 8 m (A) or i + 4 n (B) of k-step k
        return self._pairs(table.reshape(self.k_steps(product), -1, 2)[k])

    def a_coords(self, product: str, tid: int, k: int) -> list:
        """(M, K) of the A values of k-step `k` of `tid`, in register order: a0 ... a7 of its
        first m16 atom, then of the next. For "dkv" these are (key, query) of P^T."""
        return self._fragment(product, "A", tid, k)

    def b_coords(self, product: str, tid: int, k: int) -> list:
        """(N, K) of the B values of k-step `k` of `tid`, in register order: b0 ... b3 of its
        first n8 atom, then of the next. For "dkv" these are (d, query) of dO^T."""
        return self._fragment(product, "B", tid, k)

    def c_coords(self, product: str, tid: int) -> list:
        """(M, N) of `tid`'s accumulator registers, in register order (c0 ... c3 of each m16n8
        atom, M atoms first): S (query, key), dV/dK (key, d), dQ (query, d)."""
        return self._pairs(self._t["tables"][self._check_product(product), "C"]
                           [self._check_tid(tid)])

    # ---- P through shared memory ----

    def p_written(self, tid: int) -> list:
        """(query, key) of the P (and dS) tile `tid` stores, in store order: its S
        accumulator's elements, two neighbouring keys (32 bits) per store."""
        return self._pairs(self._t["tables"]["P_written"][self._check_tid(tid)])

    def p_read(self, tid: int, product: str = "dkv") -> list:
        """(query, key) of the stored P tile (dS: the same) that `tid`'s A fragments of
        `product` hold over all k-steps, in register order: "dkv" reads it as P^T (key, query)
        and "dq" reads dS as it is."""
        if product not in ("dkv", "dq"):
            raise ValueError(f"product must be 'dkv' or 'dq' (the products that read P or dS), "
                             f"got {product!r}")
        a = self._t["tables"][product, "A"][self._check_tid(tid)]
        return self._pairs(a[:, ::-1] if product == "dkv" else a)

    @functools.cached_property
    def _writer(self) -> np.ndarray:
        c = self.config
        grid = np.full((c.block_m, c.block_n), -1)
        for t, written in enumerate(self._t["tables"]["P_written"]):
            grid[written[:, 0], written[:, 1]] = t
        return grid

    def p_owners(self, product: str = "dkv") -> dict:
        """Over the P tile (query, key): 'writer', the thread that stored each element, and
        'readers', the threads whose A fragments of `product` hold it (block_m, block_n,
        readers per element), ascending."""
        c = self.config
        held = [[[] for _ in range(c.block_n)] for _ in range(c.block_m)]
        for t in range(c.num_threads):
            for q, k in self.p_read(t, product):
                held[q][k].append(t)
        return dict(writer=self._writer.copy(), readers=np.array(held))

    def writers(self, tid: int, product: str = "dkv") -> dict:
        """{thread: how many of the P (dS) elements `tid` reads in `product` it stored}."""
        counts: dict = {}
        for q, k in self.p_read(tid, product):
            w = int(self._writer[q, k])
            counts[w] = counts.get(w, 0) + 1
        return dict(sorted(counts.items()))

    def own_share(self, tid: int, product: str = "dkv") -> tuple:
        """(elements of P (dS) `tid` reads in `product` that it computed itself, elements it
        reads): the rest came through shared memory from other threads."""
        read = self.p_read(tid, product)
        return self.writers(tid, product).get(self._check_tid(tid), 0), len(read)

    # ---- ldmatrix rows and banks ----

    def _check_operand(self, product, operand) -> tuple:
        if operand not in OPERANDS:
            raise ValueError(f"operand must be 'A' or 'B', got {operand!r}")
        return self._check_product(product), operand

    def ldmatrix_count(self, product: str, operand: str) -> int:
        """ldmatrix.x4 a thread issues for one operand of one (query block, key block) step."""
        _, along, steps = self._t["ldsm_modes"][self._check_operand(product, operand)]
        return along * steps

    def _offsets(self, key, swizzled: bool) -> np.ndarray:
        return self._t["offsets" if swizzled else "plain"][key]

    def ldmatrix_rows(self, product: str, operand: str, tid: int, swizzled: bool = True) -> list:
        """The row address `tid` supplies to each of its ldmatrix.x4 for an operand, in copy
        order (along M or N first, then k-steps): a dict with 'k' (its k-step), 'view' (the
        row's first element in the operand's orientation), 'tile' (the same element of the
        stored tile), 'offset' (elements from the tile's start), 'byte' and 'bank_group'
        ((byte // 16) % 8; every tile starts 1024-byte aligned). swizzled=False: where the row
        would sit without the swizzle, for comparison."""
        key = self._check_operand(product, operand)
        rows = self._t["tables"]["ldsm", product, operand][self._check_tid(tid)]
        along = self._t["ldsm_modes"][key][1]
        offsets = self._offsets(key, swizzled)
        transposed = OPERAND_TILES[key][1]
        out = []
        for i, row in enumerate(rows.reshape(-1, 8, 2)):  # 8 elements, 16 bytes, per row
            first = tuple(int(x) for x in row[0])
            offset = int(offsets[first])
            byte = offset * self.config.elem_bytes
            out.append(dict(k=i // along, view=first, tile=first[::-1] if transposed else first,
                            offset=offset, byte=byte, bank_group=(byte // 16) % BANK_GROUPS))
        return out

    def ldmatrix_phases(self, product: str, operand: str, warp: int = 0, copy: int = 0,
                        swizzled: bool = True) -> list:
        """The `copy`-th ldmatrix.x4 of warp `warp`, as the hardware serves it: 4 phases (one
        8x8 matrix each), each the 8 row addresses of lanes 8p ... 8p + 7 (`ldmatrix_rows`
        entries with 'lane' added). A phase is one shared-memory wavefront when its 8 rows fall
        into 8 different bank groups."""
        n_warps = self.config.num_warps
        if isinstance(warp, bool) or not isinstance(warp, int) or not 0 <= warp < n_warps:
            raise ValueError(f"warp must be in [0, {n_warps}), got {warp!r}")
        n = self.ldmatrix_count(product, operand)
        if isinstance(copy, bool) or not isinstance(copy, int) or not 0 <= copy < n:
            raise ValueError(f"copy must be in [0, {n}), got {copy!r}")
        lanes = [dict(lane=lane, **self.ldmatrix_rows(product, operand, WARP_SIZE * warp + lane,
                                                      swizzled)[copy])
                 for lane in range(WARP_SIZE)]
        return [lanes[p:p + PHASE_LANES] for p in range(0, WARP_SIZE, PHASE_LANES)]

    def bank_conflicts(self, product: str, operand: str, swizzled: bool = True) -> dict:
        """Every phase of every ldmatrix.x4 of every warp for an operand: 'phases' counted,
        'worst' (most rows of one phase in one bank group: 1 is conflict-free, n costs n
        wavefronts) and 'conflicted' (phases with worst > 1)."""
        key = self._check_operand(product, operand)
        rows = self._t["tables"]["ldsm", product, operand]
        firsts = rows.reshape(self.config.num_threads, -1, 8, 2)[:, :, 0]
        offsets = self._offsets(key, swizzled)[firsts[..., 0], firsts[..., 1]]
        groups = offsets * self.config.elem_bytes // 16 % BANK_GROUPS  # (thread, copy)
        # (phase of the CTA, copy, lane of the phase): threads 8p ... 8p + 7 share a phase
        phases = groups.reshape(-1, PHASE_LANES, groups.shape[1]).transpose(0, 2, 1)
        ways = np.array([[np.bincount(ph, minlength=BANK_GROUPS).max() for ph in copy]
                         for copy in phases])
        return dict(phases=int(ways.size), worst=int(ways.max()),
                    conflicted=int((ways > 1).sum()))

    def swizzle(self, product: str, operand: str) -> tuple:
        """(B, M, S) of the Swizzle<B,M,S> on element offsets of the operand's smem view."""
        return self._t["swizzle"][self._check_operand(product, operand)]

    def smem_offset(self, product: str, operand: str, row: int, col: int,
                    swizzled: bool = True) -> int:
        """Element offset of (row, col) of an operand's smem view, in the operand's orientation
        ((key, query) for P^T), stage 0 of Q's and dO's ring."""
        table = self._offsets(self._check_operand(product, operand), swizzled)
        for name, value, limit in (("row", row, table.shape[0]), ("col", col, table.shape[1])):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or not 0 <= value < limit:
                raise ValueError(f"{name} must be in [0, {limit}), got {value!r}")
        return int(table[row, col])

    @property
    def layouts(self) -> dict:
        """The three TiledMMAs and the smem layouts (Q's, K's, P's and the P^T view), as the
        DSL prints them."""
        return dict(self._t["layouts"])

    def describe_lane(self, tid: int) -> str:
        """What `tid` holds in P^T dO and whom it gets P from, in words."""
        tid = self._check_tid(tid)
        warp, lane = divmod(tid, WARP_SIZE)
        own, needed = self.own_share(tid)
        others = {w: n for w, n in self.writers(tid).items() if w != tid}
        dv = self.c_coords("dkv", tid)
        written = self.p_written(tid)
        a0 = self.a_coords("dkv", tid, 0)
        return "\n".join([
            f"thread {tid} (warp {warp}, lane {lane})",
            f"  S, dP accumulators: {len(written)} floats each, queries "
            f"{fmt_ranges(q for q, _ in written)} x keys {fmt_ranges(k for _, k in written)}; "
            f"it stores them as P and dS",
            f"  P^T dO, A (P^T):    {len(a0)} values per k-step x {self.k_steps('dkv')}; "
            f"k-step 0 (key, query): " + " ".join(str(c) for c in a0[:8]),
            f"  P^T dO, B (dO^T):   d {fmt_ranges(d for d, _ in self.b_coords('dkv', tid, 0))}"
            f" of queries {fmt_ranges(q for _, q in self.b_coords('dkv', tid, 0))} (k-step 0)",
            f"  dV, dK accumulators: {len(dv)} floats each, keys "
            f"{fmt_ranges(k for k, _ in dv)} x d {fmt_ranges(d for _, d in dv)}",
            f"  P it reads: {needed} elements, {own} of them its own; the rest stored by "
            f"{len(others)} other threads: {join_and(others)}",
        ])
