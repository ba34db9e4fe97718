#!/usr/bin/env bash
# This session's device calls, from the repo root on one warm machine, after part a of the DSL
# is staged in two calls (docs/perf/2026-12-06-cpu-bwd-persistent/stage_split.sh). Each writes
# its logs to $OUT as it goes; the compile cache (/tmp/cfa) is shared across the calls.
#   run.sh tests  part b of the DSL; the persistent wgmma backward's GPU tests, the mod probe
#                 and the mods' GPU tests (tests/test_mods_gpu.py)
#   run.sh ab1    the persistent backward's A/B run 1, then racecheck and memcheck
#   run.sh ab2    its A/B run 2, then the mods against FlexAttention (bench_mods.py)
set -uo pipefail
bwd=docs/perf/2026-12-06-cpu-bwd-persistent
[ "$1" = tests ] && { bash .devpkgs/b/install.sh || exit 1; }
. /opt/cutedsl/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=/tmp/cfa
pytest="python -m pytest -q -p no:cacheprovider -n 8"
case $1 in
  tests)
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT"/env.txt
    python -c "import torch; print(torch.__version__, torch.version.cuda)" >> "$OUT"/env.txt
    # the mods first (this session's work), each part bounded so that its log comes back
    timeout ${MODS_S:-300} $pytest tests/test_mod_probe_gpu.py tests/test_mods_gpu.py \
      > "$OUT"/mods_gpu_tests.log 2>&1
    tail -3 "$OUT"/mods_gpu_tests.log
    timeout ${BWD_S:-240} $pytest tests/test_bwd_sm90_gpu.py -k persistent \
      > "$OUT"/bwd_persistent_tests.log 2>&1
    tail -3 "$OUT"/bwd_persistent_tests.log ;;
  ab1)
    python $bwd/ab_bwd_persistent.py "$OUT" 1 > "$OUT"/run1.log 2>&1; tail -8 "$OUT"/run1.log
    for tool in racecheck memcheck; do
      compute-sanitizer --tool $tool python $bwd/san.py > "$OUT"/sanitizer_$tool.log 2>&1
      tail -2 "$OUT"/sanitizer_$tool.log
    done ;;
  ab2)
    python $bwd/ab_bwd_persistent.py "$OUT" 2 > "$OUT"/run2.log 2>&1; tail -8 "$OUT"/run2.log
    python docs/perf/2026-12-06-mods/bench_mods.py "$OUT" > "$OUT"/bench_mods.log 2>&1
    tail -20 "$OUT"/bench_mods.log ;;
esac
true
