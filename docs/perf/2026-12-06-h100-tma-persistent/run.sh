#!/usr/bin/env bash
# The device calls of this run, from the repo root on the lent GPU. Step a stages the DSL's
# compiler (`../shared/device/cutedsl-bundle`, part a); the others share one compile cache and
# one results folder on the machine (/tmp), copied to $OUT at the end of each call.
#   run.sh b    part b of the DSL; the persistent TMA GPU tests, the page-prefetch decode
#               test last session could not run, racecheck and memcheck of san.py
#   run.sh 1    A/B run 1 and the rule's summary;  run.sh 2   run 2 (new shapes)
set -uo pipefail
here=docs/perf/2026-12-06-h100-tma-persistent
[ "$1" = b ] && { bash .devpkgs/b/install.sh || exit 1; }
. /opt/cutedsl/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=/tmp/cfa
mkdir -p /tmp/ab
case $1 in
  b) nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > /tmp/ab/env.txt
     python -c "import torch; print(torch.__version__, torch.version.cuda)" >> /tmp/ab/env.txt
     python -m pytest -q -p no:cacheprovider -n 8 tests/test_forward_gpu.py \
       -k "persistent_tma" 2>&1 | tee /tmp/ab/gpu_tests.log | tail -6
     python -m pytest -q -p no:cacheprovider -n 4 tests/test_decode_gpu.py \
       -k "page_prefetch" 2>&1 | tee /tmp/ab/gpu_decode_prefetch_test.log | tail -4
     for tool in racecheck memcheck; do
       compute-sanitizer --tool $tool python $here/san.py > /tmp/ab/sanitizer_$tool.log 2>&1
       tail -3 /tmp/ab/sanitizer_$tool.log
     done ;;
  1|2) python $here/ab_tma_persistent.py /tmp/ab "$1" 2>&1 | tee /tmp/ab/run$1.log | tail -12 ;;
esac
case $1 in
  b) files="env.txt gpu_tests.log gpu_decode_prefetch_test.log sanitizer_racecheck.log
            sanitizer_memcheck.log" ;;
  *) files="ab_tma_persistent_run$1.json run$1.log" ;;
esac
for f in $files; do cp /tmp/ab/$f "$OUT"/ 2>/dev/null; done
true
