"""Decode on a GPU: seqused_k, a paged KV cache, split-KV (num_splits) and merge_attention,
against a float64 reference computed on the GPU, next to torch SDPA.

The tolerance is test_forward_gpu's: max|err_cute_fa| <= 2 * max|err_sdpa| + 1e-3 * max|o_ref|,
with err_sdpa torch SDPA's error (its default backend choice, given the same visibility mask)
on the same inputs against the same reference. Rows that see no key must be exactly o = 0 and
lse = -inf; every case runs into a NaN-poisoned `out`.

A paged cache is built from a dense one by scattering its pages into a pool in a random order
(torch.randperm), so the reference is the dense computation. The pool also holds spare pages
filled with NaN that no page-table entry names: a kernel that reads a page it was not given
shows NaN.
"""

import math
from collections import namedtuple

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

DEV = "cuda"
NAN, NEG_INF = float("nan"), float("-inf")
BF16, FP16 = torch.bfloat16, torch.float16


# --- inputs -----------------------------------------------------------------------------------

def generator(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


def randn(*shape, dtype, gen):
    return torch.randn(*shape, device=DEV, dtype=dtype, generator=gen)


def make_seqused(spec, batch, capacity, gen):
    """int32 (B,) key counts from a spec: None, "random" (uniform in 0..capacity, with 0, 1
    and capacity forced into the first entries where the batch has room) or a list."""
    if spec is None:
        return None
    if spec == "random":
        lens = torch.randint(0, capacity + 1, (batch,), device=DEV, generator=gen)
        for i, forced in enumerate((0, 1, capacity)[:batch if batch > 1 else 0]):
            lens[i] = forced
    else:
        lens = torch.tensor(spec, device=DEV)
    assert lens.shape == (batch,) and int(lens.max()) <= capacity
    return lens.to(torch.int32)


def make_paged(k, v, page_size, gen, spare=3):
    """Scatter dense (B, S, Hk, D) k/v (S a multiple of page_size) into a pool of pages in a
    random order. Returns (k_pool, v_pool, page_table int32 (B, S // page_size), spare page
    indices); the spare pages hold NaN and no page-table entry names them."""
    b, s, hk, d = k.shape
    assert s % page_size == 0
    n = s // page_size
    total = b * n + spare
    order = torch.randperm(total, device=DEV, generator=gen)
    table = order[:b * n].view(b, n)
    pools = []
    for t in (k, v):
        pool = torch.full((total, page_size, hk, d), NAN, device=DEV, dtype=t.dtype)
        pool[table.flatten()] = t.reshape(b * n, page_size, hk, d)
        pools.append(pool)
    return pools[0], pools[1], table.to(torch.int32), order[b * n:]


# --- reference and tolerance ------------------------------------------------------------------

def visible(seqlens, seqlen_q, seqlen_k, causal):
    """(B, 1, Sq, Sk) bool: key j is visible to query i of entry b (j < L_b, and bottom-right
    causal against the entry's own L_b: j <= i + L_b - Sq)."""
    lens = seqlens.view(-1, 1, 1, 1).long()
    i = torch.arange(seqlen_q, device=DEV).view(1, 1, -1, 1)
    j = torch.arange(seqlen_k, device=DEV).view(1, 1, 1, -1)
    vis = j < lens
    if causal:
        vis = vis & (j <= i + lens - seqlen_q)
    return vis


def reference(q, k, v, seqlens, *, causal, scale):
    """float64 (o (B, Sq, Hq, D), lse (B, Hq, Sq)); a row that sees no key gets o = 0 and
    lse = -inf. Query head h reads KV head h // (Hq / Hk); the heads of one group are folded
    into the query rows, so K/V are never repeated."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    g = hq // hk
    qd = q.double().view(b, sq, hk, g, d).permute(0, 2, 3, 1, 4).reshape(b, hk, g * sq, d)
    kd, vd = (t.double().permute(0, 2, 1, 3) for t in (k, v))  # (B, Hk, Sk, D)
    s = (scale * qd @ kd.transpose(-1, -2)).view(b, hk, g, sq, sk)
    s = s.masked_fill(~visible(seqlens, sq, sk, causal)[:, :, None], NEG_INF)
    lse = torch.logsumexp(s, dim=-1)  # -inf where no key is visible
    p = torch.exp(s - lse.nan_to_num(neginf=0.0)[..., None])  # 0 on such rows
    o = (p.view(b, hk, g * sq, sk) @ vd).view(b, hk, g, sq, d)
    return o.permute(0, 3, 1, 2, 4).reshape(b, sq, hq, d), lse.reshape(b, hq, sq)


def sdpa_error(q, k, v, seqlens, o_ref, seen, *, causal, scale):
    """max |torch SDPA - reference| on the same inputs, over the rows that see a key."""
    mask = visible(seqlens, q.shape[1], k.shape[1], causal)
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale,
        enable_gqa=True).transpose(1, 2)
    return (o.double() - o_ref).abs().where(seen, 0).nan_to_num(0).max().item()


class Expected:
    """The reference answer of one problem and the tolerance on it; check() any number of
    results (one per num_splits, say) against it."""

    def __init__(self, q, k, v, seqlens, *, causal, scale=None, factor=2.0):
        self.scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
        self.o, self.lse = reference(q, k, v, seqlens, causal=causal, scale=self.scale)
        self.empty = ~torch.isfinite(self.lse)  # (B, Hq, Sq): rows with no visible key
        self.seen = ~self.empty.transpose(1, 2)[..., None]  # (B, Sq, Hq, 1)
        err_sdpa = sdpa_error(q, k, v, seqlens, self.o, self.seen, causal=causal,
                              scale=self.scale)
        self.err_sdpa = err_sdpa
        self.tol = factor * err_sdpa + 1e-3 * self.o.abs().max().item() + 1e-6
        self.lse_tol = 1e-3 * max(1.0, self.lse.where(~self.empty, 0).abs().max().item())

    def check(self, o, lse=None, what=""):
        assert not torch.isnan(o).any(), f"{what}: NaN in o (unwritten, or a bad page read)"
        if self.empty.any():
            assert (o.transpose(1, 2)[self.empty] == 0).all(), f"{what}: rows with no key: o = 0"
        err = (o.double() - self.o).abs().max().item()
        assert err <= self.tol, f"{what}: max err {err:.3g} vs torch SDPA {self.err_sdpa:.3g}"
        if lse is not None:
            assert lse.dtype == torch.float32 and lse.shape == self.lse.shape, \
                (lse.dtype, lse.shape)
            if self.empty.any():
                assert (lse[self.empty] == NEG_INF).all(), f"{what}: rows with no key: lse = -inf"
            lse_err = (lse.double() - self.lse).where(~self.empty, 0).abs().max().item()
            assert lse_err <= self.lse_tol, f"{what}: lse err {lse_err:.3g}"


# --- the grid ---------------------------------------------------------------------------------

# page_size None: dense cache. seqused: None (every key valid), "random", or a list. The cases
# use few (head_dim, dtype, causal, dense/paged) combinations, to keep the compiles few.
Case = namedtuple("Case", "b sq sk hq hk d causal dtype page_size seqused scale",
                  defaults=(None,))
CASES = [
    Case(1, 1, 1, 8, 8, 128, False, BF16, None, None),                # one key
    Case(3, 1, 1, 4, 1, 64, True, FP16, 16, "random"),                # one page, 0/1/16 keys, MQA
    Case(4, 1, 1000, 32, 8, 128, True, BF16, None, "random"),         # GQA 4
    Case(64, 1, 512, 8, 1, 64, True, FP16, None, "random"),           # B = 64, MQA
    Case(64, 2, 300, 16, 16, 128, True, BF16, 64, None),              # B = 64, MHA, paged
    Case(8, 4, 2048, 32, 8, 128, True, BF16, 64, "random"),
    Case(3, 16, 3000, 16, 2, 128, True, BF16, 16, "random"),          # GQA 8, Sq 16
    Case(2, 7, 777, 4, 4, 256, True, FP16, 48, "random"),             # head_dim 256, page 48
    Case(2, 2, 5000, 8, 2, 64, False, BF16, 256, "random", 0.3),      # softmax_scale
    Case(5, 3, 300, 12, 4, 64, True, FP16, None, "random"),           # GQA 3
    Case(7, 16, 40, 8, 8, 64, True, BF16, None, [0, 1, 5, 15, 16, 17, 40]),  # rows with no key
    Case(4, 1, 200, 8, 2, 256, False, BF16, None, None),
    Case(2, 1, 2000, 8, 2, 128, False, BF16, None, "random"),
    Case(16, 1, 4096, 64, 8, 128, True, BF16, 512, None),             # GQA 8, page 512
    Case(1, 1, 70000, 8, 1, 128, True, BF16, None, None),             # 70k keys, MQA
    Case(2, 4, 65600, 32, 8, 128, True, BF16, 256, [65537, 1]),       # 64k+ keys, paged
    # more than 16 queries (chunked prefill against a cache): the prefill tile, unpacked
    Case(3, 100, 1000, 16, 4, 128, True, BF16, 64, [0, 150, 1000]),
]


def case_id(c):
    layout = f"page{c.page_size}" if c.page_size else "dense"
    seq = "" if c.seqused is None else ("-seqused" if c.seqused == "random" else "-lens")
    return (f"b{c.b}-q{c.sq}-k{c.sk}-h{c.hq}/{c.hk}-d{c.d}-{'causal' if c.causal else 'full'}-"
            f"{str(c.dtype)[6:]}-{layout}{seq}")


def build(case, seed):
    """Inputs of a case: (q, dense k, dense v, seqlens (B,) for the reference, forward's
    k/v and keyword arguments)."""
    gen = generator(seed)
    capacity = case.sk if case.page_size is None else -(-case.sk // case.page_size) * case.page_size
    q = randn(case.b, case.sq, case.hq, case.d, dtype=case.dtype, gen=gen)
    k = randn(case.b, capacity, case.hk, case.d, dtype=case.dtype, gen=gen)
    v = randn(case.b, capacity, case.hk, case.d, dtype=case.dtype, gen=gen)
    seqused = make_seqused(case.seqused, case.b, capacity, gen)
    seqlens = seqused if seqused is not None else \
        torch.full((case.b,), capacity, device=DEV, dtype=torch.int32)
    kwargs = dict(seqused_k=seqused, causal=case.causal, softmax_scale=case.scale)
    if case.page_size is None:
        return q, k, v, seqlens, (k, v), kwargs
    k_pool, v_pool, table, _ = make_paged(k, v, case.page_size, gen)
    return q, k, v, seqlens, (k_pool, v_pool), dict(kwargs, page_table=table)


@pytest.fixture(params=["two-launches", "one-launch"])
def merge_form(request, monkeypatch):
    """Split-KV as two launches (the split kernel, then the merge kernel) or as one (the last
    CTA of each query block merges, `Sm80Key.fused_merge`), forced on every split call
    whatever `tuning.decode_fused_merge` would pick for it."""
    from cute_fa import tuning
    from cute_fa.runtime.plan import clear_plans

    one = request.param == "one-launch"
    monkeypatch.setattr(tuning, "DECODE_FUSED_MERGE", "always" if one else "never")
    clear_plans()
    yield one
    clear_plans()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_decode_grid(case, merge_form):
    import cute_fa

    q, k, v, seqlens, (kc, vc), kwargs = build(case, seed=case.b * 1000 + case.sk + case.d)
    expected = Expected(q, k, v, seqlens, causal=case.causal, scale=case.scale)
    out = torch.full_like(q, NAN)  # poisoned: every element must be written
    o, lse = cute_fa.forward(q, kc, vc, return_lse=True, out=out, **kwargs)
    assert o.data_ptr() == out.data_ptr()
    expected.check(o, lse)
    # the same call again (the heuristic's num_splits included): bitwise the same
    o2, lse2 = cute_fa.forward(q, kc, vc, return_lse=True, out=torch.full_like(q, NAN), **kwargs)
    assert torch.equal(o2, o) and torch.equal(lse2, lse), "repeat runs must be bitwise identical"
    expected.check(cute_fa.forward(q, kc, vc, **kwargs), None, "without lse")


# --- num_splits -------------------------------------------------------------------------------

SPLITS = (1, 2, 3, 7, 16, 64)

SPLIT_CASES = {
    # entries of 40000, 0 and 1 keys: most splits of the short entries see no key
    "dense": Case(3, 1, 40000, 8, 8, 64, True, BF16, None, [40000, 0, 1]),
    "paged": Case(3, 4, 3000, 16, 2, 128, True, BF16, 64, [0, 1, 2999]),
    "few-keys": Case(2, 2, 100, 8, 2, 128, True, BF16, None, [100, 37]),  # splits > key blocks
}


@pytest.mark.parametrize("name", SPLIT_CASES)
def test_num_splits_agree_and_repeat_bitwise(name, merge_form):
    """Every forced split count gives the reference's answer (so they agree with each other
    within the tolerance), and each, run again, gives bitwise the same o and lse."""
    import cute_fa

    case = SPLIT_CASES[name]
    q, k, v, seqlens, (kc, vc), kwargs = build(case, seed=77)
    expected = Expected(q, k, v, seqlens, causal=case.causal)
    first = None
    for num_splits in SPLITS:
        runs = [cute_fa.forward(q, kc, vc, return_lse=True, out=torch.full_like(q, NAN),
                                num_splits=num_splits, **kwargs) for _ in range(2)]
        (o, lse), (o2, lse2) = runs
        expected.check(o, lse, f"num_splits={num_splits}")
        assert torch.equal(o, o2) and torch.equal(lse, lse2), \
            f"num_splits={num_splits}: repeat runs must be bitwise identical"
        if first is None:
            first = o
        assert (o.double() - first.double()).abs().max().item() <= expected.tol, \
            f"num_splits={num_splits} vs num_splits=1"


def _both_forms(monkeypatch, call):
    """call() under two launches, then under one: the two results."""
    from cute_fa import tuning
    from cute_fa.runtime.plan import clear_plans

    results = []
    for form in ("never", "always"):
        monkeypatch.setattr(tuning, "DECODE_FUSED_MERGE", form)
        clear_plans()
        results.append(call())
    clear_plans()
    return results


@pytest.mark.parametrize("name", SPLIT_CASES)
def test_one_launch_is_the_two_launches_bitwise(name, monkeypatch):
    """The merge in the split kernel's last CTA (`fwd/merge.merge_if_last`) adds the same
    partials in the same order as the merge kernel: bitwise the same o and lse, for every split
    count, into poisoned outputs, and the counters it leaves behind let the next call (another
    split count, another grid) run as well."""
    import cute_fa

    case = SPLIT_CASES[name]
    q, k, v, seqlens, (kc, vc), kwargs = build(case, seed=78)
    for num_splits in SPLITS[1:]:
        (o2, lse2), (o1, lse1) = _both_forms(monkeypatch, lambda: cute_fa.forward(
            q, kc, vc, return_lse=True, out=torch.full_like(q, NAN), num_splits=num_splits,
            **kwargs))
        assert torch.equal(o1, o2) and torch.equal(lse1, lse2), f"num_splits={num_splits}"


def test_one_launch_on_two_streams_at_once(monkeypatch):
    """Each stream has its own counters: calls queued on two streams at once (a long one on
    each, then many short ones) give what they give one at a time."""
    import cute_fa
    from cute_fa import tuning
    from cute_fa.runtime.plan import clear_plans

    monkeypatch.setattr(tuning, "DECODE_FUSED_MERGE", "always")
    clear_plans()
    cases = [Case(2, 1, 30000, 16, 2, 128, True, BF16, None, None),
             Case(3, 2, 5000, 8, 2, 64, True, BF16, 64, "random")]
    built = [build(c, seed=20 + i) for i, c in enumerate(cases)]
    alone = [cute_fa.forward(q, kc, vc, return_lse=True, num_splits=8, **kw)
             for q, _, _, _, (kc, vc), kw in built]
    streams = [torch.cuda.Stream() for _ in cases]
    torch.cuda.synchronize()
    together = [[] for _ in cases]
    for _ in range(20):
        for (q, _, _, _, (kc, vc), kw), stream, got in zip(built, streams, together):
            with torch.cuda.stream(stream):
                got.append(cute_fa.forward(q, kc, vc, return_lse=True, num_splits=8, **kw))
    torch.cuda.synchronize()
    for (o, lse), runs in zip(alone, together):
        for o_s, lse_s in runs:
            assert torch.equal(o_s, o) and torch.equal(lse_s, lse)
    clear_plans()


# --- paged caches: page sizes, pages never named ----------------------------------------------

def _max_page_size():
    from cute_fa.tuning import MAX_PAGE_SIZE

    return MAX_PAGE_SIZE


@pytest.fixture(params=["lookup-at-issue", "a-round-ahead"])
def page_prefetch(request, monkeypatch):
    """A paged ring's page-table lookups as its loads are issued, or a round ahead
    (`Sm80Key.page_prefetch`), forced on every paged decode call whatever
    `tuning.DECODE_PAGE_PREFETCH` ships."""
    from cute_fa import tuning
    from cute_fa.runtime.plan import clear_plans

    monkeypatch.setattr(tuning, "DECODE_PAGE_PREFETCH", request.param == "a-round-ahead")
    clear_plans()
    yield request.param
    clear_plans()


def _planned_key(q, k, v, **kwargs):
    """The kernel key `forward(q, k, v, **kwargs)` runs (its plan, nothing compiled)."""
    from cute_fa.api.checks import check_forward
    from cute_fa.runtime.call import DENSE
    from cute_fa.runtime.device import device
    from cute_fa.runtime.plan import plan

    return plan(check_forward(DENSE, q, k, v, **kwargs), device(q.get_device()),
                compile=False).key


@pytest.mark.parametrize("case", [c for c in CASES if c.page_size], ids=case_id)
def test_page_prefetch_is_the_lookup_at_issue_bitwise(case, monkeypatch):
    """Pages read a round ahead give bitwise the o and lse of pages read as the loads are
    issued (the same keys, in the same order), for the heuristic's and forced split counts,
    into poisoned outputs; both match the reference."""
    import cute_fa
    from cute_fa import tuning
    from cute_fa.runtime.plan import clear_plans

    q, k, v, seqlens, (kc, vc), kwargs = build(case, seed=case.sk + 31)
    expected = Expected(q, k, v, seqlens, causal=case.causal, scale=case.scale)
    for num_splits in (None, 1, 3):
        results = []
        for ahead in (False, True):
            monkeypatch.setattr(tuning, "DECODE_PAGE_PREFETCH", ahead)
            clear_plans()
            results.append(cute_fa.forward(q, kc, vc, return_lse=True, num_splits=num_splits,
                                           out=torch.full_like(q, NAN), **kwargs))
            key = _planned_key(q, kc, vc, num_splits=num_splits, **kwargs)
            assert key.page_size == case.page_size
            assert key.page_prefetch == (ahead and key.kv_stages > 0)
            expected.check(*results[-1], f"num_splits={num_splits} ahead={ahead}")
        (o0, lse0), (o1, lse1) = results
        assert torch.equal(o0, o1) and torch.equal(lse0, lse1), f"num_splits={num_splits}"
    clear_plans()


@pytest.mark.parametrize("page_size", [16, 48, 64, 256, 512, "max"])
def test_page_sizes(page_size, page_prefetch):
    """One problem under every page size (48: a multiple of 16 that is not a power of two);
    entries end inside a page, on a page boundary, and hold 0 or 1 key."""
    import cute_fa

    if page_size == "max":  # the largest page size forward takes, if over 512
        page_size = _max_page_size()
        if page_size <= 512:
            pytest.skip("512 is the largest page size")
    case = Case(4, 3, 1500, 16, 4, 128, True, BF16, page_size, "random")
    q, k, v, seqlens, (kc, vc), kwargs = build(case, seed=page_size)
    capacity = k.shape[1]
    seqlens[3] = min(capacity, 2 * page_size)  # ends on a page boundary (seqlens is seqused_k)
    expected = Expected(q, k, v, seqlens, causal=True)
    o, lse = cute_fa.forward(q, kc, vc, return_lse=True, out=torch.full_like(q, NAN), **kwargs)
    expected.check(o, lse, f"page_size={page_size}")


def test_page_table_entries_past_the_used_pages_may_name_anything(page_prefetch):
    """Pages an entry does not use (past ceil(L_b / page_size)) may be any page, here pages
    full of NaN; an entry with 0 keys uses none. (flash-attn's contract too.)"""
    import cute_fa

    case = Case(3, 2, 128, 8, 2, 64, True, BF16, 16, [0, 1, 40])
    q, k, v, seqlens, (kc, vc), kwargs = build(case, seed=3)
    table = kwargs["page_table"]  # (3, 8): entries use 0, 1 and 3 of their 8 pages
    nan_first = kc.shape[0]  # two more pages, of NaN, at the end of the pool
    kc = torch.cat([kc, torch.full_like(kc[:2], NAN)])
    vc = torch.cat([vc, torch.full_like(vc[:2], NAN)])
    for b, length in enumerate(seqlens.tolist()):
        used = -(-length // 16)
        cols = torch.arange(used, table.shape[1], device=DEV)
        table[b, used:] = (nan_first + (b + cols) % 2).to(torch.int32)
    expected = Expected(q, k, v, seqlens, causal=True)
    for num_splits in (None, 1, 4):
        o, lse = cute_fa.forward(q, kc, vc, return_lse=True, out=torch.full_like(q, NAN),
                                 num_splits=num_splits, **kwargs)
        expected.check(o, lse, f"num_splits={num_splits}")


@pytest.mark.parametrize("layout", ["dense", "paged"])
def test_cache_rows_past_seqused_may_hold_nan(layout, page_prefetch):
    """The strict contract: keys at or past an entry's seqused_k are never used, whatever they
    hold, also inside the entry's last, partly used page (a cache allocated with torch.empty
    and filled as tokens arrive). flash-attn-4 asks those rows to be finite when it loads
    whole pages with TMA; this asks more of cute_fa."""
    import cute_fa

    page_size = 64 if layout == "paged" else None
    case = Case(4, 2, 1000, 16, 4, 128, True, BF16, page_size, [0, 1, 130, 700])
    q, k, v, seqlens, _, kwargs = build(case, seed=5)
    expected = Expected(q, k, v, seqlens, causal=True)
    past = torch.arange(k.shape[1], device=DEV)[None, :] >= seqlens[:, None].long()  # (B, S)
    kn, vn = (t.masked_fill(past[..., None, None], NAN) for t in (k, v))
    if layout == "paged":
        kc, vc, table, _ = make_paged(kn, vn, page_size, generator(6))
        kwargs["page_table"] = table
    else:
        kc, vc = kn, vn
    for num_splits in (None, 1, 3):
        o, lse = cute_fa.forward(q, kc, vc, return_lse=True, out=torch.full_like(q, NAN),
                                 num_splits=num_splits, **kwargs)
        expected.check(o, lse, f"num_splits={num_splits}")


# --- both kernels -----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["sm80", "auto"])
def test_each_backend(backend):
    """Decode on the cp.async kernel named explicitly, and as auto picks it ('tma' refuses the
    KV-cache arguments: tests/test_decode_errors.py)."""
    import cute_fa

    for case, num_splits in ((Case(3, 2, 900, 16, 4, 128, True, BF16, 64, "random"), 3),
                             (Case(2, 1, 3000, 8, 1, 64, True, FP16, None, "random"), None)):
        q, k, v, seqlens, (kc, vc), kwargs = build(case, seed=11)
        o, lse = cute_fa.forward(q, kc, vc, return_lse=True, out=torch.full_like(q, NAN),
                                 backend=backend, num_splits=num_splits, **kwargs)
        Expected(q, k, v, seqlens, causal=case.causal).check(o, lse, case_id(case))


# --- merge_attention --------------------------------------------------------------------------

def exact_merge(o_parts, lse_parts):
    """float64 merge of given parts: (o (B, S, H, D), lse (B, H, S), weight bound) where the
    bound is sum_p w_p |o_p| (what float32 cancellation error scales with)."""
    lse = lse_parts.double()
    m = lse.max(dim=0).values
    m = m.nan_to_num(neginf=0.0)  # all parts -inf: weights exp(-inf) = 0
    w = torch.exp(lse - m)  # (P, B, H, S)
    total = w.sum(dim=0)
    lse_out = torch.where(total > 0, m + torch.log(total), NEG_INF)
    w = (w / total.where(total > 0, 1.0)).permute(0, 1, 3, 2)[..., None]  # (P, B, S, H, 1)
    o = o_parts.double()
    return (w * o).sum(0), lse_out, (w * o.abs()).sum(0)


@pytest.mark.parametrize("dtype", [torch.float32, FP16, BF16], ids=str)
def test_merge_attention_exact(dtype):
    """Given parts, including large LSE offsets (a naive exp would overflow), parts with no
    key (lse -inf, o garbage) and a row where no part has a key."""
    import cute_fa

    gen = generator(8)
    p, b, s, h, d = 4, 3, 5, 6, 64
    o_parts = randn(p, b, s, h, d, dtype=torch.float32, gen=gen).to(dtype)
    lse_parts = 3 * randn(p, b, h, s, dtype=torch.float32, gen=gen)
    lse_parts[:, 0] += 1000.0
    lse_parts[:, 1] -= 1000.0
    lse_parts[:, 1, :, 2] += torch.tensor([0.0, 80.0, -80.0, 160.0], device=DEV)[:, None]
    no_key = torch.rand(p, b, h, s, device=DEV, generator=gen) < 0.3
    no_key[:, 2, 3, 4] = True  # every part empty
    no_key[:, 2, 0, 0] = torch.tensor([False, True, True, True], device=DEV)  # one part only
    lse_parts[no_key] = NEG_INF
    o_parts.masked_fill_(no_key.permute(0, 1, 3, 2)[..., None], 1e4)  # ignored: weight 0
    o, lse = cute_fa.merge_attention(o_parts, lse_parts)
    assert o.dtype == dtype and o.shape == (b, s, h, d)
    assert lse.dtype == torch.float32 and lse.shape == (b, h, s)
    o_exact, lse_exact, bound = exact_merge(o_parts, lse_parts)
    assert (o[2, 4, 3] == 0).all() and lse[2, 3, 4] == NEG_INF
    assert torch.equal(o[2, 0, 0], o_parts[0, 2, 0, 0]) and lse[2, 0, 0] == lse_parts[0, 2, 0, 0]
    assert torch.equal(torch.isfinite(lse), torch.isfinite(lse_exact))
    half_ulp = {torch.float32: 2.0**-24, FP16: 2.0**-11, BF16: 2.0**-8}[dtype]
    tol = 2 * half_ulp * o_exact.abs() + 1e-6 * bound + 1e-30
    assert ((o.double() - o_exact).abs() <= tol).all(), (o.double() - o_exact).abs().max()
    finite = torch.isfinite(lse_exact)
    lse_err = (lse.double() - lse_exact).where(finite, 0).abs()
    assert (lse_err <= 1e-6 * lse_exact.abs().where(finite, 0).clamp(min=1)).all(), lse_err.max()


def test_merge_attention_of_disjoint_key_sets_is_attention_over_the_union():
    """Keys split at random into three sets and an empty one; each part's attention is taken
    from the float64 reference (in float32), merged, and compared to attention over all keys."""
    import cute_fa

    gen = generator(9)
    b, sq, hq, hk, d, sk = 2, 3, 8, 2, 64, 500
    q, k, v = (randn(b, n, h, d, dtype=BF16, gen=gen) for n, h in ((sq, hq), (sk, hk), (sk, hk)))
    perm = torch.randperm(sk, device=DEV, generator=gen)
    sets = [perm[:200], perm[200:201], perm[201:], perm[:0]]
    o_parts, lse_parts = [], []
    for idx in sets:
        lens = torch.full((b,), len(idx), device=DEV)
        o_p, lse_p = reference(q, k[:, idx], v[:, idx], lens, causal=False, scale=d ** -0.5)
        o_parts.append(o_p.float())
        lse_parts.append(lse_p.float())
    o, lse = cute_fa.merge_attention(torch.stack(o_parts), torch.stack(lse_parts))
    o_all, lse_all = reference(q, k, v, torch.full((b,), sk, device=DEV), causal=False,
                               scale=d ** -0.5)
    assert (o.double() - o_all).abs().max().item() <= 1e-5 * o_all.abs().max().item()
    assert (lse.double() - lse_all).abs().max().item() <= 1e-5


def test_merge_attention_of_forward_parts():
    """forward's own (o, lse) over consecutive key ranges, one of them empty (seqused_k = 0),
    merged: the answer over all keys. A single part merges to itself, bitwise."""
    import cute_fa

    gen = generator(10)
    b, sq, hq, hk, d, sk = 2, 3, 8, 2, 128, 3000
    q = randn(b, sq, hq, d, dtype=BF16, gen=gen)
    k, v = (randn(b, sk, hk, d, dtype=BF16, gen=gen) for _ in range(2))
    parts = [cute_fa.forward(q, k[:, a:e], v[:, a:e], return_lse=True)
             for a, e in ((0, 700), (700, 701), (701, sk))]
    empty = cute_fa.forward(q, k[:, :16], v[:, :16], return_lse=True,
                            seqused_k=torch.zeros(b, device=DEV, dtype=torch.int32))
    assert (empty[0] == 0).all() and (empty[1] == NEG_INF).all()
    parts.append(empty)
    o, lse = cute_fa.merge_attention(torch.stack([p[0] for p in parts]),
                                     torch.stack([p[1] for p in parts]))
    assert o.dtype == BF16
    # each part's o is rounded to bf16 before the merge, which rounds again: twice the room
    seqlens = torch.full((b,), sk, device=DEV, dtype=torch.int32)
    Expected(q, k, v, seqlens, causal=False, factor=4.0).check(o, lse, "merged")
    one_o, one_lse = cute_fa.merge_attention(parts[0][0][None], parts[0][1][None])
    assert torch.equal(one_o, parts[0][0]) and torch.equal(one_lse, parts[0][1])


# --- bad input on the GPU: where tensors live, index values -----------------------------------

def test_decode_arguments_on_the_wrong_device_leave_out_untouched():
    import cute_fa

    case = Case(2, 1, 128, 8, 2, 64, True, BF16, 64, [5, 128])
    q, _, _, _, (kc, vc), kwargs = build(case, seed=12)
    out = torch.full_like(q, 7.0)
    with pytest.raises(ValueError, match="seqused_k"):
        cute_fa.forward(q, kc, vc, out=out, **dict(kwargs, seqused_k=kwargs["seqused_k"].cpu()))
    with pytest.raises(ValueError, match="page_table"):
        cute_fa.forward(q, kc, vc, out=out, **dict(kwargs, page_table=kwargs["page_table"].cpu()))
    o_parts = torch.zeros(2, 1, 3, 4, 64, device=DEV)
    with pytest.raises(ValueError, match="lse_parts"):
        cute_fa.merge_attention(o_parts, torch.zeros(2, 1, 4, 3))
    assert (out == 7.0).all()


def test_checked_indices(monkeypatch):
    """CUTE_FA_CHECK_INDICES=1 validates the values inside page_table and seqused_k (a sync):
    a page index outside the pool or a key count outside 0..capacity is a ValueError naming
    the argument, before the launch; valid values pass."""
    import cute_fa

    monkeypatch.setenv("CUTE_FA_CHECK_INDICES", "1")
    case = Case(2, 2, 256, 8, 2, 64, True, BF16, 64, [100, 256])
    q, k, v, seqlens, (kc, vc), kwargs = build(case, seed=13)
    o, lse = cute_fa.forward(q, kc, vc, return_lse=True, **kwargs)
    Expected(q, k, v, seqlens, causal=True).check(o, lse, "checked mode, valid values")
    out = torch.full_like(q, 7.0)
    table, seqused = kwargs["page_table"], kwargs["seqused_k"]
    for row, col, value in ((0, 0, kc.shape[0]), (1, 3, -1)):  # pages the entries use
        bad = table.clone()
        bad[row, col] = value
        with pytest.raises(ValueError, match="page_table"):
            cute_fa.forward(q, kc, vc, out=out, **dict(kwargs, page_table=bad))
    for value in (-1, table.shape[1] * 64 + 1):  # capacity: 4 pages of 64 keys
        bad = seqused.clone()
        bad[0] = value
        with pytest.raises(ValueError, match="seqused_k"):
            cute_fa.forward(q, kc, vc, out=out, **dict(kwargs, seqused_k=bad))
    dense_q, dense_k, dense_v = q, k[:, :200], v[:, :200]
    with pytest.raises(ValueError, match="seqused_k"):  # dense: more keys than k holds
        cute_fa.forward(dense_q, dense_k, dense_v, out=out, causal=True,
                        seqused_k=torch.tensor([10, 201], device=DEV, dtype=torch.int32))
    assert (out == 7.0).all()
