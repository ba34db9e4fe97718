"""Pictures of the layouts, drawn from `FlashLayouts` (matplotlib, imported lazily).

* `ownership_grid`: which thread holds each element of an operand tile.
* `swizzle_bank_map`: where each 16-byte chunk of a tile lands among the 8
  bank groups of a 128-byte shared-memory line, with and without the swizzle.
* `copy_map`: which thread copies each 16-byte chunk gmem->smem.
* `tma_box_map`: which TMA box wrote each chunk of a K ring stage, and its bank group.
* `ring_timeline`: the K/V tiles in flight in the TMA kernel's ring, round by round.
* `packed_rows_map`: decode's GQA packing: which (query, head) pair each tile row holds, and
  which warp holds it.
* `warpgroup_owner_map`, `wgmma_lane_grid`, `smem_chunk_map`: the wgmma kernel's S tile of one
  consumer warpgroup by warp and lane, a corner of it by thread and register, and the bank
  groups of a K tile's chunks (from `WgmmaLayouts`).
* `p_exchange_warps`, `p_thread_map`, `ldmatrix_bank_map`: the backward's P tile by the warps
  that store and read it, the P elements one thread reads by who stored them, and the bank
  groups of one ldmatrix.x4 (from `BwdLayouts`).
* `block_mask_map`: a block mask's key blocks per query block, full, partial or skipped
  (`cute_fa.mods.block_mask`).
"""

from __future__ import annotations

import numpy as np

from ..layouts.config import WARP_SIZE
from .bwd import OPERAND_TILES
from .introspect import fmt_ranges

_OPERANDS = {
    # name: (table, shape(config) -> (rows, cols), axis labels)
    "S": ("S", lambda c: (c.block_m, c.block_n), ("query", "key")),
    "O": ("O", lambda c: (c.block_m, c.head_dim_padded), ("query", "d")),
    "Q": ("Q", lambda c: (c.block_m, c.head_dim_padded), ("query", "d")),
    "K": ("K", lambda c: (c.block_n, c.head_dim_padded), ("key", "d")),
    "V": ("V", lambda c: (c.block_n, c.head_dim_padded), ("key", "d")),
}


def owner_map(layouts, operand: str = "S", warp: int | None = None):
    """(owner, slot) arrays over the operand tile; -1 where nobody (of `warp`) holds it.

    K and V fragments are held by every warp (each warp needs all keys): pass
    `warp` to pick one; Q, S and O are split between warps.
    """
    if operand not in _OPERANDS:
        raise ValueError(f"operand must be one of {sorted(_OPERANDS)}, got {operand!r}")
    table, shape_fn, _ = _OPERANDS[operand]
    cfg = layouts.config
    coords = layouts._t["tables"][table]
    if warp is None and operand in ("K", "V"):
        warp = 0
    owner = np.full(shape_fn(cfg), -1, dtype=np.int64)
    slot = np.full(shape_fn(cfg), -1, dtype=np.int64)
    for tid in range(cfg.num_threads):
        if warp is not None and tid // WARP_SIZE != warp:
            continue
        for i, (r, c) in enumerate(coords[tid]):
            owner[r, c] = tid
            slot[r, c] = i
    return owner, slot


