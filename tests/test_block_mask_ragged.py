"""Block masks over ragged batches and KV caches, on the CPU: `BlockMask.per_sequence` (each
list cut to its sequence's tiles) against an enumeration written here; `forward_varlen`, a
paged `forward` and the ragged backward with the compiler and the launch stood in
(`launch_recording`): the planned keys and the cut lists they get, and each refusal before any
launch; and the kernels that walk such lists compiled for sm_80, sm_90a and sm_120a within the
mods' spill budget."""

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import cute_fa  # noqa: E402
from launch_recording import launches  # noqa: E402,F401  (a fixture)
from launch_recording import named_arguments  # noqa: E402

from cute_fa.mods import block_mask  # noqa: E402
from cute_fa.mods.block_mask import (create_block_mask, kernel_tile, per_sequence,  # noqa: E402
                                     sequence_tiles)

LENS_Q, LENS_K = [1000, 301, 0, 129], [900, 517, 65, 1]
DOCS = torch.sort(torch.randint(0, 4, (4, 1000), generator=torch.Generator().manual_seed(2)),
                  dim=1).values


def document(b, h, q, kv):
    return (DOCS[b, q] == DOCS[b, kv]) & (kv <= q + 64 * h)


def cu_seqlens(lengths):
    return torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))],
                        dtype=torch.int32)


def cut_by_hand(counts, indices, rows, listed):
    """The lists cut to each sequence, one entry at a time: (batch, heads, rows) lists of
    tiles, empty for a row at or past rows[b], else the row's entries below listed[b]."""
    out = []
    for b in range(counts.shape[0]):
        per_head = []
        for h in range(counts.shape[1]):
            per_row = []
            for r in range(counts.shape[2]):
                tiles = [int(kernel_tile(indices[b, h, r, i])[0])
                         for i in range(int(counts[b, h, r]))]
                per_row.append([] if r >= rows[b] else [t for t in tiles if t < listed[b]])
            per_head.append(per_row)
        out.append(per_head)
    return out


def assert_cut(got, indices, want):
    """got's counts name exactly the lists of want, read from the (unchanged) indices."""
    assert got.dtype == torch.int32 and got.is_contiguous()
    for b, per_head in enumerate(want):
        for h, per_row in enumerate(per_head):
            for r, tiles in enumerate(per_row):
                n = int(got[b, h, r])
                assert [int(kernel_tile(indices[b, h, r, i])[0]) for i in range(n)] == tiles, \
                    (b, h, r)


def test_sequence_tiles():
    cu = cu_seqlens(LENS_K)
    assert sequence_tiles(cu, 64).tolist() == [15, 9, 2, 1]
    used = torch.tensor([64, 65, 0, 7], dtype=torch.int32)
    assert sequence_tiles(cu, 64, used).tolist() == [1, 2, 0, 1]  # used wins
    assert sequence_tiles(None, 64, None, 1000) == 16
    assert sequence_tiles(None, 64) is None


@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize("side", ["forward", "backward"])
@pytest.mark.parametrize("tile", [(128, 64), (64, 128)])
def test_per_sequence_keeps_each_sequences_tiles(side, tile, whole):
    """The forward's lists (query tile -> key tiles) and the backward's (key tile -> query
    tiles), with and without tiles marked whole, cut to ragged lengths (an empty sequence, a
    one-key one): a row past its sequence lists nothing, a row keeps its tiles inside the
    sequence, in order."""
    block_m, block_n = tile
    bm = create_block_mask(document, 4, 2, 1000, 900, block_size=128)
    q_tiles, k_tiles = sequence_tiles(cu_seqlens(LENS_Q), block_m), \
        sequence_tiles(cu_seqlens(LENS_K), block_n)
    if side == "forward":
        counts, indices = bm.kernel_blocks(block_m, block_n, 4, 2, whole=whole)
        rows, listed = q_tiles, k_tiles
    else:
        counts, indices = bm.query_tiles(block_m, block_n, 4, 2, whole=whole)
        rows, listed = k_tiles, q_tiles
    got = per_sequence(counts, indices, rows, listed)
    assert got.shape == counts.shape
    assert_cut(got, indices, cut_by_hand(counts, indices, rows.tolist(), listed.tolist()))
    # an int bound is every sequence's; None leaves that side alone
    same = per_sequence(counts, indices, None, 3)
    assert_cut(same, indices, cut_by_hand(counts, indices, [10 ** 6] * 4, [3] * 4))


