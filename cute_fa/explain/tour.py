"""The per-lane tour: the tables of docs/walkthrough.md, printed from the live layouts."""

from __future__ import annotations

from ..layouts.config import WARP_SIZE
from .introspect import FlashLayouts


def _section(title: str) -> str:
    return f"\n{title}\n" + "-" * len(title)


def tour(layouts: FlashLayouts | None = None) -> str:
    L = layouts or FlashLayouts()
    c = L.config
    out = [
        f"cute_fa layout tour: {c.dtype}, head_dim={c.head_dim}, tile {c.block_m}x{c.block_n}, "
        f"{c.num_warps} warps ({c.num_threads} threads)",
        f"smem: Q {c.block_m}x{c.head_dim_padded}, K and V {c.block_n}x{c.head_dim_padded}, "
        f"{c.smem_bytes()} bytes; swizzle atom {L._t['swizzle_atom']}",
    ]

    out.append(_section("Warps split the query rows (docs/walkthrough.md §3)"))
    for w in range(c.num_warps):
        rows = sorted({q for t in range(w * WARP_SIZE, (w + 1) * WARP_SIZE) for q, _ in L.s_coords(t)})
        out.append(f"  warp {w}: threads {w * WARP_SIZE}..{(w + 1) * WARP_SIZE - 1}, "
                   f"queries {rows[0]}..{rows[-1]} ({len(rows)} rows), all {c.block_n} keys")

    out.append(_section("Thread 0"))
    out.append(L.describe_lane(0))

    out.append(_section("Columns of one row held by each lane of quad 0 "
                        "(docs/walkthrough.md §9)"))
    for t in L.reduce_group(0):
        out.append(f"  lane {t}: keys {','.join(map(str, L.s_rowcol(t)[0][1]))}")
    shape, stride = L.s_rowcol_layout
    out.append(f"  accumulator row view tCrS_rowcol: shape {shape}, stride {stride}")

    out.append(_section("Causal mask on the diagonal block: keys kept (docs/walkthrough.md §8)"))
    for t in L.reduce_group(0):
        keep = L.causal_keep(t)
        out.append("  lane {}: ".format(t) + "; ".join(
            f"query {q} keeps {','.join(map(str, ks)) or 'none'}" for q, ks in keep.items()))

    out.append(_section("Row max across the quad, XOR shuffles (docs/walkthrough.md §9)"))
    row = [-4, -3, -2, -1, 0, 1, 2, 3] + [-5] * (c.block_n - 8)
    steps = L.reduce_steps(row, tid=0, op="max")
    names = ["local"] + [f"after XOR {o}" for o in L.reduce_offsets]
    for name, step in zip(names, steps):
        out.append(f"  {name:>12}: " + "  ".join(f"lane {t}={v}" for t, v in step.items()))

    out.append(_section("Swizzled smem offsets of Q, in elements (docs/walkthrough.md §5)"))
    for r, col in ((0, 0), (0, 8), (1, 0), (1, 8), (7, 56), (8, 0)):
        if r < c.block_m and col < c.head_dim_padded:
            out.append(f"  ({r},{col}): row-major {c.head_dim_padded * r + col:>5} -> "
                       f"swizzled {L.smem_offset('Q', r, col)}")

    out.append(_section("cp.async: what a thread copies gmem->smem"))
    for t in (0, 7, 8, 32):
        if t < c.num_threads:
            coords = L.copy_coords(t)
            rows = sorted({r for r, _ in coords})
            cols = sorted({col for _, col in coords})
            out.append(f"  thread {t:>3}: rows {','.join(map(str, rows))}, cols {cols[0]}..{cols[-1]}")

    out.append(_section("Per-thread register fragments (docs/walkthrough.md §7)"))
    for name, sizes in L.fragment_shapes.items():
        out.append(f"  {name:>6}: {sizes}   {L.fragment_layouts[name]}")
    return "\n".join(out)
