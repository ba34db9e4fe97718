#!/usr/bin/env bash
# The device calls of this run, from the repo root on the lent GPU. Step a stages the DSL's
# compiler (`../shared/device/cutedsl-bundle`, part a); the others share one compile cache and
# one results folder on the machine (/tmp), copied to $OUT at the end of each call.
#   run.sh b    part b of the DSL, the decode GPU tests (both page-lookup forms), the first
#               call of a new process per head_dim class (bench.grid.start_times), memcheck
#   run.sh 1    A/B run 1 and its rule;  run.sh 2   run 2 (new shapes) and the rule again
set -uo pipefail
here=docs/perf/2026-12-06-h100-page-prefetch
[ "$1" = b ] && { bash .devpkgs/b/install.sh || exit 1; }
. /opt/cutedsl/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=/tmp/cfa
mkdir -p /tmp/ab
case $1 in
  b) nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > /tmp/ab/env.txt
     python -c "import torch; print(torch.__version__, torch.version.cuda)" >> /tmp/ab/env.txt
     python -m pytest -q -p no:cacheprovider -n 8 tests/test_decode_gpu.py 2>&1 \
       | tee /tmp/ab/gpu_decode_tests.log | tail -15
     python -c "import json; from cute_fa.bench.grid import START_CONFIGS, start_times
print(json.dumps([dict(head_dim=d, causal=c, **start_times(d, c)) for d, c in START_CONFIGS],
                 indent=1))" > /tmp/ab/cold_start.json; tail -c 300 /tmp/ab/cold_start.json
     for tool in memcheck; do
       compute-sanitizer --tool $tool python $here/san.py > /tmp/ab/sanitizer_$tool.log 2>&1
       tail -3 /tmp/ab/sanitizer_$tool.log
     done ;;
  1|2) python $here/ab_prefetch.py /tmp/ab "$1" 2>&1 | tee /tmp/ab/run$1.log | tail -14 ;;
esac
case $1 in
  b) files="env.txt gpu_decode_tests.log cold_start.json sanitizer_memcheck.log" ;;
  *) files="ab_prefetch_run$1.json run$1.log" ;;
esac
for f in $files; do cp /tmp/ab/$f "$OUT"/ 2>/dev/null; done
true