def ownership_grid(layouts, operand: str = "S", rows=(0, 16), cols=(0, 8), warp=None,
                   annotate: bool | None = None, ax=None):
    """Colour each element of `operand` by the lane that holds it; label it 'T<tid>' / 'v<slot>'."""
    import matplotlib.pyplot as plt

    owner, slot = owner_map(layouts, operand, warp)
    r0, r1 = rows
    c0, c1 = cols
    owner, slot = owner[r0:r1, c0:c1], slot[r0:r1, c0:c1]
    if annotate is None:
        annotate = owner.size <= 256
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4, 0.55 * (c1 - c0) + 1), max(3, 0.45 * (r1 - r0) + 1)))
    lane = np.where(owner >= 0, owner % WARP_SIZE, np.nan)
    ax.imshow(lane, cmap="tab20", vmin=0, vmax=WARP_SIZE - 1, interpolation="nearest",
              extent=(c0 - 0.5, c1 - 0.5, r1 - 0.5, r0 - 0.5))
    if annotate:
        for (i, j), t in np.ndenumerate(owner):
            if t >= 0:
                ax.text(c0 + j, r0 + i, f"T{t}\nv{slot[i, j]}", ha="center", va="center",
                        fontsize=6)
    _, _, labels = _OPERANDS[operand]
    ax.set_ylabel(labels[0])
    ax.set_xlabel(labels[1])
    ax.set_title(f"{operand}: owner thread (colour = lane)" + (" and register slot" if annotate else ""))
    return ax


def _numbered_grid(ax, colours, numbers, fontsize, xlabel, ylabel, title, **imshow):
    """Colour each cell by `colours` and write its entry of `numbers` in it."""
    ax.imshow(colours, interpolation="nearest", **imshow)
    for (i, j), n in np.ndenumerate(numbers):
        ax.text(j, i, str(n), ha="center", va="center", fontsize=fontsize)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return ax


