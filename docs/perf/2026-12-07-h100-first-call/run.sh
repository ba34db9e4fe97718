#!/usr/bin/env bash
# This session's device calls, in the order they ran (see README.md), from the repo root, each
# first machine's first call staging half 1 of the DSL's part a
# (carry .devpkgs/a1: bash .devpkgs/a1/install.sh; ../2026-12-06-cpu-bwd-persistent/).
#   run.sh probe        carry .devpkgs/a2 and .devpkgs/b: the rest of the DSL; cold_gpu.py (cut
#                       off by its timeout at head_dim 192); the in-graph mods' GPU test
#   run.sh grid         `python -m cute_fa bench`
#   run.sh flexsoftcap  the in-graph test again, FlexAttention's softcap rows of the mods'
#                       backward benchmark
#   python docs/perf/2026-12-07-h100-first-call/first_call_prof.py 128 1   (warm cache)
# On a second machine, after the fixes:
#   run.sh quick        carry .devpkgs/a2 and .devpkgs/b: the in-graph test, the sparse
#                       block-mask gradient tests and two first-call probes
#   run.sh ab           ab_whole_backward.py at S 16k and 4k
set -uo pipefail
if [ "$1" = probe ] || [ "$1" = quick ]; then
  bash .devpkgs/a2/install.sh && bash .devpkgs/b/install.sh || exit 1
fi
. /opt/cutedsl/env.sh
export PYTHONPATH=$PWD:$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=/tmp/cfa
here=$(dirname "$0")
graph_test() {
  timeout ${TEST_S:-120} python -m pytest -q -p no:cacheprovider -rfE tests/test_mods_gpu.py \
    -k "torch_compile" > "$OUT"/graph_mods_gpu.log 2>&1
  tail -1 "$OUT"/graph_mods_gpu.log
}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > "$OUT"/env.txt
case $1 in
  probe)
    timeout 240 python $here/cold_gpu.py "$OUT"/cold_gpu.json > "$OUT"/cold_gpu.log 2>&1
    tail -c 4000 "$OUT"/cold_gpu.log
    graph_test ;;
  grid) timeout 580 python -m cute_fa bench --out "$OUT/grid" 2>&1 | tail -8 ;;
  flexsoftcap)
    graph_test
    ONLY=softcap timeout 300 python docs/perf/2026-12-07-cpu-bwd-mods/bench_mods_bwd.py "$OUT" \
      4096,16384 > "$OUT"/bench_mods_bwd_softcap.log 2>&1
    tail -c 2000 "$OUT"/bench_mods_bwd_softcap.log ;;
  quick)
    graph_test
    timeout 80 python -m pytest -q -p no:cacheprovider -n 8 -rfE tests/test_mods_gpu.py \
      -k "block_mask_gradients and sm90] and True" > "$OUT"/block_mask_gradients.log 2>&1
    grep -E "^(FAILED|ERROR)" "$OUT"/block_mask_gradients.log | head -20
    tail -1 "$OUT"/block_mask_gradients.log
    timeout 60 python -c "import json, tempfile
from cute_fa.bench.grid import start_times
with tempfile.TemporaryDirectory() as pyc:
    for d, c in ((64, True), (256, False)):
        print(json.dumps(dict(head_dim=d, causal=c, **start_times(d, c, pyc))), flush=True)
" > "$OUT"/bench_start.log 2>&1
    tail -c 1500 "$OUT"/bench_start.log ;;
  ab)
    timeout 95 python $here/ab_whole_backward.py "$OUT" 16384,4096 \
      > "$OUT"/ab_whole_backward.log 2>&1
    tail -c 3000 "$OUT"/ab_whole_backward.log ;;
esac
true