def test_per_sequence_of_a_mask_for_one_sequence():
    """A mask made for batch 1 serves every sequence (its lists broadcast); the cut counts
    are each sequence's own."""
    bm = create_block_mask(lambda b, h, q, kv: kv <= q, None, None, 1000, 1000)
    counts, indices = bm.kernel_blocks(128, 128, 4, 3)
    rows, listed = sequence_tiles(cu_seqlens(LENS_Q), 128), sequence_tiles(cu_seqlens(LENS_K), 128)
    got = per_sequence(counts, indices, rows, listed)
    assert got.shape == (4, 3, 8)
    assert got[0, 0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]  # 900 keys: 8 tiles, row 7 sees all
    assert got[1, 2].tolist() == [1, 2, 3, 0, 0, 0, 0, 0]  # 301 queries: 3 tiles
    assert got[2].sum() == 0 and got[3, 1].tolist() == [1, 1, 0, 0, 0, 0, 0, 0]


def ragged(lens_q=LENS_Q, lens_k=LENS_K, hq=4, hk=2, d=64):
    q = torch.randn(sum(lens_q), hq, d, dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lens_k), hk, d, dtype=torch.bfloat16) for _ in range(2))
    return q, k, v, cu_seqlens(lens_q), cu_seqlens(lens_k), max(lens_q), max(lens_k)


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setattr(block_mask, "SEQUENCE_BLOCK_MASKS", True)
    monkeypatch.setattr(block_mask, "WHOLE_TILES", True)


@pytest.mark.parametrize("backend, kernel", [("auto", "sm90"), ("sm80", "sm80"),
                                             ("tma", "tma")])
