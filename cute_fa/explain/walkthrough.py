"""docs/walkthrough.md: one forward pass of the fp16, d=64, 64x64-tile, 4-warp kernel.

The document holds two kinds of content, computed tables and written text; each has its own
module, and this one joins them:

- `walkthrough_rows`: every table's rows, computed from the layouts the kernels run and from
  the float64 reference, as plain values that tests/test_walkthrough_doc.py checks by hand;
- `walkthrough_prose`: the section titles and the text, with <<name>> placeholders;
- this module: the generator, which formats the rows as Markdown, fills the placeholders and
  writes the document; it re-exports the row functions so that `walkthrough.<table>()` is the
  one name a test or a notebook needs.

    python -m cute_fa.explain.walkthrough > docs/walkthrough.md
"""

from __future__ import annotations

import math
import re
import sys

from ..kernels.fwd.tma import LAZY_RESCALE_THRESHOLD
from ..layouts.config import MMA_K, MMA_N, WARP_SIZE
from .walkthrough_prose import PROSE, SECTIONS, anchor, heading
from .walkthrough_rows import (
    HAND_BLOCK_N, HAND_K, MAX_EXAMPLE_ROW, SEQLEN, SUM_EXAMPLE, bank_table, causal_hand_table,
    causal_table, config_table, copy_table, cta_table, fragment_table, hand_input_table,
    hand_output_table, hand_rounds_table, hand_scores, lane_fragment_table, layouts,
    ldmatrix_count_table, ldmatrix_table, lse_table, max_example_table, mma_count_table,
    notebook_list, pv_table, quad_columns_table, quad_table, register_state_table, rescale_table,
    source_table, sum_example_table, swizzle_chunk_grid, swizzle_table, warp_rows_table,
)


# ---- formatting ---------------------------------------------------------------------

def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return "−∞" if v == -math.inf else f"{v:g}"
    if isinstance(v, range):
        return f"{v.start}–{v.stop - 1}" if len(v) > 1 else str(v.start)
    if isinstance(v, tuple):
        return "(" + ", ".join(_fmt(x) for x in v) + ")"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v) or "none"
    return str(v)


def _table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _fill(text: str, **values) -> str:
    """Replace each <<name>> of the prose by its (formatted) value."""
    out = re.sub(r"<<(\w+)>>", lambda m: _fmt(values[m.group(1)]), text)
    if "<<" in out:
        raise ValueError("unfilled placeholder in the walkthrough prose")
    return out.strip("\n")


def _nb(name: str) -> str:
    return f"[`notebooks/{name}`](../notebooks/{name})"


def _code_list(names) -> str:
    return ", ".join(f"`{n}`" for n in names)


# ---- the document ----------------------------------------------------------------------

