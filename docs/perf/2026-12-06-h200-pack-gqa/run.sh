#!/usr/bin/env bash
# The device calls of this run, from the repo root on the lent GPU. Step a stages the DSL's
# compiler (`../shared/device/cutedsl-bundle`, part a); the others share one compile cache and
# one results folder on the machine (/tmp), copied to $OUT at the end of each call.
#   run.sh b       part b of the DSL, the packed kernel's GPU tests, the A/B's compiles
#   run.sh 1       A/B run 1 and the fit;  run.sh 2   run 2 and the decision
set -uo pipefail
here=docs/perf/2026-12-06-h200-pack-gqa
[ "$1" = b ] && { bash .devpkgs/b/install.sh || exit 1; }
. /opt/cutedsl/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=/tmp/cfa
mkdir -p /tmp/ab
case $1 in
  b) nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > /tmp/ab/env.txt
     python -c "import torch; print(torch.__version__, torch.version.cuda)" >> /tmp/ab/env.txt
     python -m pytest -q -p no:cacheprovider -n 8 tests/test_pack_gqa_gpu.py 2>&1 \
       | tee /tmp/ab/gpu_tests_packed.log | tail -25
     python $here/ab_pack.py /tmp/ab warm 2>&1 | tee /tmp/ab/warm.log | tail -8 ;;
  1|2|3) python $here/ab_pack.py /tmp/ab "$1" 2>&1 | tee /tmp/ab/run$1.log | tail -15 ;;
esac
case $1 in
  b) files="env.txt gpu_tests_packed.log warm.log" ;;
  1) files="run1.json run1.log fit.json" ;;
  2) files="run2.json run2.log decision.json" ;;
  3) files="run3.json run3.log confirm.json" ;;
esac
for f in $files; do cp /tmp/ab/$f "$OUT"/ 2>/dev/null; done
true
