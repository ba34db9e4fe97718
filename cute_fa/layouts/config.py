"""The tile configuration every layout builder is parameterised by.

Pure Python (no CuTe import), so that validation is cheap and runs before any
tracing or compilation.
"""

from __future__ import annotations

from dataclasses import dataclass

MMA_M, MMA_N, MMA_K = 16, 8, 16  # SM80 mma.sync m16n8k16
WARP_SIZE = 32
COPY_BITS = 128  # one cp.async / ldmatrix row / vector store moves 16 bytes
MAX_HEAD_DIM = 256
SM90_SMEM_BYTES = 227 * 1024  # an sm90 CTA's shared memory at most (`arch.SMEM_BYTES`)

_DTYPE_ALIASES = {
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


def canonical_dtype(dtype) -> str:
    """'float16' or 'bfloat16' for a torch dtype, a cutlass type or a string."""
    name = getattr(dtype, "__name__", None) or str(dtype)
    name = name.replace("torch.", "").lower()
    if name in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[name]
    raise ValueError(f"dtype must be float16 or bfloat16, got {dtype!r}")


def _require_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return value


def check_head_dim(name: str, value) -> int:
    """A head_dim the kernels take: an int, a multiple of 8 in [8, 256]. `name` is the
    argument the value came from, for the message."""
    d = _require_int(name, value)
    if d <= 0 or d % 8 or d > MAX_HEAD_DIM:
        what = f"{name}: each head_dim" if name.endswith("s") else name
        raise ValueError(f"{what} must be a multiple of 8 in [8, {MAX_HEAD_DIM}], got {d}")
    return d


class HeadDimTiling:
    """What a tile of head_dim-wide rows in shared memory derives from its head_dim, dtype and
    thread count: the padded width, the swizzle atom and how threads split a row for 16-byte
    copies. Shared by the forward's `TileConfig` and the backward's `BwdTileConfig`, so that
    `layouts.smem` and `layouts.copies` build both kernels' tiles the same way."""

    @property
    def num_warps(self) -> int:
        return self.num_threads // WARP_SIZE

    @property
    def elem_bytes(self) -> int:
        return 2

    @property
    def head_dim_padded(self) -> int:
        """head_dim rounded up to 32: the width of the smem tiles.

        A multiple of the MMA K (16) that also allows a swizzle atom of at least
        64-byte rows. Columns past head_dim are zero-filled in smem and never stored.
        """
        return -(-self.head_dim // 32) * 32

    @property
    def vector_elems(self) -> int:
        """Elements in one 128-bit copy: 8 for fp16/bf16."""
        return COPY_BITS // (8 * self.elem_bytes)

    @property
    def smem_atom_cols(self) -> int:
        """Width of the swizzle atom: 64 elements (128-byte rows), or 32 (64-byte rows)."""
        return 64 if self.head_dim_padded % 64 == 0 else 32

    @property
    def swizzle_bits(self) -> int:
        """B of Swizzle<B,3,3>: log2 of the 16-byte chunks in one atom row."""
        return (self.smem_atom_cols // self.vector_elems).bit_length() - 1

    @property
    def copy_threads_per_row(self) -> int:
        return self.smem_atom_cols // self.vector_elems

    @property
    def copy_rows_per_pass(self) -> int:
        return self.num_threads // self.copy_threads_per_row


@dataclass(frozen=True)
class TileConfig(HeadDimTiling):
    """One CTA's tiling of the attention forward pass.

    head_dim:    D of Q/K/V, a multiple of 8 up to 256.
    block_m:     query rows per CTA (Br, kBlockM); warps split them along M.
    block_n:     key/value rows per round (Bc, kBlockN).
    num_threads: threads per CTA, a multiple of 32.
    dtype:       'float16' or 'bfloat16' (anything `canonical_dtype` accepts).
    warps_split_keys: the warps split each K/V tile's keys as well as the query rows (decode:
                 fewer rows than warps x 16): block_m / 16 slabs of 16 rows (`row_slabs`),
                 each shared by num_warps / row_slabs warps (`key_groups`), warp w taking slab
                 w // key_groups and keys (w % key_groups) * warp_keys ... of every K/V tile;
                 the warps' partial softmax results are combined at the end. `mma_tile` is
                 one warp's tile.
    wgmma:       the tile of the warp-specialized wgmma kernel (`layouts.wgmma`): num_threads
                 counts its consumer warpgroups' threads (64 query rows per warpgroup), and K/V
                 arrive by TMA, so block_n need not divide into copy passes.
    """

    head_dim: int = 64
    block_m: int = 64
    block_n: int = 64
    num_threads: int = 128
    dtype: str = "float16"
    warps_split_keys: bool = False
    wgmma: bool = False

    def __post_init__(self):
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        check_head_dim("head_dim", self.head_dim)
        nt = _require_int("num_threads", self.num_threads)
        if nt <= 0 or nt % WARP_SIZE or nt > 1024:
            raise ValueError(
                f"num_threads must be a positive multiple of {WARP_SIZE} up to 1024, got {nt}"
            )
        bm = _require_int("block_m", self.block_m)
        rows_per_mma_tile = MMA_M * self.num_warps
        if not isinstance(self.warps_split_keys, bool):
            raise TypeError(f"warps_split_keys must be a bool, got {self.warps_split_keys!r}")
        if self.warps_split_keys:
            if bm <= 0 or bm % MMA_M or self.num_warps % (bm // MMA_M) or bm == rows_per_mma_tile:
                raise ValueError(f"block_m must be 16 times a proper divisor of num_warps = "
                                 f"{self.num_warps} when the warps split the keys (each 16-row "
                                 f"slab shared by the same number of warps), got {bm}")
            keys = 16 * self.key_groups
            if _require_int("block_n", self.block_n) % keys:
                raise ValueError(f"block_n must be a multiple of 16 * {self.key_groups} warps "
                                 f"per slab = {keys} when the warps split the keys, got "
                                 f"{self.block_n}")
        elif bm <= 0 or bm % rows_per_mma_tile:
            raise ValueError(
                f"block_m must be a positive multiple of 16 * num_warps = {rows_per_mma_tile} "
                f"(warps split the query rows in 16-row MMA slabs), got {bm}"
            )
        bn = _require_int("block_n", self.block_n)
        if bn <= 0 or bn % 16:
            raise ValueError(
                f"block_n must be a positive multiple of 16 (the MMA K of P@V and "
                f"the N tile of Q@K^T), got {bn}"
            )
        rows = self.copy_rows_per_pass
        if rows > nt:
            raise ValueError(f"num_threads={nt} is too few for one copy pass")
        # threads copy Q and O tiles, and K/V tiles but in the wgmma kernel (TMA loads them)
        copied = (("block_m", bm),) if self.wgmma else (("block_m", bm), ("block_n", bn))
        for name, value in copied:
            if value % rows:
                raise ValueError(
                    f"{name} must be a multiple of {rows}: {nt} threads copy {rows} rows "
                    f"of a {self.head_dim_padded}-wide tile per pass, got {value}"
                )

    @property
    def row_slabs(self) -> int:
        """16-row slabs of the tile, each held by key_groups warps."""
        return self.block_m // MMA_M if self.warps_split_keys else self.num_warps

    @property
    def key_groups(self) -> int:
        """Warps that share one 16-row slab, each over its own keys (1: a warp sweeps them all)."""
        return self.num_warps // (self.block_m // MMA_M) if self.warps_split_keys else 1

    def warp_place(self, warp):
        """(slab, key group) of warp `warp`: its rows are slab * 16 ..., its keys key group *
        warp_keys ... of every K/V tile. Plain arithmetic: works on a kernel's warp index too."""
        return warp // self.key_groups, warp % self.key_groups

    @property
    def mma_tile(self) -> "TileConfig":
        """The tile the TiledMMA covers: the CTA's, or with warps_split_keys one warp's (16
        rows, warp_keys keys, 32 threads)."""
        if not self.warps_split_keys:
            return self
        return TileConfig(head_dim=self.head_dim, block_m=MMA_M,
                          block_n=self.block_n // self.key_groups, num_threads=WARP_SIZE,
                          dtype=self.dtype)

    @property
    def warp_keys(self) -> int:
        """Keys of each K/V tile one warp's MMAs read."""
        return self.mma_tile.block_n

    def smem_bytes(self, kv_stages: int = 1) -> int:
        """Shared memory of Q plus `kv_stages` K and V tiles (O reuses Q)."""
        q = self.block_m * self.head_dim_padded * self.elem_bytes
        return q + kv_stages * self.smem_bytes_kv_stage()

    def smem_bytes_kv_stage(self) -> int:
        """One K tile and one V tile."""
        return 2 * self.block_n * self.head_dim_padded * self.elem_bytes


@dataclass(frozen=True)
class BwdTileConfig(HeadDimTiling):
    """One CTA's tiling of the attention backward pass (`kernels/bwd/sm80.py`).

    A CTA owns block_n keys of one K/V head: K and V stay in shared memory while Q, dO (and
    their LSE and D rows) stream through in block_m-row tiles, q_stages of them in flight.
    Three TiledMMAs share the CTA's warps, each with its own warp grid (warps along M x N):
    warps_sdp for S = Q K^T and dP = dO V^T (block_m x block_n), warps_dkv for dV += P^T dO and
    dK += dS^T Q (block_n x head_dim), warps_dq for dQ = dS K (block_m x head_dim). A warp
    grid (a, b) tiles its product in (16 a) x (16 b) steps.
    """

    head_dim: int = 64
    block_m: int = 64
    block_n: int = 128
    num_threads: int = 256
    dtype: str = "float16"
    warps_sdp: tuple = (2, 4)
    warps_dkv: tuple = (4, 2)
    warps_dq: tuple = (4, 2)
    q_stages: int = 2

    def __post_init__(self):
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        check_head_dim("head_dim", self.head_dim)
        nt = _require_int("num_threads", self.num_threads)
        if nt <= 0 or nt % WARP_SIZE or nt > 1024:
            raise ValueError(f"num_threads must be a positive multiple of {WARP_SIZE} up to "
                             f"1024, got {nt}")
        if self.q_stages not in (1, 2):
            raise ValueError(f"q_stages must be 1 or 2, got {self.q_stages!r}")
        dp = self.head_dim_padded
        for name, warps, (m, n) in (("warps_sdp", self.warps_sdp, (self.block_m, self.block_n)),
                                    ("warps_dkv", self.warps_dkv, (self.block_n, dp)),
                                    ("warps_dq", self.warps_dq, (self.block_m, dp))):
            if (not isinstance(warps, tuple) or len(warps) != 2
                    or warps[0] * warps[1] != self.num_warps):
                raise ValueError(f"{name} must be a pair (warps along M, along N) whose product "
                                 f"is num_warps = {self.num_warps}, got {warps!r}")
            if m % (MMA_M * warps[0]) or n % (2 * MMA_N * warps[1]):
                raise ValueError(f"{name} = {warps} does not tile the {m} x {n} product in "
                                 f"({MMA_M * warps[0]} x {2 * MMA_N * warps[1]}) steps")
        for name, rows in (("block_m", self.block_m), ("block_n", self.block_n)):
            if _require_int(name, rows) % self.copy_rows_per_pass:
                raise ValueError(f"{name} must be a multiple of {self.copy_rows_per_pass}: {nt} "
                                 f"threads copy that many rows of a {dp}-wide tile per pass, "
                                 f"got {rows}")
        if self.block_n % 32:
            raise ValueError(f"block_n must be a multiple of 32 (the P and dS tiles' swizzle "
                             f"atom), got {self.block_n}")

    @property
    def ps_atom_cols(self) -> int:
        """Width of the P and dS tiles' swizzle atom (their rows are block_n wide)."""
        return 64 if self.block_n % 64 == 0 else 32

    @property
    def q_rows(self) -> "RowTile":
        """The query block's rows as dQ's conversion stores them."""
        return RowTile(self.head_dim, self.block_m, self.num_threads, self.dtype)

    @property
    def kv_rows(self) -> "RowTile":
        """The key block's rows as the dK/dV stores walk them."""
        return RowTile(self.head_dim, self.block_n, self.num_threads, self.dtype)

    def smem_bytes(self) -> int:
        """Q and dO (q_stages each), K, V, P and dS, each tile 1024-byte aligned."""
        dp, e = self.head_dim_padded, self.elem_bytes
        return (2 * self.q_stages * self.block_m * dp + 2 * self.block_n * dp
                + 2 * self.block_m * self.block_n) * e


@dataclass(frozen=True)
class WgmmaBwdTileConfig(HeadDimTiling):
    """One CTA's tiling of the Hopper backward (`kernels/bwd/sm90.py`, `layouts.bwd_wgmma`).

    A CTA owns block_n keys of one K/V head, 64 per consumer warpgroup (`consumers` of them):
    the transposed scores S^T = K Q^T put the keys on wgmma's M, so each warpgroup's P^T and
    dS^T are already the register A operands of dV += P^T dO and dK += dS^T Q. Q, dO and their
    LSE and D rows stream through a ring of q_stages block_m-row stages, loaded by TMA.
    num_threads counts the consumer threads (the producer warpgroup comes on top).
    ctas_per_sm: how many of these CTAs share an SM (2: one consumer warpgroup each, with half
    the register file: `layouts.wgmma.WarpRoles`).
    split_d (head_dim past 128, where dK and dV of 64 keys over all of d do not fit one
    thread's registers): the two consumer warpgroups share one block of 64 keys and split d
    instead, each holding dK and dV of its half of the columns; S^T and dP^T split the queries
    between them, so P^T goes through shared memory too, and dV and dK read P^T and dS^T from
    there (SS-wgmma).
    dq_writer: the consumers leave each query block's dQ (float32, in the order of its sums in
    dQaccum) in shared memory, and warp 2 of the producer warpgroup adds it into dQaccum with
    one bulk reduction (cp.reduce.async.bulk), waiting for the deterministic mode's turn there,
    off the consumers' path; without it the consumers add dQ from registers and wait for the
    turn themselves.
    atom_cols: the width of the swizzle atom of the Q, dO, K and V tiles, 64 elements
    (128-byte rows) or, under split_d only, 32 (64-byte rows). Each warpgroup's half of d must
    start on an atom of the MN-major operands dO^T, Q^T and K^T, so split_d pads head_dim to
    2 x atom_cols: with 32, head_dim 192 runs unpadded (96 columns each) instead of as 256.
    block_m past the multiples of 64 (80: more work per query block for the same fixed costs
    of a step, the barriers, waits and dQ's hand-over) cannot put dQ's queries on wgmma's M:
    such a tile computes dQ transposed (`dq_transposed`).
    dv_after_ds: dV += P^T dO is issued once dS is formed and stored, not before dS's
    arithmetic (which it would run under). P^T's copy in the input dtype is converted in the
    S^T registers either way; issued early, dV's in-flight operands sit beside S^T, dP^T, dK
    and dV while dS is formed, and ptxas serializes every wgmma (C7512) where that is more
    than the register file holds: 80 queries at head_dim 128, or 128 at 64 in two
    warpgroups. Split-d tiles take P^T from shared memory: early only.
    dq_before_dk: dQ's product is issued before dK's, so that dQ is handed over (to the writer
    warp, or added into dQaccum) while dK still runs, and the step's Q/dO stage is released
    once dK is done; without it both are waited for first."""

    head_dim: int = 128
    block_m: int = 64
    consumers: int = 2
    dtype: str = "float16"
    q_stages: int = 2
    ctas_per_sm: int = 1
    split_d: bool = False
    dq_writer: bool = False
    atom_cols: int = 64
    dv_after_ds: bool = False
    dq_before_dk: bool = False

    def __post_init__(self):
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        check_head_dim("head_dim", self.head_dim)
        for name in ("split_d", "dq_writer", "dv_after_ds", "dq_before_dk"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.atom_cols not in (32, 64):
            raise ValueError(f"atom_cols must be 32 or 64, got {self.atom_cols!r}")
        if self.atom_cols == 32 and not self.split_d:
            raise ValueError("atom_cols=32 (64-byte swizzle atoms) is for split_d tiles, whose "
                             "warpgroups split d; got split_d=False")
        if self.dq_writer and self.smem_bytes() > SM90_SMEM_BYTES:
            raise ValueError(f"dq_writer's float32 dQ block ({self.block_m} x "
                             f"{self.head_dim_padded}) does not fit: {self.smem_bytes()} bytes "
                             f"of shared memory, sm90 has {SM90_SMEM_BYTES}")
        if self.split_d and (self.consumers != 2 or self.ctas_per_sm != 1):
            raise ValueError(f"split_d splits d between two consumer warpgroups of one CTA per "
                             f"SM, got consumers={self.consumers}, "
                             f"ctas_per_sm={self.ctas_per_sm}")
        if _require_int("consumers", self.consumers) not in (1, 2):
            raise ValueError(f"consumers must be 1 or 2 warpgroups, got {self.consumers}")
        bm = _require_int("block_m", self.block_m)
        if bm % 16 or not 16 <= bm <= 256:
            raise ValueError(f"block_m must be a multiple of 16 in [16, 256] (the k of dV += "
                             f"P^T dO and the N of S^T), got {bm}")
        if _require_int("q_stages", self.q_stages) not in (2, 3):
            raise ValueError(f"q_stages must be 2 or 3, got {self.q_stages}")
        if _require_int("ctas_per_sm", self.ctas_per_sm) not in (1, 2):
            raise ValueError(f"ctas_per_sm must be 1 or 2, got {self.ctas_per_sm}")
        if self.ctas_per_sm == 2 and self.consumers != 1:
            raise ValueError(f"two CTAs per SM hold one consumer warpgroup each (half the "
                             f"register file), got consumers={self.consumers}")
        if self.split_d and self.block_m % 32:
            raise ValueError(f"split_d halves block_m between the warpgroups' S^T (a multiple of "
                             f"16 each), got block_m={self.block_m}")
        for name in ("dv_after_ds", "dq_before_dk"):
            if getattr(self, name) and self.split_d:
                raise ValueError(f"{name} orders the register A operands of dV and dK; split_d "
                                 f"tiles read P^T and dS^T from shared memory")
        if self.dq_transposed and (self.split_d or self.head_dim_padded != 64 * self.consumers):
            raise ValueError(f"block_m={bm}, not a multiple of 64, computes dQ^T with d on "
                             f"wgmma's M, 64 columns per consumer warpgroup: it needs "
                             f"head_dim_padded = 64 x consumers ({64 * self.consumers}) and no "
                             f"split_d, got head_dim_padded={self.head_dim_padded}, "
                             f"split_d={self.split_d}")

    @property
    def dq_transposed(self) -> bool:
        """dQ is computed as dQ^T = K^T dS^T (d on wgmma's M, 64 per consumer warpgroup; the
        queries on N) where block_m is not a multiple of 64, wgmma's M; else dQ = dS K."""
        return self.block_m % 64 != 0

    @property
    def d_pad(self) -> int:
        """head_dim_padded's multiple: 64 (whole 128-byte rows), and under split_d twice the
        atom, so that each warpgroup's half of d (its columns of dQ, dK and dV) is whole
        swizzle atoms of the MN-major operands K^T, dO^T and Q^T."""
        return self.atom_cols * self.consumers if self.split_d else 64

    @property
    def smem_atom_cols(self) -> int:
        return self.atom_cols

    @property
    def head_dim_padded(self) -> int:
        """head_dim rounded up to d_pad."""
        return -(-self.head_dim // self.d_pad) * self.d_pad

    @property
    def block_n(self) -> int:
        return 64 if self.split_d else 64 * self.consumers

    @property
    def num_threads(self) -> int:
        return 128 * self.consumers

    @property
    def q_rows(self) -> "RowTile":
        """The query block's rows as dQ's conversion stores them: by all the consumer threads,
        or where block_m is not a multiple of 64 by the first 128 (80 rows are five passes of
        their 16-byte stores; 256 threads would make two and a half)."""
        threads = self.num_threads if self.block_m % 64 == 0 else 128
        return RowTile(self.head_dim, self.block_m, threads, self.dtype, pad=self.d_pad,
                       atom_cols=self.smem_atom_cols)

    @property
    def kv_rows(self) -> "RowTile":
        """The key block's rows as the dK/dV stores walk them."""
        return RowTile(self.head_dim, self.block_n, self.num_threads, self.dtype,
                       pad=self.d_pad, atom_cols=self.smem_atom_cols)

    def smem_bytes(self) -> int:
        """K, V, q_stages of Q and dO, dS (and P under split_d), the LSE/D rows of each stage,
        dQ's float32 block under dq_writer and the mbarriers, each tile 1024-byte aligned."""
        dp, e = self.head_dim_padded, self.elem_bytes
        score_tiles = 2 if self.split_d else 1
        dq_stage = 4 * self.block_m * dp if self.dq_writer else 0
        return ((2 * self.block_n * dp + 2 * self.q_stages * self.block_m * dp
                 + score_tiles * self.block_m * self.block_n) * e
                + 2 * 4 * self.q_stages * self.block_m + dq_stage + 1024)


@dataclass(frozen=True)
class RowTile(HeadDimTiling):
    """block_m rows of a head_dim-wide tensor that num_threads threads copy 16 bytes at a time:
    what the backward's row-wise kernels (D = rowsum(dO * O), dQ's conversion) and its dK/dV
    stores (`kernels.epilogue.store_O`, block_m = the key block) walk."""

    head_dim: int
    block_m: int
    num_threads: int
    dtype: str = "float16"
    pad: int = 32  # head_dim_padded's multiple: the tile's whose rows these are
    atom_cols: int = 0  # the swizzle atom's width where the tile's differs (0: derived)

    def __post_init__(self):
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        check_head_dim("head_dim", self.head_dim)
        if self.pad not in (32, 64, 128):
            raise ValueError(f"pad must be 32, 64 or 128, got {self.pad}")
        if self.atom_cols not in (0, 32, 64):
            raise ValueError(f"atom_cols must be 0, 32 or 64, got {self.atom_cols}")
        if self.block_m % self.copy_rows_per_pass:
            raise ValueError(f"block_m must be a multiple of {self.copy_rows_per_pass} rows per "
                             f"copy pass, got {self.block_m}")

    @property
    def head_dim_padded(self) -> int:
        return -(-self.head_dim // self.pad) * self.pad

    @property
    def smem_atom_cols(self) -> int:
        return self.atom_cols or super().smem_atom_cols


def dq_accum_blocks(max_seqlen_q: int, block_m: int, ragged_rows: int = 0,
                    entries: int = 0) -> int:
    """Query blocks the backward's dQaccum holds per head: ceil(seqlen_q / block_m), or for a
    ragged batch of `entries` sequences over ragged_rows rows, total // block_m + entries
    (`bwd.dq_block` places each entry's blocks by the same rule). Here, not in `bwd`, because
    the host sizes the buffer without the DSL."""
    if entries:
        return ragged_rows // block_m + entries
    return -(-max_seqlen_q // block_m)
