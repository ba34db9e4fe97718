"""The text of docs/walkthrough.md: its section titles and the prose of each section.

`PROSE` holds one template per section, plus "intro" for what precedes §1. A <<name>> in a
template is a value or a table that `walkthrough.render` fills in from `walkthrough_rows`; the
prose itself states formulas and reasons, never the content of a table, so editing the text
never needs the layouts and recomputing a table never touches the text.
"""

from __future__ import annotations

import re

SECTIONS = [
    "What attention computes", "Two rounds by hand", "Block, warp and lane",
    "Global to shared memory with cp.async", "The shared-memory swizzle",
    "Shared memory to registers with ldmatrix", "The MMA fragments", "The causal mask",
    "Quad reductions", "Online softmax across rounds", "Where each piece lives",
]


def heading(n: int) -> str:
    """The Markdown heading of section n, numbered as the document cites it (§n)."""
    return f"## {n}. {SECTIONS[n - 1]}"


def anchor(n: int) -> str:
    """The link target that GitHub's renderer gives heading(n), for the table of contents."""
    return "#" + re.sub(r"[^\w\- ]", "", heading(n)[3:].lower()).replace(" ", "-")


PROSE = {
    "intro": """
# One forward pass of FlashAttention, block by block and lane by lane

This document follows one forward pass of this repository's sm80 FlashAttention-2 kernel in one
configuration: fp16, head_dim <<d>>, tiles of <<bm>> queries by <<bn>> keys, <<warps>> warps
(<<threads>> threads), one head whose Q, K and V have <<seqlen>> rows. At each step it answers the
question CuTe code hides best: which values does thread N hold, and with which threads does it
work?

Every table is computed by `cute_fa/explain/walkthrough_rows.py` from
`cute_fa.explain.FlashLayouts`, which partitions identity tensors through the very TiledCopy and
TiledMMA objects the kernels build, and from the float64 reference `cute_fa.reference`;
`tests/test_walkthrough_doc.py` checks each table against values worked out by hand. Regenerate
with `python -m cute_fa.explain.walkthrough > docs/walkthrough.md`; code and notebooks cite it as
"docs/walkthrough.md §N".

<<toc>>
""",
    1: """
A row of Q is a query, a row of K a key, and row k of V is what key k contributes. For each
query, attention scores every key with a dot product, turns the scores into positive weights that
sum to one, and returns the weighted sum of the rows of V:

    S = Q Kᵀ,    P = softmax_row(s·S),    O = P V

Each row is normalised on its own. Standard attention scales by s = 1/√d
([Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)), <<scale>> here.

Storing S and P costs memory quadratic in the sequence length. FlashAttention
([Dao et al., 2022](https://arxiv.org/abs/2205.14135)) never stores them: a CTA keeps one block of
queries on chip, streams K and V past it a block at a time, and carries only a few values per
query row from block to block. The notation is that of Algorithm 1 of FlashAttention-2
([Dao, 2023](https://arxiv.org/abs/2307.08691)), with the scale written out:

- N, d: sequence length, head dimension. B_r, B_c: query rows per block, keys per round
  (`block_m`, `block_n` of `TileConfig`).
- j = 1 … T_c, T_c = ⌈N / B_c⌉: the K/V rounds (the code counts key blocks `n_block` from 0).
- S⁽ʲ⁾ = Q Kⱼᵀ: the round's raw scores, before the scale.
- m⁽ʲ⁾: the running row max of the raw scores. The kernels keep the max unscaled and weigh a score
  by exp(s·(S − m)), the same as taking the max of s·S since s > 0.
- P̃⁽ʲ⁾ = exp(s·(S⁽ʲ⁾ − m⁽ʲ⁾)): the round's weights, not normalised (P is the normalised whole).
- ℓ⁽ʲ⁾ and O⁽ʲ⁾: the running row sum of the weights and the running numerator Σ weight × V row,
  both relative to m⁽ʲ⁾. Only at the end does O⁽ᵀᶜ⁾ / ℓ⁽ᵀᶜ⁾ become O.
- L = s·m + ln ℓ: each row's log-sum-exp (LSE), which the kernels can also return.
""",
    2: """
The recurrence is easiest to follow on numbers small enough to check by hand: two queries, four
keys of dimension 2, <<hand_bn>> keys per round and, for this example only, s = ln 2, so that
exp(s·x) = 2ˣ and every weight is a power of two. No mask yet (§8). The inputs:

<<hand_inputs>>

The raw scores S = Q Kᵀ; round 1 sees the first two keys, round 2 the last two:

<<hand_scores>>

Per row, a round raises the running max m to cover its scores; computes α = exp(s·(m_old − m_new)),
which moves everything accumulated so far onto the new max; turns its scores into weights
P̃ = exp(s·(S − m_new)); and updates ℓ ← α·ℓ + rowsum P̃ and O ← α·O + P̃ Vⱼ. Subtracting the max
leaves the softmax unchanged (numerator and denominator both gain the factor exp(−s·m)) and keeps
the exponentials in range. The state starts at m = −∞, ℓ = 0, O = 0, so round 1 has α = 0 and
nothing to rescale. The state after each round, as `cute_fa.reference.flash_forward_tiles`
computes it in float64, shown as the exact fractions those floats are:

<<hand_rounds>>

Round 2 is why the rescale exists: both rows meet a larger score, so α < 1 shrinks the old ℓ and
the old O before the new weights are added. Scaling ℓ alone, or adding unscaled numerators, would
mix sums taken against two different maxima. After the last round each row is divided once by its
ℓ, which gives the attention computed directly from the whole score matrix
(`cute_fa.reference.attention`):

<<hand_output>>

No round was normalised on its own; the rounds were merged through m, ℓ and O and divided once. In
general, for round j of a query block:

    m⁽ʲ⁾ = max(m⁽ʲ⁻¹⁾, rowmax S⁽ʲ⁾)          α⁽ʲ⁾ = exp(s·(m⁽ʲ⁻¹⁾ − m⁽ʲ⁾))
    P̃⁽ʲ⁾ = exp(s·(S⁽ʲ⁾ − m⁽ʲ⁾))             ℓ⁽ʲ⁾ = α⁽ʲ⁾·ℓ⁽ʲ⁻¹⁾ + rowsum P̃⁽ʲ⁾
    O⁽ʲ⁾ = diag(α⁽ʲ⁾)·O⁽ʲ⁻¹⁾ + P̃⁽ʲ⁾ Vⱼ      and at the end  O = diag(ℓ)⁻¹ O⁽ᵀᶜ⁾,  L = s·m + ln ℓ

This is the online normaliser of [Milakov and Gimelshein (2018)](https://arxiv.org/abs/1805.02867)
carried across blocks. <<nb1>> runs the rounds step by step, the causal variant, and a last round
shorter than B_c.
""",
    3: """
From here on the configuration is the real one:

<<config>>

**Blocks.** The grid has one CTA per query block, head and batch. A CTA loads its <<bm>> rows of Q
once, keeps them in shared memory and visits the key blocks one round each. The kernels walk the
key blocks from the last one down, so that the rounds that may need a mask come first (§8); the
online softmax does not care about the order. Under causal masking a CTA skips the key blocks
wholly in the future of all its queries and masks element by element only those the diagonal
crosses. For one head of <<seqlen>> rows:

<<ctas>>

**Warps.** The <<warps>> warps split the CTA's query rows into slabs of <<warp_rows>>; each warp
covers every key of the round and every output dimension, so a softmax row never leaves its warp
and no reduction crosses warps. Read off the S and O accumulators of each warp's threads:

<<warps_table>>

**Lanes.** Write w = tid / 32 and lane = tid mod 32; the MMA layout splits the lane again into
g = lane / 4, which picks rows, and a = lane mod 4, which picks columns (integer divisions). The
four lanes sharing g form a *quad*: they hold the same two rows of S and O, and a row max or row
sum is a reduction within a quad (§9). Coordinates are tile-local: add <<bm>>·m_block to a query
and <<bn>>·n_block to a key for the global position.
""",
    4: """
A tile first travels from global to shared memory with `cp.async`, <<vec>> fp16 values (16 bytes)
per thread per instruction, without passing through registers. The tiled copy
(`copies.gmem_tiled_copy_qkv`) arranges the threads as a <<rows_per_pass>> × <<per_row>> grid:
<<per_row>> neighbouring threads share a row, a pass covers <<rows_per_pass>> rows and <<passes>>
passes cover the tile, so thread t copies columns <<vec>>·(t mod <<per_row>>) onwards of rows
t / <<per_row>> + <<rows_per_pass>>·r. Q, K and V tiles all use this partition:

<<copy>>

The copier is rarely a consumer: thread 0's rows lie in the slabs of every warp (§3). That is
the point of staging through shared memory: the copy partition is chosen for wide, coalesced
global loads, and the MMA reads the tile later in its own partition (§6). The kernel closes a
batch of copies with `cp_async_commit_group`, waits with `cp_async_wait_group(0)`, and a CTA
barrier makes the tile visible to all warps. Rows past the sequence end are zero-filled.
""",
    5: """
Shared memory has 32 banks of 4 bytes: a 128-byte line spans them all, in eight 16-byte *bank
groups*. `ldmatrix` (§6) reads an 8×8 matrix as eight 16-byte rows at once. With 128-byte tile
rows stored row-major, the eight rows of a matrix would sit in one bank group of eight lines and
the read would be serialised eight ways.

The tiles use `smem.smem_layout_atom` tiled to the tile shape: <<atom>>, a row-major atom of 8 rows
× 64 columns composed with Swizzle<3,3,3>, which XORs bits 6–8 of an element offset into bits
3–5. In words, the 16-byte chunk index is XORed with the row mod 8:

    offset(r, c) = 64·r + (c XOR 8·(r mod 8))

A value keeps its logical (row, col); only its place in memory moves. Element offsets of Q:

<<swizzle>>

The chunks of a row are permuted, never split, so each still suits a 16-byte `cp.async` store and
a 16-byte `ldmatrix` row. The physical chunk that logical chunk j of row r lands in:

<<chunks>>

The bank view: the eight rows addressed by warp 0's first `ldmatrix` of Q fall into
<<plain_groups>> bank group without the swizzle and into <<swz_groups>> different ones with it:

<<banks>>

Every copy into a tile and every read from it goes through this one layout, so a value is read
where it was written. K and V share Q's layout, and the output tile reuses Q's memory (§10).
<<nb3>> draws the bank map of whole tiles and checks head_dim 32 and 96, whose atoms are 32
columns wide.
""",
    6: """
`ldmatrix.x4` moves four 8×8 fp16 matrices from shared memory into a warp's registers in one
instruction. Each lane supplies the address of one 16-byte row (lanes 0–7 those of the first
matrix, and so on) and receives from each matrix the values that the MMA fragment layout assigns
to it, so the data arrive distributed as `mma.sync` wants them (§7). The copies are derived from
the TiledMMA (`make_tiled_copy_A` / `make_tiled_copy_B` in `copies.smem_tiled_copy_q`, `_k`, `_v`),
not written by hand. Row addresses of warp 0's first `ldmatrix.x4` of each tile:

<<ldsm>>

For Q the four matrices are the quarters of the 16 × 16 A block of a k-step; for K, two n8 atoms of
keys at both halves of the k-step. The other warps read Q <<warp_rows>> rows further down each, and
the same K and V rows, since every warp needs every key. K is stored (key, d), exactly the B
operand of Q·Kᵀ (CuTe's B is N × K), so it needs no transposed copy. V is stored (key, d) too, but
P̃·V wants its B as (d, key): V is read with `ldmatrix.trans` through the view sVt(d, key) of the
same swizzled memory (`smem.transposed_v`).

Each copy writes a *retiled* view of an MMA fragment: `retile` regroups the same registers into
the shape one `ldmatrix` fills, copying nothing. Per thread and round (`gemm.gemm_ldmatrix` issues
them one k-step or one instruction ahead of the MMAs that consume them):

<<ldsm_count>>
""",
    7: """
The tensor cores run `mma.sync.aligned.m16n8k16`: a warp multiplies a 16 × 16 A by a 16 × 8 B (CuTe
keeps B as N × K, 8 × 16) and adds the product into a 16 × 8 fp32 C. In Q·Kᵀ, M is the query, N
the key and K the sum over d (the GEMM's reduction axis, not the matrix K). The TiledMMA
(`mma.tiled_mma`) stacks the warps along M; a warp repeats the instruction over the keys in n8
atoms and over d in k16 steps, accumulating the k-steps into one C:

<<mma_counts>>

The whole warp executes each instruction, but a lane holds a sliver of its operands, <<a_vals>> fp16
values of A, <<b_vals>> of B and <<c_vals>> fp32 values of C, fixed by the lane alone. With
w = tid / 32, g = lane / 4, a = lane mod 4, n8 atom j = 0 … 7 and k-step h = 0 … 3:

    A (Q):  query = 16w + {g, g+8}    d   = 16h + {2a, 2a+1, 2a+8, 2a+9}
    B (K):  key   = 8j + g            d   = 16h + {2a, 2a+1, 2a+8, 2a+9}
    C (S):  query = 16w + {g, g+8}    key = 8j + {2a, 2a+1}

The first instruction of a round (keys 0–<<n_last>>, d 0–<<k_last>>) for a few threads:

<<lanes>>

Over a round a thread thus holds rows g and g+8 of its warp's slab of S and, in each, two
neighbouring keys of every n8 atom: <<s_slots>> fp32 values. Its register tensors, with their
top-level modes (values of one atom, repeats along M or N, k-steps):

<<fragments>>

**P̃·V** reuses the TiledMMA with new roles: A is P̃(query, key), B is Vᵀ(d, key), C is O(query, d);
the k-steps walk the keys 16 at a time and the n8 atoms walk the output dimensions. The C layout
of two neighbouring n8 atoms of S holds, in the same thread, exactly what the A layout of one k16
step asks for. So after the softmax the fp32 scores are converted to fp16 (`rP`) and *viewed* as
the A operand (`mma.acc_to_a_layout`): P̃ never leaves the registers, with no shuffle and no trip
through shared memory. (The renderer checks, for every slot of all <<threads>> threads, that the
view gives the (query, key) the MMA expects.) Thread 0 in P̃·V:

<<pv>>

Its O accumulator holds queries <<lane0_rows>> at dims <<o_dims_lane0>>: the column pattern of S,
now over output dimensions. The rescale and the final division (§10) touch only these registers.
<<nb2>> draws the ownership grids of every operand.
""",
    8: """
Causal attention lets query q see only keys k ≤ q, aligned at the top left as in torch SDPA
(`causal_offset` moves the diagonal for other alignments). The rule is written once, in
`cute_fa/visibility.py`, for the kernels, the reference and the introspection. It acts twice.

On whole blocks: a CTA does not visit the key blocks wholly in the future of all its queries
(`BlockInfo.n_block_max` in `kernels/sched/block_info.py`; the causal column in §3), so their
loads, Q·Kᵀ and P̃·V never happen. Blocks wholly in the past need no mask. Only a block the
diagonal crosses, here n_block = m_block, is masked element by element (as is the last key block
when the sequence length is not a multiple of B_c): after its Q·Kᵀ, so the masked scores were
computed anyway, and before the row max.

On elements: a thread needs the global query and key of each of its scores. It views its
accumulator as rows × columns (`mma.acc_rowcol_layout`), here <<rowcol>>: the row coordinate
(mi, ·) picks row g or g+8, the column coordinate (b, nj) picks key 2a + b of n8 atom nj, and the
register slot of (mi, (b, nj)) is 2·mi + b + 4·nj, so a row is not a run of registers. The
score at (mi, (b, nj)) is query <<bm>>·m_block + 16w + g + 8·mi against key
<<bn>>·n_block + 2a + b + 8·nj. Lanes 0–3 on the diagonal block of query block 0:

<<causal>>

Between them the four lanes keep <<keep_first>> of query <<q_first>>'s keys and <<keep_second>> of
query <<q_second>>'s, and no lane needs another lane's data to decide. `mask.apply_mask`
computes one limit per row and compares it with column offsets that are compile-time constants
read from the same layout.

Masked scores become −∞, not 0: exp(s·(−∞ − m)) = 0 weighs nothing in ℓ or O, whereas a 0 would
get a positive weight and, in a row of negative scores, raise the max. Hence the mask precedes the
max. The hand example of §2 under the same rule: its second K/V block lies wholly in the future of
both queries, so a kernel would skip it, and in the first block the first query still loses the
key after it:

<<causal_hand>>
""",
    9: """
After the mask each row needs its max over all <<bn>> keys, and after the exponentials its sum. A
row is spread over the four lanes of a quad, <<keys_per_lane>> keys each, so a reduction has two
stages: each thread combines its own values, without communication; then the quad combines them
with two butterfly shuffles (`shfl.sync.bfly`), each lane reading the value of lane XOR 2, then of
lane XOR 1. The kernel does not hard-code the offsets: `mma.row_reduce_offsets` reads them off the
MMA atom's C layout as the lane bits whose flip keeps a lane on the same rows; here <<offsets>>.
The quads, their rows, and the partners of their first thread:

<<quads>>

With lane = 4g + a, XOR 2 and XOR 1 flip only bits of a, so quads never mix and the
<<quads_per_warp>> quads of a warp reduce at the same time; a thread's two rows are reduced
separately. The keys each lane of quad 0 holds, the same in both rows:

<<quad_cols>>

A worked max: a row whose first keys score <<max_head>> and whose other <<max_rest_n>> keys score
<<max_rest>>. Each lane takes the max of its own keys, then the two shuffles run:

<<max_example>>

After XOR 2 a lane has the max over its own and its partner's keys, <<half_keys>> in all; after
XOR 1, reading the partner's already combined value, the max over the whole row. It is an
all-reduce: all four lanes end with the row max, so each computes its own weights
exp(s·(S − m)) without waiting for a broadcast. One fp32 value per row crosses lanes; the scores
stay put. The row sum is the same butterfly with + for max; with partial sums <<sum_inputs>> in
lanes 0–3:

<<sum_example>>

The kernels all-reduce the max every round but the sum only once, at the end
(`OnlineSoftmax.finalize`). Each thread keeps its share of ℓ, the sum of its own weights in the
row, rescaled by the same α as its share of O; α is equal across the quad, which shares m, so the
shares stay consistent and one reduction at the end gives ℓ. This also avoids a trap of reducing
every round: an all-reduced ℓ must stay out of the next round's reduction, or it would be counted
once per lane.
""",
    10: """
What a thread carries from round to round:

<<state>>

In a round (`FlashFwdBase.run_round`), after Q·Kᵀ and the mask, `OnlineSoftmax.step` works on the
row view of S, and `OnlineSoftmax.rescale_O` then applies the factors it returns to O's row view.
For each of the thread's rows:

1. m_new = max(m_old, its scores), then the quad max all-reduce (§9); with m_old taking part, this
   is max(m_old, the round's whole row).
2. P̃ = exp(s·(S − m_new)) for its scores, in place in the S registers; masked −∞ become 0.
3. α = exp(s·(m_old − m_new)); its share of ℓ becomes α·ℓ + its sum of P̃, and (`rescale_O`) its
   values of O are multiplied by α. In the first round m_old = −∞, so α = 0 on an ℓ and O of 0: no
   special case.

The S registers are then converted to fp16 and P̃·V adds the round's share into O (§7). Between
the softmax and P̃·V the kernel waits for the V tile, loading since before Q·Kᵀ, and starts the
next K tile, which loads under P̃·V.

One α serves ℓ and O: an old weight exp(s·(S − m_old)) times exp(s·(m_old − m_new)) is
exp(s·(S − m_new)), the weight it would have had against the new max. Every term of ℓ and of O
carries one such weight, so both take the same α, which is 1 when the max does not move. Round 2
of §2 in these terms:

<<rescale>>

The exponentials are exp2: the kernels pass scale_log2 = s·log₂e and evaluate
exp2(S·scale_log2 − m·scale_log2), one fused multiply-add per score. The TMA kernel may also skip
a rescale while a row's max has grown by at most <<lazy>> in log2 units (`lazy_threshold`): the
weights are then at most 2 to that power, harmless in fp32 sums and in fp16 P̃, and a thread saves
its <<o_slots>> multiplies of O; one warp vote per round keeps the branch uniform.

**The end.** After the last round `OnlineSoftmax.finalize` all-reduces each row's ℓ over the
quad, multiplies the thread's O by 1/ℓ and forms L = s·m + ln ℓ. `epilogue.store_O` converts O to
fp16 and writes it through shared memory, reusing Q's tile: the MMA layout scatters a row over a
quad in pairs, and the detour lets each thread store whole 16-byte runs with the partition of §4.
One lane per quad writes the LSE of its rows (`epilogue.store_LSE`). For the hand example, L equals
the log-sum-exp of the scaled scores taken directly:

<<lse>>
""",
    11: """
The pieces of this document in the code (each name is resolved by import when the document is
rendered, so a rename fails the render):

<<sources>>

Compared with the CuTe C++ kernel of
[tiny-flash-attention](https://github.com/66RING/tiny-flash-attention) (sm80, fp16), whose
structure this document follows, these kernels choose differently in a few places: key blocks
run from the last one down, so the masked rounds come first; the wait for V comes after the
softmax, not before it; the exponentials are exp2 with the scale folded into one multiply-add;
and the row sum is all-reduced once at the end rather than every round (§9). The TMA kernel
(`kernels/fwd/tma.py`, <<nb4>>) replaces the
`cp.async` copies of §4 with tensor copies into a ring of K/V stages; from shared memory on it
runs the same code.

The notebooks print and draw the same layouts; `tests/test_notebooks.py` runs them:

<<notebooks>>

Without a GPU, `python -m cute_fa` prints the per-lane tour of this configuration
(`cute_fa/explain/tour.py`), and `python -m cute_fa layouts --tid N` describes any one thread.
""",
}
