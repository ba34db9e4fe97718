"""Host-side introspection of the Hopper kernel's layouts (`kernels/fwd/sm90.py`).

`WgmmaLayouts` traces the builders of `cute_fa.layouts.wgmma` and `cute_fa.layouts.tma` once
per tile, on the CPU, and keeps what each consumer thread holds as arrays: its S and O
accumulator elements (partition_C of identity tensors through the two TiledMMAs), its P
operand (the S registers seen through `acc_to_a_layout`, the view the kernel hands to the
RS-wgmma), the rows it reduces with, the warp roles, and where each element of the Q/K/V
shared-memory tiles sits (byte, 16-byte chunk, bank group) under the TMA/wgmma swizzle.

Thread numbers are consumer thread indices, 0 ... num_threads - 1, as the kernel's `ctidx`:
CTA thread = ctidx + 128 (warpgroup 0 is the producer).
"""

from __future__ import annotations

import functools

import numpy as np

from ..layouts import wgmma
from ..layouts.config import WARP_SIZE, TileConfig
from ..layouts.ring import ring_slot
from .introspect import fmt_ranges, join_and, packed_row_owners, trace_builders

REGISTER_FILE = 65536  # 32-bit registers per SM, all of which one CTA may take
DESC_UNIT = 16  # a wgmma smem descriptor addresses in 16-byte units (start address >> 4)
TENSORS = ("Q", "K", "V")
ARCH = "sm_90a"