def render() -> str:
    """The whole of docs/walkthrough.md, as the text the committed file must equal."""
    L = layouts()
    c = L.config
    if any(L.p_coords(t) != L.pv_a_coords(t) for t in range(c.num_threads)):
        raise AssertionError("the S->A register view does not give the A operand of P@V")
    shape, stride = L.s_rowcol_layout
    frags = L.fragment_shapes
    lane0_rows = [q for q, _ in L.s_rowcol(0)]
    lane0_keys = L.s_rowcol(0)[0][1]
    steps = ["local"] + [f"after XOR {o}" for o in L.reduce_offsets]
    chunks = [str(j) for j in range(c.head_dim_padded // c.vector_elems)]
    half = c.block_n // 2
    values = dict(
        toc="\n".join(f"{n}. [{t}]({anchor(n)})" for n, t in enumerate(SECTIONS, start=1)),
        nb1=_nb("01_online_softmax_by_hand.ipynb"), nb2=_nb("02_fragments_qk_pv.ipynb"),
        nb3=_nb("03_swizzle_and_copy.ipynb"), nb4=_nb("04_tma_variant.ipynb"),
        d=c.head_dim, bm=c.block_m, bn=c.block_n, threads=c.num_threads, warps=c.num_warps,
        seqlen=SEQLEN, warp_rows=c.block_m // c.num_warps, vec=c.vector_elems,
        per_row=c.copy_threads_per_row, rows_per_pass=c.copy_rows_per_pass,
        passes=c.block_m // c.copy_rows_per_pass, atom=f"`{L._t['swizzle_atom']}`",
        rowcol=f"`{_fmt(shape)}:{_fmt(stride)}`".replace(" ", ""),
        offsets=" then ".join(f"XOR {o}" for o in L.reduce_offsets),
        a_vals=frags["tCrQ"][0], b_vals=frags["tCrK"][0], c_vals=frags["tCrS"][0],
        n_last=MMA_N - 1, k_last=MMA_K - 1, s_slots=len(L.s_coords(0)),
        o_slots=len(L.o_coords(0)), o_dims_lane0=sorted({d for _, d in L.o_coords(0)}),
        lane0_rows=" and ".join(map(str, lane0_rows)), q_first=lane0_rows[0],
        q_second=lane0_rows[1], keys_per_lane=len(lane0_keys), half_keys=2 * len(lane0_keys),
        quads_per_warp=WARP_SIZE // len(L.reduce_group(0)),
        scale=config_table()[-1][1], hand_bn=HAND_BLOCK_N,
        plain_groups=len({b[2] for b in bank_table()}),
        swz_groups=len({b[3] for b in bank_table()}),
        keep_first=sum(len(r[2]) for r in causal_table()),
        keep_second=sum(len(r[3]) for r in causal_table()),
        max_head=MAX_EXAMPLE_ROW[:8], max_rest_n=len(MAX_EXAMPLE_ROW) - 8,
        max_rest=MAX_EXAMPLE_ROW[8], sum_inputs=SUM_EXAMPLE, lazy=LAZY_RESCALE_THRESHOLD,
        notebooks="\n".join(f"- [`{p}`](../{p}): {w}" for p, w in notebook_list()),
    )
    tables = dict(
        hand_inputs=(["row", "Q (query)", "K (key)", "V (key)"], hand_input_table()),
        hand_scores=(["query \\ key"] + [str(k) for k in range(len(HAND_K))],
                     [(q, *row) for q, row in hand_scores()]),
        hand_rounds=(["round j", "keys", "query", "m⁽ʲ⁾", "α⁽ʲ⁾", "P̃⁽ʲ⁾ row", "ℓ⁽ʲ⁾",
                      "P̃⁽ʲ⁾ Vⱼ row", "O⁽ʲ⁾ row"], hand_rounds_table()),
        hand_output=(["query", "O⁽²⁾", "ℓ⁽²⁾", "O = O⁽²⁾ / ℓ⁽²⁾", "softmax(sS) V, direct", "L"],
                     hand_output_table()),
        config=(["setting", "value"], config_table()),
        ctas=(["m_block", "queries", "key blocks (kernel order)", "… causal",
               "… masked (causal)"], cta_table()),
        warps_table=(["warp w", "threads", "query rows of S and O", "keys of S", "dims of O"],
                     warp_rows_table()),
        copy=(["thread", "rows", "columns"], copy_table()),
        swizzle=(["row", "col", "row-major offset", "swizzled offset"], swizzle_table()),
        chunks=(["row \\ logical chunk"] + chunks, [(r, *js) for r, js in swizzle_chunk_grid()]),
        banks=(["lane", "(row, col) addressed", "bank group, row-major", "bank group, swizzled"],
               bank_table()),
        ldsm=(["lanes", "Q rows", "Q col", "K rows (keys)", "K col (d)", "V rows (keys)",
               "V col (d)"], ldmatrix_table()),
        ldsm_count=(["tensor", "view", "modes", "ldmatrix.x4 per round", "values each"],
                    [(t, f"`{v}`", *rest) for t, v, *rest in ldmatrix_count_table()]),
        lanes=(["tid", "w", "lane", "g", "a", "A: queries", "A: d (k-step 0)", "B: key (atom 0)",
                "B: d (k-step 0)", "C: first four slots (query, key)"], lane_fragment_table()),
        mma_counts=(["GEMM", "who", "M", "N", "K", "mma.sync"], mma_count_table()),
        fragments=(["tensor", "role", "modes", "layout", "values"],
                   [(n, r, m, f"`{lay}`", e) for n, r, m, lay, e in fragment_table()]),
        pv=(["k-step h", "P̃ keys (A)", "V keys (B)", "V dims (B)"], pv_table()),
        causal=(["lane", "keys held"] + [f"query {q} keeps" for q in lane0_rows], causal_table()),
        causal_hand=(["query", "masked scores", "causal O", "L"], causal_hand_table()),
        quads=(["warp", "g", "threads", "row 0 (mi=0)", "row 1 (mi=1)", "partners"], quad_table()),
        quad_cols=(["lane", f"keys 0–{half - 1}", f"keys {half}–{c.block_n - 1}"],
                   quad_columns_table()),
        max_example=(["lane"] + steps, max_example_table()),
        sum_example=(["lane"] + steps, sum_example_table()),
        state=(["register tensor", "values per thread", "holds"], register_state_table()),
        rescale=(["query", "m⁽¹⁾", "m⁽²⁾", "α⁽²⁾", "ℓ⁽¹⁾", "α⁽²⁾ℓ⁽¹⁾", "rowsum P̃⁽²⁾", "ℓ⁽²⁾"],
                 rescale_table()),
        lse=(["query", "m⁽²⁾", "ℓ⁽²⁾", "L = s·m + ln ℓ", "ln Σₖ exp(s·S), direct"], lse_table()),
        sources=(["piece", "file", "names"],
                 [(p, f"[`{f}`](../{f})", _code_list(n)) for p, f, n in source_table()]),
    )
    values.update({name: _table(header, rows) for name, (header, rows) in tables.items()})
    parts = [_fill(PROSE["intro"], **values)]
    for n in range(1, len(SECTIONS) + 1):
        parts.append(heading(n) + "\n\n" + _fill(PROSE[n], **values))
    return "\n\n".join(parts) + "\n"


def main() -> None:
    sys.stdout.buffer.write(render().encode("utf-8"))


if __name__ == "__main__":
    main()