def bank_group(offset_elems, elem_bytes: int = 2):
    """Which 16-byte quarter-bank group (0..7) of a 128-byte line an element offset falls in."""
    return (np.asarray(offset_elems) * elem_bytes // 16) % 8


def swizzle_bank_map(layouts, tensor: str = "Q", rows: int = 8, ax=None):
    """Bank group of every 16-byte chunk of the first `rows` rows, unswizzled vs swizzled."""
    import matplotlib.pyplot as plt

    cfg = layouts.config
    table = layouts.swizzle_table(tensor)[:rows]
    chunks = table[:, :: cfg.vector_elems]
    plain = np.arange(table.shape[1])[None, :: cfg.vector_elems] + 0 * chunks
    swz = bank_group(chunks, cfg.elem_bytes)
    raw = bank_group(plain, cfg.elem_bytes)
    if ax is None:
        _, ax = plt.subplots(1, 2, figsize=(2 + 0.5 * chunks.shape[1] * 2, 1 + 0.45 * rows))
    for a, groups, title in ((ax[0], raw, "row-major"), (ax[1], swz, "swizzled")):
        _numbered_grid(a, groups, groups, 8,
                       f"16-byte chunk (columns {cfg.vector_elems}j..{cfg.vector_elems}j+"
                       f"{cfg.vector_elems - 1})", "row", f"{tensor}: bank group, {title}",
                       cmap="tab10", vmin=0, vmax=9)
    return ax


def copy_map(layouts, tensor: str = "Q", rows=None, ax=None):
    """The thread that copies each 16-byte chunk of a Q/K/V tile gmem->smem."""
    import matplotlib.pyplot as plt

    cfg = layouts.config
    n_rows = cfg.block_m if tensor == "Q" else cfg.block_n
    rows = rows or n_rows
    grid = np.full((rows, cfg.head_dim_padded // cfg.vector_elems), -1)
    for tid in range(cfg.num_threads):
        for r, c in layouts.copy_coords(tid, tensor):
            if r < rows:
                grid[r, c // cfg.vector_elems] = tid
    if ax is None:
        _, ax = plt.subplots(figsize=(1 + 0.6 * grid.shape[1], 1 + 0.25 * rows))
    return _numbered_grid(ax, grid % 20, grid, 6,
                          f"16-byte chunk of the row ({cfg.vector_elems} elements)", "row",
                          f"{tensor}: cp.async thread of each chunk", cmap="tab20",
                          aspect="auto")


def tma_box_map(layouts, stage: int = 0, rows: int = 16, ax=None):
    """K tile of one ring stage: which TMA box wrote each 16-byte chunk, and its bank group."""
    import matplotlib.pyplot as plt

    cfg = layouts.config
    box = layouts.tma_box("K")
    n_chunks = cfg.head_dim_padded // cfg.vector_elems
    boxes = np.array([[c * cfg.vector_elems // box.cols for c in range(n_chunks)]] * rows)
    groups = np.array([[bank_group(layouts.ring_offset("K", r, c * cfg.vector_elems, stage),
                                   cfg.elem_bytes) for c in range(n_chunks)] for r in range(rows)])
    if ax is None:
        _, ax = plt.subplots(figsize=(1 + 0.55 * n_chunks, 1 + 0.3 * rows))
    return _numbered_grid(ax, boxes, groups, 7,
                          f"16-byte chunk of the row (colour: TMA box, {box.cols} columns each)",
                          "key row", f"K, ring stage {stage}: bank group of each chunk "
                          f"({box.swizzle_bytes}-byte swizzle)",
                          cmap="Pastel1", vmin=0, vmax=8, aspect="auto")


def ring_timeline(rounds, stages: int, ax=None):
    """Each K/V tile from the TMA command that starts it to the round that waits for it."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(1.5 + 1.1 * len(rounds), 0.8 + 0.6 * stages))
    for r in rounds:
        issued = r["round"] - stages + 0.9 if r["round"] >= stages else -0.6
        ax.barh(r["stage"], r["round"] + 0.45 - issued, left=issued, height=0.5, alpha=0.6,
                color=f"C{r['key_block'] % 10}")
        ax.text(r["round"] + 0.4, r["stage"], f"block {r['key_block']}\nphase {r['wait_phase']}",
                ha="right", va="center", fontsize=7)
    ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
    ax.set_xticks(range(len(rounds)), [f"round {r['round']}" for r in rounds])
    ax.set_xlim(-0.7, len(rounds) - 0.3)
    ax.invert_yaxis()
    ax.set_title("K/V tiles in flight: issued (left end) ... waited for (right end)")
    return ax


def packed_rows_map(layouts, group: int, seqlen_q: int = 1, ax=None):
    """Decode's GQA packing (`FlashLayouts.packed_rows`): the tile's S, (row, key), coloured by
    the warp whose accumulator holds it (bands of rows on a tile of 16-row slabs per warp,
    columns of keys where the warps split the keys), each row labelled with its (query, head)
    pair; padding rows grey."""
    import matplotlib
    import matplotlib.pyplot as plt

    cfg = layouts.config
    table = layouts.packed_rows(group, seqlen_q)
    if ax is None:
        _, ax = plt.subplots(figsize=(3.2, 0.16 * len(table) + 1))
    colours = np.full((cfg.block_m, cfg.block_n), np.nan)
    for tid in range(cfg.num_threads):
        for query, key in layouts.s_coords(tid):
            if table[query]["query"] is not None:
                colours[query, key] = tid // WARP_SIZE
    cmap = matplotlib.colormaps["tab10"].with_extremes(bad="0.88")  # padding rows grey
    ax.imshow(np.ma.masked_invalid(colours), cmap=cmap, vmin=0, vmax=9,
              interpolation="nearest", aspect="auto")
    for r in table:
        if r["query"] is None:
            label = f"padding (warp {fmt_ranges(r['warps'])})"
        elif len(r["warps"]) == 1:
            label = f"q{r['query']} h0+{r['head']}  T{r['threads'][0]}..{r['threads'][-1]}"
        else:
            label = f"q{r['query']} h0+{r['head']}"
        ax.text((cfg.block_n - 1) / 2, r["row"], label, ha="center", va="center", fontsize=6)
    ax.set_xlabel("key of the K/V tile")
    ax.set_ylabel("tile row")
    useful = sum(r["query"] is not None for r in table)
    ax.set_title(f"group {group}, Sq {seqlen_q}: {useful} of {len(table)} rows useful\n"
                 f"(colour = warp holding S[row, key])", fontsize=8)
    return ax


def warpgroup_owner_map(wl, warpgroup: int = 0, ax=None):
    """The 64 x block_n S tile of one consumer warpgroup (`WgmmaLayouts`): hue = warp of the
    warpgroup, shade = lane, so each warp's 16-row band and each quad's column pairs show."""
    import matplotlib
    import matplotlib.pyplot as plt

    cfg = wl.config
    grid = np.full((64, cfg.block_n), -1)
    for t in range(128 * warpgroup, 128 * (warpgroup + 1)):
        for r, c in wl.s_coords(t):
            grid[r - 64 * warpgroup, c] = t % 128  # warp * 32 + lane
    shades = np.linspace(0.35, 0.95, WARP_SIZE)
    colours = np.concatenate([matplotlib.colormaps[name](shades)
                              for name in ("Blues", "Oranges", "Greens", "Purples")])
    if ax is None:
        _, ax = plt.subplots(figsize=(1.5 + 0.06 * cfg.block_n, 4.2))
    ax.imshow(grid, cmap=matplotlib.colors.ListedColormap(colours), vmin=0, vmax=127,
              interpolation="nearest", aspect="auto")
    for w in range(4):
        ax.text(cfg.block_n + 1, 16 * w + 7.5, f"warp {w}", va="center", fontsize=8)
    ax.set_xlabel("key of the K tile")
    ax.set_ylabel(f"row (tile row {64 * warpgroup} + ...)")
    ax.set_title(f"S of consumer warpgroup {warpgroup}: colour = warp, shade = lane", fontsize=9)
    return ax


def wgmma_lane_grid(wl, rows=(0, 16), cols=(0, 16), ax=None):
    """A corner of the S tile: which consumer thread holds each element, in which register."""
    import matplotlib.pyplot as plt

    (r0, r1), (c0, c1) = rows, cols
    owner = np.full((r1 - r0, c1 - c0), -1)
    slot = np.full_like(owner, -1)
    for t in range(wl.config.num_threads):
        for v, (r, c) in enumerate(wl.s_coords(t)):
            if r0 <= r < r1 and c0 <= c < c1:
                owner[r - r0, c - c0], slot[r - r0, c - c0] = t, v
    if ax is None:
        _, ax = plt.subplots(figsize=(0.5 * (c1 - c0) + 1, 0.42 * (r1 - r0) + 1))
    ax.imshow(owner % WARP_SIZE, cmap="tab20", vmin=0, vmax=WARP_SIZE - 1,
              interpolation="nearest", extent=(c0 - 0.5, c1 - 0.5, r1 - 0.5, r0 - 0.5))
    for (i, j), t in np.ndenumerate(owner):
        ax.text(c0 + j, r0 + i, f"T{t}\nv{slot[i, j]}", ha="center", va="center", fontsize=5.5)
    ax.set_xlabel("key")
    ax.set_ylabel("row")
    ax.set_title("S: consumer thread (colour = lane) and register v", fontsize=9)
    return ax


def smem_chunk_map(wl, tensor: str = "K", rows: int = 8, ax=None):
    """Bank group of every 16-byte chunk of the first `rows` rows of a Q/K/V tile
    (`WgmmaLayouts.smem_chunk`), without and with the swizzle TMA and the descriptors use."""
    import matplotlib.pyplot as plt

    cfg = wl.config
    width = cfg.head_dim_padded
    step = 16 // cfg.elem_bytes  # elements per 16-byte chunk
    maps = [np.array([[wl.smem_chunk(tensor, r, d, swizzled=sw)["bank_group"]
                       for d in range(0, width, step)] for r in range(rows)])
            for sw in (False, True)]
    if ax is None:
        _, ax = plt.subplots(2, 1, figsize=(1 + 0.42 * maps[0].shape[1], 2 * (0.4 * rows + 1)))
    titles = ("without swizzle", f"{wl.swizzle_bytes(tensor)}-byte swizzle "
              f"Swizzle<{','.join(map(str, wl.swizzle(tensor)))}> on bytes")
    for a, groups, title in zip(ax, maps, titles):
        _numbered_grid(a, groups, groups, 8, f"16-byte chunk of the row (d {step}j..{step}j+"
                       f"{step - 1})", "row", f"{tensor}: bank group, {title}",
                       cmap="tab10", vmin=0, vmax=9, aspect="auto")
    return ax


def _warp_colours(n_warps: int):
    """A colour map of n_warps * 32 entries: hue = warp, shade = lane."""
    import matplotlib

    names = ("Blues", "Oranges", "Greens", "Purples", "Reds", "Greys", "YlOrBr", "BuGn")
    shades = np.linspace(0.35, 0.95, WARP_SIZE)
    return matplotlib.colors.ListedColormap(np.concatenate(
        [matplotlib.colormaps[names[w % len(names)]](shades) for w in range(n_warps)]))


def p_exchange_warps(bl, product: str = "dkv", axes=None):
    """The backward's P tile (query, key) twice (`BwdLayouts.p_owners`): coloured by the thread
    that stored each element (its S accumulator), and by the first thread whose A fragment of
    `product` reads it; hue = warp, shade = lane. Each 8 x 8 block is labelled with its warps
    (every reader's, where several warps read it)."""
    import matplotlib.pyplot as plt

    cfg = bl.config
    owners = bl.p_owners(product)
    writer, readers = owners["writer"], owners["readers"]
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(2 + 0.1 * cfg.block_n, 1.5 + 0.06 * cfg.block_m))
    cmap = _warp_colours(cfg.num_warps)
    what = "dV += P^T dO" if product == "dkv" else "dQ = dS K"
    for ax, grid, title in ((axes[0], writer[..., None], "stored by (S = Q K^T's accumulator)"),
                            (axes[1], readers, f"read by (A of {what})")):
        ax.imshow(grid[..., 0], cmap=cmap, vmin=0, vmax=cfg.num_threads - 1,
                  interpolation="nearest", aspect="auto")
        for r in range(0, cfg.block_m, 8):
            for c in range(0, cfg.block_n, 8):
                warps = sorted({int(t) // WARP_SIZE for t in grid[r:r + 8, c:c + 8].ravel()})
                ax.text(c + 3.5, r + 3.5, ",".join(map(str, warps)), ha="center", va="center",
                        fontsize=6)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        ax.set_title(f"P: {title}\ncolour = warp, shade = lane; labels: warps", fontsize=9)
    return axes


def p_thread_map(bl, tid: int, product: str = "dkv", ax=None):
    """The P tile (query, key) as thread `tid` sees it in the backward: the elements its A
    fragments of `product` read, coloured by the thread that stored each (its own first), and
    dots on the elements it stored itself."""
    import matplotlib
    import matplotlib.pyplot as plt

    cfg = bl.config
    writers = list(bl.writers(tid, product))
    writers.sort(key=lambda w: w != tid)
    index = {w: i for i, w in enumerate(writers)}
    grid = np.full((cfg.block_m, cfg.block_n), np.nan)
    writer = bl.p_owners(product)["writer"]
    for q, k in bl.p_read(tid, product):
        grid[q, k] = index[int(writer[q, k])]
    if ax is None:
        _, ax = plt.subplots(figsize=(2 + 0.1 * cfg.block_n, 1 + 0.1 * cfg.block_m))
    cmap = matplotlib.colormaps["tab10"].with_extremes(bad="0.93")
    ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=9, interpolation="nearest",
              aspect="auto")
    own = bl.p_written(tid)
    ax.scatter([k for _, k in own], [q for q, _ in own], s=6, c="k", marker="o")
    handles = [matplotlib.patches.Patch(color=cmap(i), label=f"T{w}" + (" (itself)" if w == tid
                                                                       else ""))
               for w, i in index.items()]
    ax.legend(handles=handles, title="stored by", fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1))
    own_n, needed = bl.own_share(tid, product)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(f"thread {tid}: the {needed} P elements it reads ({own_n} its own), coloured by "
                 f"who stored them; dots: the {len(own)} it stored", fontsize=9)
    return ax


def ldmatrix_bank_map(bl, product: str = "dkv", operand: str = "A", warp: int = 0,
                      copy: int = 0, axes=None):
    """One ldmatrix.x4 of a backward operand (`BwdLayouts.ldmatrix_phases`): per phase (one
    8x8 matrix) the bank group of each lane's 16-byte row, without and with the swizzle; a
    phase is conflict-free when its row holds 8 different numbers."""
    import matplotlib.pyplot as plt

    tile, transposed = OPERAND_TILES[product, operand]
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(13, 2.6))
    for ax, swizzled in zip(axes, (False, True)):
        phases = bl.ldmatrix_phases(product, operand, warp, copy, swizzled=swizzled)
        groups = np.array([[r["bank_group"] for r in ph] for ph in phases])
        _numbered_grid(ax, groups, groups, 8, "lane of the phase (lane = 8 x phase + column)",
                       "", f"{tile} tile, ldmatrix{'.trans' if transposed else ''} {copy} of warp "
                       f"{warp}, {'swizzled' if swizzled else 'without the swizzle'}: bank group "
                       f"of each row", cmap="tab10", vmin=0, vmax=9, aspect="auto")
        labels = []
        for ph in phases:
            tiles = [r["tile"] for r in ph]
            labels.append(f"matrix {len(labels)}: rows {fmt_ranges(r for r, _ in tiles)}, "
                          f"cols {tiles[0][1]}..{tiles[0][1] + 7}")
        ax.set_yticks(range(len(phases)), labels, fontsize=7)
    return axes


BLOCK_KINDS = ("skipped", "partial", "full")


def block_mask_codes(mask, b: int = 0, h: int = 0) -> np.ndarray:
    """(query blocks, key blocks) of a `cute_fa.mods.block_mask.BlockMask` at batch entry `b`
    and head `h`: 0 skipped, 1 partial (the mask_mod evaluated per score), 2 full."""
    codes = np.zeros(tuple(mask.kv_indices.shape[2:]), dtype=np.int8)
    for kind, counts, indices in ((1, mask.kv_num_blocks, mask.kv_indices),
                                  (2, mask.full_kv_num_blocks, mask.full_kv_indices)):
        for m in range(codes.shape[0]):
            n = int(counts[b, h, m])
            codes[m, indices[b, h, m, :n].long().numpy()] = kind
    return codes


def block_mask_map(mask, b: int = 0, h: int = 0, ax=None):
    """`block_mask_codes` as a grid: which key blocks each query block's CTA visits whole
    (full), evaluating the mask_mod (partial), or not at all (skipped)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    codes = block_mask_codes(mask, b, h)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.3 * codes.shape[1] + 1.5, 0.3 * codes.shape[0] + 1))
    colours = ["0.92", "#f4a259", "#2a6f97"]
    ax.imshow(codes, cmap=ListedColormap(colours), vmin=0, vmax=2, interpolation="nearest",
              aspect="auto")
    ax.legend(handles=[Patch(color=c, label=k) for c, k in zip(colours, BLOCK_KINDS)],
              loc="upper right", fontsize=7)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))
    bq, bk = mask.block_size
    ax.set_xlabel(f"key block ({bk} keys)")
    ax.set_ylabel(f"query block ({bq} queries)")
    counts = {k: int((codes == i).sum()) for i, k in enumerate(BLOCK_KINDS)}
    ax.set_title(f"b {b}, h {h}: {counts['full']} full, {counts['partial']} partial, "
                 f"{counts['skipped']} skipped", fontsize=8)
    return ax