def _collect(cfg: TileConfig, stages: int) -> dict:
    """Trace the builders for `cfg` and read every consumer thread's partitions."""
    import cutlass
    import cutlass.cute as cute

    from ..layouts import _read, tma
    from ..layouts._types import cutlass_dtype

    out: dict = {}

    def coords(t):
        return _read.coordinates(t, 2)

    def read_all():
        bm, bn, dp = cfg.block_m, cfg.block_n, cfg.head_dim_padded
        n_k = bn // wgmma.WGMMA_K
        mma_qk, mma_pv = wgmma.tiled_mma_qk(cfg), wgmma.tiled_mma_pv(cfg)
        cS = cute.make_identity_tensor((bm, bn))
        cO = cute.make_identity_tensor((bm, dp))
        tables = {name: [] for name in ("S", "O", "P", "PV_A")}
        samples = {}
        s_layout = mma_qk.get_slice(0).partition_C(cS).layout
        p_layout = wgmma.acc_to_a_layout(s_layout)  # a function of the layout alone
        for t in range(cfg.num_threads):
            tScS = mma_qk.get_slice(t).partition_C(cS)
            assert tScS.layout == s_layout  # threads differ only by where they start
            # the kernel's P: the S registers through acc_to_a_layout, ((2,2,2), 1, (N/16, 1))
            tOcP = cute.make_tensor(tScS.iterator, p_layout)
            # what the P V TiledMMA itself calls its A operand, ((2,2,2), 1, N/16)
            tOcA = mma_pv.get_slice(t).partition_A(cS)
            tables["S"].append(coords(tScS))
            tables["O"].append(coords(mma_pv.get_slice(t).partition_C(cO)))
            # register r of k-step s is entry r + 8 s of both views (colexicographic)
            tables["P"].append(coords(tOcP).reshape(n_k, 8, 2))
            tables["PV_A"].append(coords(tOcA).reshape(n_k, 8, 2))
            if t in (0, 37 % cfg.num_threads, cfg.num_threads - 1):
                # a few entries through the DSL's own indexing, to check the numpy reading
                samples["S", t] = [tuple(int(x) for x in tScS[i]) for i in range(8)]
                samples["PV_A", t] = [tuple(int(x) for x in tOcA[i]) for i in range(16)]
        out["tables"] = {k: np.stack(v) for k, v in tables.items()}
        out["dsl_samples"] = samples

        rS = cute.make_rmem_tensor(mma_qk.partition_shape_C((bm, bn)), cutlass.Float32)
        # which S register each P value comes from: the kernel stores S in 16 bits into a
        # register tensor of S's shape (rP) and hands P V that tensor through this view
        out["p_registers"] = _read.indices(wgmma.acc_to_a_layout(rS.layout)).reshape(n_k, 8)
        out["reduce_offsets"] = wgmma.row_reduce_offsets(mma_qk)
        rowcol = wgmma.acc_rowcol_layout(rS.layout)
        n_rows = _read.mode_sizes(rowcol)[0]
        out["s_rowcol_index"] = _read.indices(rowcol).reshape((n_rows, -1), order="F")
        out["layouts"] = {"tiled_mma_qk": str(mma_qk), "tiled_mma_pv": str(mma_pv),
                          "S_partition": str(mma_qk.get_slice(0).partition_C(cS).layout),
                          "P_view": str(wgmma.acc_to_a_layout(rS.layout)),
                          "O_partition": str(mma_pv.get_slice(0).partition_C(cO).layout)}

        # shared memory: the TMA tiles as the copy engine writes them, an unswizzled element
        # layout (`outer`) and a swizzle of byte addresses (`inner`)
        out["smem"] = {}
        for name in TENSORS:
            layout = tma.tma_smem_layout(cfg, name, stages if name != "Q" else 0)
            rows = bm if name == "Q" else bn
            shape = (rows, dp) if name == "Q" else (rows, dp, stages)
            sw = layout.inner
            elems = _read.indices(layout.outer).reshape(shape, order="F")
            probe = (rows - 1, dp - 1) if name == "Q" else (rows - 1, dp - 1, stages - 1)
            assert int(layout.outer(probe)) == int(elems[probe])  # numpy reading == DSL's
            out["smem"][name] = dict(layout=str(layout), elems=elems,
                                     swizzle=(int(sw.num_bits), int(sw.num_base),
                                              int(sw.num_shift)))

        # the wgmma descriptors the consumers build from these tiles (the swizzle goes on the
        # pointer, as in the kernel): their layouts are descriptor steps, in 16-byte units
        dtype = cutlass_dtype(cfg.dtype)
        sQ_l = tma.tma_smem_layout(cfg, "Q")
        sKV_l = tma.tma_smem_layout(cfg, "K", stages)

        def smem_tensor(layout):
            ptr = cute.make_ptr(dtype, 0, cute.AddressSpace.smem, assumed_align=1024,
                                swizzle_=layout.inner)
            return cute.make_tensor(ptr, layout.outer)

        wg_qk, wg_pv = mma_qk.get_slice(0), mma_pv.get_slice(0)
        descs = {
            "Q": wg_qk.make_fragment_A(wg_qk.partition_A(smem_tensor(sQ_l))),
            "K": wg_qk.make_fragment_B(wg_qk.partition_B(smem_tensor(sKV_l))),
            "Vt": wg_pv.make_fragment_B(wg_pv.partition_B(wgmma.transposed(smem_tensor(sKV_l)))),
        }
        out["descriptors"] = {}
        for name, frag in descs.items():
            steps = DESC_UNIT * _read.indices(frag.layout)
            n_steps = _read.mode_sizes(frag.layout)[2]
            out["descriptors"][name] = dict(
                layout=str(frag.layout),
                k_steps=steps[:n_steps],
                stages=steps[::n_steps] if name != "Q" else steps[:1])

    return trace_builders(read_all, out, ARCH)  # the wgmma builders check the target


@functools.lru_cache(maxsize=16)
def _tables_for(cfg: TileConfig, stages: int) -> dict:
    return _collect(cfg, stages)


def pipeline_rounds(n_rounds: int, stages: int = 2) -> list:
    """The wgmma kernel's K/V rounds, from `ring.ring_slot` (the function the kernel calls).

    Round i (key block n_rounds - 1 - i: the kernel walks the blocks from the last one down)
    lands in stage i % stages; the consumers wait for phase `full_phase` of that stage's K
    and V "full" barriers. Before refilling the stage the producer waits for the "empty"
    barriers of round i - stages, the previous lap, whose phase is the other one. With the
    intra-warpgroup overlap, round i's P V is round i - 1's (`pv_round`); the last P V runs
    after the loop.
    """
    rounds = []
    for i in range(n_rounds):
        stage, phase = ring_slot(i, stages)
        refill = i >= stages
        rounds.append(dict(
            round=i, key_block=n_rounds - 1 - i, stage=stage, full_phase=phase,
            producer_waits_round=i - stages if refill else None,
            empty_phase=1 - phase if refill else None,
            pv_round=i - 1 if i else None))
    return rounds


