"""The mod probe (`kernels/mod_probe.py`: a traced mod's device code, `kernels/common/mods.py`,
at n elements) compiles on the CPU for each arch, for every mask and score mod of
tests/test_mods_trace.py, reading each leaf and each captured element it uses exactly once
(one global load per distinct leaf or load node of the graph) and writing one result."""

import re

import pytest

pytest.importorskip("torch")

from cute_fa.mods import trace_mask_mod, trace_score_mod  # noqa: E402
from test_mods_trace import MASKS, SCORES  # noqa: E402

ARCHS = ["sm_80", "sm_90a", "sm_120a"]
CASES = [(trace_mask_mod, name, MASKS[name]) for name in sorted(MASKS)] + \
        [(trace_score_mod, name, SCORES[name]) for name in sorted(SCORES)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tracer, name, fn", CASES, ids=[c[1] for c in CASES])
def test_mod_probe_compiles(arch, tracer, name, fn):
    from cute_fa.kernels.mod_probe import compile_probe

    graph, _ = tracer(fn)
    ptx = compile_probe(graph, arch).__ptx__
    assert re.search(rf"^\.target {arch}\b", ptx, re.M)
    reads = sum(n.op in ("score", "b", "h", "q_idx", "kv_idx", "load") for n in graph.nodes())
    assert len(re.findall(r"\bld\.global", ptx)) == reads
    assert len(re.findall(r"\bst\.global", ptx)) == 1