def test_varlen_block_mask_plans_cut_lists(launches, on, backend, kernel):
    recorded, _ = launches
    bm = create_block_mask(document, 4, None, 1000, 1000)
    q, k, v, cu_q, cu_k, max_q, max_k = ragged()
    cute_fa.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, block_mask=bm, backend=backend)
    (key, args), = recorded
    assert key.backend == kernel and key.block_sparse and key.varlen_q and key.varlen_k
    assert not key.causal and key.mask_mod is not None and getattr(key, "pack_gqa", 1) == 1
    docs, counts, indices = named_arguments(key, args)["score_tensors"]
    assert docs is DOCS
    block_m, block_n = key.tile.block_m, key.tile.block_n
    full = bm.kernel_blocks(block_m, block_n, 4, 4)
    assert indices is full[1]
    assert_cut(counts, indices, cut_by_hand(
        *full, [-(-n // block_m) for n in LENS_Q], [-(-n // block_n) for n in LENS_K]))


def test_paged_block_mask_plans_cut_lists(launches, on):
    """A paged KV cache with seqused_k: the cp.async decode key, block-sparse, one query head
    per tile (no GQA packing), no page prefetch, unsplit; each entry's lists cut to its used
    keys."""
    recorded, _ = launches
    q = torch.randn(2, 3, 4, 64, dtype=torch.bfloat16)
    cache = torch.randn(16, 128, 2, 64, dtype=torch.bfloat16)
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    used = torch.tensor([1000, 70], dtype=torch.int32)
    bm = create_block_mask(lambda b, h, qi, kv: kv % 3 != h, 2, 4, 3, 1024)
    cute_fa.forward(q, cache, cache, page_table=table, seqused_k=used, block_mask=bm)
    (key, args), = recorded
    assert key.backend == "sm80" and key.block_sparse and key.page_size == 128
    assert key.seqused_k and key.pack_gqa == 1 and not key.page_prefetch
    assert not key.split_kv
    counts, indices = named_arguments(key, args)["score_tensors"]
    block_n = key.tile.block_n
    assert_cut(counts, indices, cut_by_hand(*bm.kernel_blocks(key.tile.block_m, block_n, 2, 4),
                                            [1, 1], [-(-1000 // block_n), -(-70 // block_n)]))


def test_ragged_paged_block_mask_plans_cut_lists(launches, on):
    """forward_varlen against a paged cache (chunked prefill): each entry's query tiles from
    cu_seqlens_q, its keys from seqused_k, its lists cut to both."""
    recorded, _ = launches
    lens_q, used = [5, 130, 0], [1000, 64, 300]
    q = torch.randn(sum(lens_q), 4, 64, dtype=torch.bfloat16)
    cache = torch.randn(24, 128, 2, 64, dtype=torch.bfloat16)
    table = torch.arange(24, dtype=torch.int32).view(3, 8)
    bm = create_block_mask(lambda b, h, qi, kv: (kv + qi) % 5 != h, 3, 4, 130, 1024)
    cute_fa.forward_varlen(q, cache, cache, cu_seqlens(lens_q), None, 130, 1024,
                           page_table=table, seqused_k=torch.tensor(used, dtype=torch.int32),
                           block_mask=bm)
    (key, args), = recorded
    assert key.backend == "sm80" and key.block_sparse and key.varlen_q and key.page_size == 128
    assert key.pack_gqa == 1 and not key.page_prefetch and not key.split_kv
    counts, indices = named_arguments(key, args)["score_tensors"]
    block_m, block_n = key.tile.block_m, key.tile.block_n
    assert_cut(counts, indices, cut_by_hand(*bm.kernel_blocks(block_m, block_n, 3, 4),
                                            [-(-n // block_m) for n in lens_q],
                                            [-(-n // block_n) for n in used]))


def test_varlen_block_mask_backward_walks_cut_query_lists(launches, on, monkeypatch):
    """The ragged backward of a block mask: block-sparse, ragged, its query tile lists cut to
    each sequence (a key tile past its keys lists nothing, a listed query tile lies inside
    the sequence's queries)."""
    from cute_fa import tuning_bwd

    monkeypatch.setattr(block_mask, "SPARSE_BACKWARD", True)
    monkeypatch.setattr(tuning_bwd, "SM90_MODS", False)
    recorded, _ = launches
    bm = create_block_mask(document, 4, None, 1000, 1000)
    q, k, v, cu_q, cu_k, max_q, max_k = ragged(d=128)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    cute_fa.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, block_mask=bm).sum().backward()
    (key, args), = [(key, args) for key, args in recorded if key.backend == "bwd_sm80"]
    assert key.block_sparse and key.varlen_q and key.varlen_k
    docs, kinds, counts, indices = named_arguments(key, args)["score_tensors"]
    assert docs is DOCS and kinds is bm.block_kinds(4, 4)
    block_m, block_n = key.tile.block_m, key.tile.block_n
    full = bm.query_tiles(block_m, block_n, 4, 4)
    assert indices is full[1]
    assert_cut(counts, indices, cut_by_hand(
        *full, [-(-n // block_n) for n in LENS_K], [-(-n // block_m) for n in LENS_Q]))


def test_sequence_block_mask_refusals(launches, monkeypatch):
    """Off (`SEQUENCE_BLOCK_MASKS`), a ragged or KV-cache call with a block mask says why; on,
    a mask shorter than the longest sequences, causal, a split or another batch are refused
    by name; nothing launches."""
    recorded, _ = launches
    q, k, v, cu_q, cu_k, max_q, max_k = ragged()
    bm = create_block_mask(document, 4, None, 1000, 1000)

    def varlen(mask, **kwargs):
        return cute_fa.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, block_mask=mask,
                                      **kwargs)

    monkeypatch.setattr(block_mask, "SEQUENCE_BLOCK_MASKS", False)
    with pytest.raises(ValueError, match="not yet checked on a GPU"):
        varlen(bm)
    monkeypatch.setattr(block_mask, "SEQUENCE_BLOCK_MASKS", True)
    with pytest.raises(ValueError, match=r"at least its longest sequences', \(1000, 900\)"):
        varlen(create_block_mask(document, 4, None, 1000, 899))
    with pytest.raises(ValueError, match="causal or window_size"):
        varlen(bm, causal=True)
    with pytest.raises(ValueError, match=r"batch and heads \(3, 1\)"):
        varlen(create_block_mask(lambda b, h, qi, kv: kv <= qi, 3, None, 1000, 1000))
    cache = torch.randn(16, 128, 2, 64, dtype=torch.bfloat16)
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    with pytest.raises(ValueError, match="num_splits=2"):
        cute_fa.forward(torch.randn(2, 1, 4, 64, dtype=torch.bfloat16), cache, cache,
                        page_table=table, num_splits=2,
                        block_mask=create_block_mask(lambda b, h, qi, kv: kv > qi, 2, None, 1,
                                                     1024))
    assert not recorded


CASES = [("sm_90a", "sm90", "forward"), ("sm_80", "sm80", "forward"),
         ("sm_120a", "tma", "forward"), ("sm_90a", "tma", "forward"),
         ("sm_80", "sm80", "paged"), ("sm_120a", "sm80", "paged"),
         ("sm_90a", "sm80", "packed"),
         ("sm_80", "sm80", "backward"), ("sm_90a", "sm90", "backward")]


@pytest.mark.parametrize("arch, backend, kind", CASES)
def test_sequence_block_mask_kernels_compile(arch, backend, kind):
    """The kernels a ragged or KV-cache block mask runs: the ragged forwards (cp.async, TMA,
    wgmma), the paged decode kernel (seqused_k, no page prefetch; a GQA group packed or not)
    and the ragged backwards, each walking the lists with a document mask_mod, within
    tuning.MOD_SPILL_BUDGET."""
    from cute_fa.compile.build import compile_kernel
    from cute_fa.compile.ptxas import ptxas_resources
    from cute_fa.mods import trace_mask_mod
    from cute_fa.tuning import MOD_SPILL_BUDGET, decode_key, kernel_key, mods_tile
    from cute_fa.tuning_bwd import bwd_keys

    mask = trace_mask_mod(document)[0]
    if kind == "forward":
        key = kernel_key(arch, "bfloat16", 128, False, backend, varlen=True)
        key = dataclasses.replace(key, tile=mods_tile(key, (128, 128)))
    elif kind in ("paged", "packed"):
        key = decode_key(arch, "bfloat16", 128, False, seqlen_q=4, group=2, page_size=64,
                         seqused_k=True, split_kv=False)
        key = dataclasses.replace(key, pack_gqa=2 if kind == "packed" else 1,
                                  page_prefetch=False)
    else:
        key = bwd_keys(arch, "bfloat16", 128, False, backend=backend, varlen=True)[1]
    key = dataclasses.replace(key, block_sparse=True, mask_mod=mask)
    assert kind in ("paged", "packed") or (key.varlen_q and key.varlen_k)
    res = ptxas_resources(compile_kernel(key, keep_ptx=True).__ptx__, arch)
    assert res["spill_stores"] <= MOD_SPILL_BUDGET and res["spill_loads"] <= MOD_SPILL_BUDGET, \
        res["log"]


def test_block_sparse_keys_refuse_what_splits_the_lists():
    """A block-sparse key walks one query tile's whole list in one CTA, looking each listed
    block's pages up as it loads it: split-KV and page prefetch are refused by name, and GQA
    packing but in the cp.async kernel (whose packed heads the host gives one shared list); a
    ragged batch and a paged cache are not refused."""
    from cute_fa.tuning import decode_key, kernel_key

    key = decode_key("sm_80", "bfloat16", 128, False, seqlen_q=4, group=2, page_size=64,
                     seqused_k=True, split_kv=False)
    plain = dataclasses.replace(key, pack_gqa=1, page_prefetch=False, block_sparse=True)
    assert plain.block_sparse and plain.page_size == 64
    assert dataclasses.replace(plain, pack_gqa=2).pack_gqa == 2
    for change, name in ((dict(split_kv=True), "split-KV"),
                         (dict(page_prefetch=True), "page_prefetch")):
        with pytest.raises(ValueError, match=f"block_sparse.*{name}"):
            dataclasses.replace(plain, **change)
    sm90 = kernel_key("sm_90a", "bfloat16", 64, False, "sm90", pack_gqa=2)
    assert sm90.pack_gqa == 2
    with pytest.raises(ValueError, match="block_sparse.*GQA packing"):
        dataclasses.replace(sm90, block_sparse=True)


def test_paged_block_mask_of_shared_heads_packs_the_group(launches, on):
    """A block mask of one head, shared by every query head: the decode kernel keeps packing a
    GQA group's heads into one tile, whose block_m rows are block_m / group queries of each
    head, and the lists are made at that many queries a tile."""
    recorded, _ = launches
    q = torch.randn(2, 3, 8, 64, dtype=torch.bfloat16)
    cache = torch.randn(16, 128, 2, 64, dtype=torch.bfloat16)
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    used = torch.tensor([1000, 70], dtype=torch.int32)
    bm = create_block_mask(lambda b, h, qi, kv: kv % 3 != b, 2, None, 3, 1024)
    cute_fa.forward(q, cache, cache, page_table=table, seqused_k=used, block_mask=bm)
    (key, args), = recorded
    assert key.block_sparse and key.pack_gqa == 4 and not key.page_prefetch
    counts, indices = named_arguments(key, args)["score_tensors"]
    queries, block_n = key.tile.block_m // 4, key.tile.block_n
    full = bm.kernel_blocks(queries, block_n, 2, 8)
    assert indices is full[1]
    assert_cut(counts, indices, cut_by_hand(*full, [10 ** 6] * 2,
                                            [-(-1000 // block_n), -(-70 // block_n)]))
