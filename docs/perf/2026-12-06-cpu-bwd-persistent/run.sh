#!/usr/bin/env bash
# The device calls for this folder, from the repo root on the lent GPU, after the DSL's part a
# is staged in two calls (`stage_split.sh`: with this tree part a no longer fits one call).
# The steps share one compile cache and one results folder (/tmp), copied to $OUT at the end
# of each call.
#   run.sh b    part b of the DSL; the persistent backward's GPU tests, racecheck and
#               memcheck of san.py
#   run.sh 1    A/B run 1 and the rule's summary;  run.sh 2   run 2 (new shapes)
#   run.sh all  part b, the tests, A/B run 1, then racecheck and memcheck, each file written
#               to $OUT as it is made (for a call that may run out of time)
set -uo pipefail
here=docs/perf/2026-12-06-cpu-bwd-persistent
case $1 in b|all) bash .devpkgs/b/install.sh || exit 1 ;; esac
. /opt/cutedsl/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=/tmp/cfa
mkdir -p /tmp/ab
case $1 in
  b) nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > /tmp/ab/env.txt
     python -c "import torch; print(torch.__version__, torch.version.cuda)" >> /tmp/ab/env.txt
     python -m pytest -q -p no:cacheprovider -n 8 tests/test_bwd_sm90_gpu.py \
       -k "persistent" 2>&1 | tee /tmp/ab/gpu_tests.log | tail -4
     for tool in racecheck memcheck; do
       compute-sanitizer --tool $tool python $here/san.py > /tmp/ab/sanitizer_$tool.log 2>&1
       tail -2 /tmp/ab/sanitizer_$tool.log
     done ;;
  1|2) python $here/ab_bwd_persistent.py /tmp/ab "$1" 2>&1 | tee /tmp/ab/run$1.log | tail -12 ;;
  all) nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT"/env.txt
       python -c "import torch; print(torch.__version__, torch.version.cuda)" >> "$OUT"/env.txt
       python -m pytest -q -p no:cacheprovider -n 8 tests/test_bwd_sm90_gpu.py \
         -k "persistent" > "$OUT"/gpu_tests.log 2>&1; tail -3 "$OUT"/gpu_tests.log
       python $here/ab_bwd_persistent.py "$OUT" 1 > "$OUT"/run1.log 2>&1
       tail -8 "$OUT"/run1.log
       for tool in racecheck memcheck; do
         compute-sanitizer --tool $tool python $here/san.py > "$OUT"/sanitizer_$tool.log 2>&1
         tail -2 "$OUT"/sanitizer_$tool.log
       done
       exit 0 ;;
esac
case $1 in
  b) files="env.txt gpu_tests.log sanitizer_racecheck.log sanitizer_memcheck.log" ;;
  *) files="ab_bwd_persistent_run$1.json run$1.log" ;;
esac
for f in $files; do cp /tmp/ab/$f "$OUT"/ 2>/dev/null; done
true
