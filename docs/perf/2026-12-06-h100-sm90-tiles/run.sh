#!/usr/bin/env bash
# The device calls of this run, from the repo root on the lent GPU, after part a of the DSL
# (`../shared/device/cutedsl-bundle`, split by ../2026-12-06-cpu-bwd-persistent/stage_split.sh)
# was staged by two calls on the same warm machine. The calls share one compile cache and one
# results folder on the machine (/tmp), copied to $OUT at the end of each.
#   run.sh b    part b of the DSL, the wgmma forward's GPU tests, the A/B's compiles
#   run.sh 1    A/B run 1, with the peers;   run.sh 2   A/B run 2 (cute_fa's variants alone)
set -uo pipefail
here=docs/perf/2026-12-06-h100-sm90-tiles
[ "$1" = b ] && { bash .devpkgs/b/install.sh || exit 1; }
. /opt/cutedsl/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=/tmp/cfa
mkdir -p /tmp/ab
case $1 in
  b) nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > /tmp/ab/env.txt
     python -c "import torch; print(torch.__version__, torch.version.cuda)" >> /tmp/ab/env.txt
     python -m pytest -q -p no:cacheprovider -n 12 tests/test_forward_gpu.py -k "sm90 or wide \
       or persistent_forward" tests/test_pack_gqa_gpu.py 2>&1 | tee /tmp/ab/gpu_tests.log \
       | tail -25
     python $here/ab_tiles.py /tmp/ab warm 2>&1 | tail -3 > /tmp/ab/warm.log; cat /tmp/ab/warm.log
     files="env.txt gpu_tests.log warm.log" ;;
  1) python $here/ab_tiles.py /tmp/ab 1 peers 2>&1 | tee /tmp/ab/run1.log | tail -60
     files="run1.json run1.log" ;;
  2) python $here/ab_tiles.py /tmp/ab 2 2>&1 | tee /tmp/ab/run2.log | tail -60
     files="run2.json run2.log" ;;
  t) python -m pytest -q -p no:cacheprovider -n 12 tests/test_varlen_gpu.py tests/test_mods_gpu.py \
       -k "sm90" 2>&1 | tee /tmp/ab/gpu_tests_more.log | tail -15
     files="gpu_tests_more.log" ;;
esac
for f in $files; do cp /tmp/ab/$f "$OUT"/ 2>/dev/null; done
true