class WgmmaLayouts:
    """What each consumer thread of the wgmma kernel holds, and where its operands sit.

    `cfg` is a wgmma tile (`cute_fa.tuning.sm90_tile`); the default is the shipped bf16
    head_dim 128 tile. `stages` is the K/V ring's depth (the smem tables and descriptors).
    Coordinates are tile-local: S (query row, key), O (query row, d).
    """

    def __init__(self, cfg: TileConfig | None = None, stages: int = 2):
        if cfg is None:
            from ..tuning import sm90_tile

            cfg = sm90_tile("bfloat16", 128, causal=False)
        wgmma.check_tile(cfg)
        if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
            raise ValueError(f"stages must be a positive int, got {stages!r}")
        self.config = cfg
        self.stages = stages
        self.roles = wgmma.warp_roles(cfg)

    def __repr__(self):
        return f"WgmmaLayouts({self.config!r}, stages={self.stages})"

    @property
    def _t(self) -> dict:
        return _tables_for(self.config, self.stages)

    def _check_tid(self, tid) -> int:
        if isinstance(tid, bool) or not isinstance(tid, (int, np.integer)):
            raise TypeError(f"tid must be an int, got {tid!r}")
        if not 0 <= tid < self.config.num_threads:
            raise ValueError(f"tid must be a consumer thread in [0, {self.config.num_threads}), "
                             f"got {tid}")
        return int(tid)

    @staticmethod
    def _pairs(array) -> list:
        return [tuple(int(x) for x in rc) for rc in array]

    # ---- who a thread is ----

    def place(self, tid: int) -> dict:
        """Consumer thread `tid`: its warpgroup (among the consumers), warp in the warpgroup,
        lane, and its thread and warp index in the CTA (the producer warpgroup comes first)."""
        tid = self._check_tid(tid)
        wg, t = divmod(tid, wgmma.WARPGROUP_THREADS)
        warp, lane = divmod(t, WARP_SIZE)
        cta = tid + wgmma.WARPGROUP_THREADS
        return dict(warpgroup=wg, warp=warp, lane=lane, cta_thread=cta, cta_warp=cta // WARP_SIZE)

    def warp_table(self) -> list:
        """Every warp of the CTA: its warpgroup, role (`WarpRoles.role`) and the registers per
        thread it runs with after setmaxnreg."""
        r = self.roles
        return [dict(warp=w, warpgroup=w // 4, role=r.role(w),
                     registers=r.producer_regs if w < 4 else r.consumer_regs)
                for w in range(r.threads // WARP_SIZE)]

    def register_split(self) -> dict:
        """setmaxnreg's split of the register file: per-thread counts, and the totals."""
        r = self.roles
        producer = r.producer_regs * wgmma.WARPGROUP_THREADS
        consumers = r.consumer_regs * r.consumer_threads
        return dict(producer_regs=r.producer_regs, consumer_regs=r.consumer_regs,
                    producer_total=producer, consumer_total=consumers,
                    total=producer + consumers, register_file=REGISTER_FILE)

    # ---- the accumulators and P ----

    def s_coords(self, tid: int) -> list:
        """(query row, key) of each S accumulator register of `tid`, in register order."""
        return self._pairs(self._t["tables"]["S"][self._check_tid(tid)])

    def o_coords(self, tid: int) -> list:
        """(query row, d) of each O accumulator register of `tid`, in register order."""
        return self._pairs(self._t["tables"]["O"][self._check_tid(tid)])

    @property
    def k_steps(self) -> int:
        """P V's k-steps per round: block_n / 16."""
        return self.config.block_n // wgmma.WGMMA_K

    def p_coords(self, tid: int, k: int) -> list:
        """(query row, key) of the A values a0 ... a7 of P V's k-step `k` (16-bit, two per
        32-bit register), as the kernel sees them: the S registers through `acc_to_a_layout`."""
        return self._pairs(self._t["tables"]["P"][self._check_tid(tid)][self._check_k(k)])

    def pv_a_coords(self, tid: int, k: int) -> list:
        """(query row, key) the P V TiledMMA expects in the A values of k-step `k`: its own
        partition_A of the (block_m, block_n) identity tensor."""
        return self._pairs(self._t["tables"]["PV_A"][self._check_tid(tid)][self._check_k(k)])

    def p_registers(self, k: int) -> list:
        """Which S register (index into `s_coords`) each A value of k-step `k` is made from."""
        return [int(v) for v in self._t["p_registers"][self._check_k(k)]]

    def _check_k(self, k) -> int:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) \
                or not 0 <= k < self.k_steps:
            raise ValueError(f"k must be a k-step in [0, {self.k_steps}), got {k!r}")
        return int(k)

    def s_rowcol(self, tid: int) -> list:
        """The accumulator's row view: for each of `tid`'s rows, (query row, [keys in order])."""
        s = self._t["tables"]["S"][self._check_tid(tid)]
        return [(int(s[row[0], 0]), [int(s[i, 1]) for i in row])
                for row in self._t["s_rowcol_index"]]

    @property
    def reduce_offsets(self) -> tuple:
        """XOR shuffle offsets of the row max/sum (`wgmma.row_reduce_offsets`), in order."""
        return self._t["reduce_offsets"]

    def reduce_group(self, tid: int) -> list:
        """The consumer threads holding the same rows as `tid` (all of them combine a row)."""
        group = {self._check_tid(tid)}
        for off in self.reduce_offsets:
            group |= {t ^ off for t in group}
        return sorted(group)

    @property
    def layouts(self) -> dict:
        """The TiledMMAs and thread 0's partitions, as the DSL prints them."""
        return dict(self._t["layouts"])

    # ---- shared memory ----

    def swizzle(self, tensor: str = "K") -> tuple:
        """(bits, base, shift) of the byte swizzle Swizzle<B,M,S> of a Q/K/V tile."""
        return self._t["smem"][self._check_tensor(tensor)]["swizzle"]

    def swizzle_bytes(self, tensor: str = "K") -> int:
        """The swizzle mode in bytes (128, 64 or 32): the XOR permutes 2^B chunks of 2^M bytes
        in each row of that many bytes."""
        bits, base, _ = self.swizzle(tensor)
        return (1 << base) << bits

    def smem_layout(self, tensor: str = "K") -> str:
        """The layout `tma.tma_smem_layout` gives TMA and the descriptors, as the DSL prints it."""
        return self._t["smem"][self._check_tensor(tensor)]["layout"]

    def smem_byte(self, tensor: str, row: int, d: int, stage: int = 0,
                  swizzled: bool = True) -> int:
        """Byte offset of (row, d) of a Q tile or of stage `stage` of the K/V ring: the
        unswizzled element offset of the layout, in bytes, then its byte swizzle (skipped with
        swizzled=False, for comparison)."""
        table = self._t["smem"][self._check_tensor(tensor)]["elems"]
        index = (row, d) if tensor == "Q" else (row, d, stage)
        for name, value, limit in zip(("row", "d", "stage"), index, table.shape):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or not 0 <= value < limit:
                raise ValueError(f"{name} must be in [0, {limit}) for {tensor}, got {value!r}")
        if tensor == "Q" and stage:
            raise ValueError(f"Q has no ring stages, got stage={stage}")
        bits, base, shift = self.swizzle(tensor)
        byte = int(table[index]) * self.config.elem_bytes
        if not swizzled:
            return byte
        mask = ((1 << bits) - 1) << (base + shift)
        return byte ^ ((byte & mask) >> shift)

    def smem_chunk(self, tensor: str, row: int, d: int, stage: int = 0,
                   swizzled: bool = True) -> dict:
        """Where (row, d) lands: its byte, its 16-byte chunk of the tile and that chunk's bank
        group (which 4 of the 32 four-byte banks: a 128-byte line is 8 groups)."""
        byte = self.smem_byte(tensor, row, d, stage, swizzled)
        return dict(byte=byte, chunk=byte // 16, bank_group=(byte // 16) % 8)

    def stage_byte_offset(self, stage: int, tensor: str = "K") -> int:
        """Where stage `stage` of the K (or V) ring starts, in bytes from the ring's start."""
        if tensor not in ("K", "V"):
            raise ValueError(f"tensor must be 'K' or 'V', got {tensor!r}")
        return self.smem_byte(tensor, 0, 0, stage)

    def descriptor_steps(self, operand: str = "K") -> dict:
        """The wgmma descriptors' steps, in bytes, read off the DSL's descriptor fragments:
        'k_steps' (where each 16-wide k-step of the operand starts) and 'stages' (where each
        ring stage starts). operand: 'Q' (A of S), 'K' (B of S) or 'Vt' (B of P V)."""
        if operand not in ("Q", "K", "Vt"):
            raise ValueError(f"operand must be 'Q', 'K' or 'Vt', got {operand!r}")
        d = self._t["descriptors"][operand]
        return dict(layout=d["layout"], k_steps=[int(x) for x in d["k_steps"]],
                    stages=[int(x) for x in d["stages"]])

    @staticmethod
    def _check_tensor(tensor) -> str:
        if tensor not in TENSORS:
            raise ValueError(f"tensor must be one of 'Q', 'K', 'V', got {tensor!r}")
        return tensor

    pipeline_rounds = staticmethod(pipeline_rounds)

    def describe_lane(self, tid: int) -> str:
        """What consumer thread `tid` holds and whom it reduces with, in words."""
        p = self.place(tid)
        rows = self.s_rowcol(tid)
        queries = [q for q, _ in rows]
        o_dims = sorted({d for _, d in self.o_coords(tid)})
        group = self.reduce_group(tid)
        p0 = self.p_coords(tid, 0)
        return "\n".join([
            f"consumer thread {tid} (CTA thread {p['cta_thread']}, consumer warpgroup "
            f"{p['warpgroup']}, warp {p['warp']} of it, lane {p['lane']}): rows "
            f"{join_and(queries)}",
            f"  S accumulator: {len(self.s_coords(tid))} floats, keys {fmt_ranges(rows[0][1])}",
            f"  P (A of P V):  8 16-bit values per k-step x {self.k_steps}; k-step 0: "
            + " ".join(str(c) for c in p0),
            f"  O accumulator: {len(self.o_coords(tid))} floats, d {fmt_ranges(o_dims)}",
            f"  row max/sum:   shuffles XOR {join_and(self.reduce_offsets)} with lanes "
            f"{join_and(t % WARP_SIZE for t in group if t != tid)} (threads "
            f"{join_and(group)})",
        ])

    # ---- GQA packing (prefill, `Sm90Key.pack_gqa`) ----

    def packed_rows(self, group: int, seqlen_q: int, m_block: int = 0) -> list:
        """The wgmma kernel's GQA packing of query block `m_block` of a call of seqlen_q
        queries (`cute_fa.kernels.sched.seqlen.QueryRows`, the object the kernel uses): for each
        of the tile's block_m rows, a dict with the query and the head offset within the group
        it holds (None for a padding row past the seqlen_q * group rows, which TMA fills with
        zeros and leaves out of O's store), the consumer threads whose S accumulator holds that
        row and their warpgroup."""
        for name, value, low in (("group", group, 1), ("seqlen_q", seqlen_q, 1),
                                 ("m_block", m_block, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int of at least {low}, got {value!r}")
        return [dict(r, warpgroup=r["threads"][0] // wgmma.WARPGROUP_THREADS)
                for r in packed_row_owners(self, group, seqlen_q, m_block)]

    def describe_packing(self, group: int, seqlen_q: int, m_block: int = 0,
                         show: int = 6) -> str:
        """`packed_rows` in words: the first `show` rows, and the warpgroups that hold only
        padding (a call's last query block, where seqlen_q * group rows end inside it)."""
        table = self.packed_rows(group, seqlen_q, m_block)
        useful = [r for r in table if r["query"] is not None]
        first = m_block * self.config.block_m
        lines = [f"{group} query heads per K/V head, {seqlen_q} queries, query block {m_block} "
                 f"(packed rows {first}..{first + self.config.block_m - 1}): {len(useful)} of "
                 f"{self.config.block_m} rows hold a (query, head) pair"]
        for r in useful[:show]:
            lines.append(f"  row {r['row']:3d}: query {r['query']}, head h0+{r['head']}, "
                         f"threads {fmt_ranges(r['threads'])} (warpgroup {r['warpgroup']})")
        if len(useful) > show:
            lines.append(f"  ... {len(useful) - show} more rows")
        idle = sorted({r["warpgroup"] for r in table} - {r["warpgroup"] for r in useful})
        if idle:
            lines.append(f"  warpgroup{'' if len(idle) == 1 else 's'} {join_and(idle)}: padding "
                         f"rows only (zeros from TMA, not stored)")
        return "\n".join(lines)
