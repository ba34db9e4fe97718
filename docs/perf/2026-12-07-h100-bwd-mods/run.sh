#!/usr/bin/env bash
# This session's later device calls, on one warm machine, after half 1 of the DSL's part a is
# staged (carry .devpkgs/a1: bash .devpkgs/a1/install.sh). The first calls ran
# ../2026-12-07-cpu-bwd-mods/run.sh tests and fwd on a machine that then went back.
#   run.sh retest  carry .devpkgs/a2 and .devpkgs/b: the rest of the DSL; the GPU tests that
#                  failed in the first call (the mod probe, captured tensors' and block masks'
#                  gradients) again with this session's fixes; ab_switches.py
#   run.sh bench   the backward's benchmark (../2026-12-07-cpu-bwd-mods/bench_mods_bwd.py)
#                  and the mod tiles' A/B (../2026-12-07-mods-tiles/ab_mod_tiles.py)
# Each part runs within a time bound; the switches are set in the device's copy as the first
# calls had them (FASTMATH, WHOLE_TILES, SPARSE_BACKWARD on).
set -uo pipefail
if [ "$1" = retest ]; then
  bash .devpkgs/a2/install.sh && bash .devpkgs/b/install.sh || exit 1
fi
. /opt/cutedsl/env.sh
sed -i 's/^FASTMATH = False/FASTMATH = True/' cute_fa/kernels/common/mods.py
sed -i 's/^WHOLE_TILES = False/WHOLE_TILES = True/; s/^SPARSE_BACKWARD = False/SPARSE_BACKWARD = True/' \
  cute_fa/mods/block_mask.py
export PYTHONPATH=$PWD:$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=/tmp/cfa
here=docs/perf/2026-12-07-h100-bwd-mods
seqlens=${SEQLENS:-4096,16384}
case $1 in
  retest)
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT"/env.txt
    timeout ${TEST_S:-200} python -m pytest -q -p no:cacheprovider -n 12 -rfE \
      tests/test_mod_probe_gpu.py tests/test_mods_gpu.py -k "probe or gradients or block_mask" \
      > "$OUT"/retest_gpu_tests.log 2>&1
    grep -E "^(FAILED|ERROR)" "$OUT"/retest_gpu_tests.log | head -20
    tail -1 "$OUT"/retest_gpu_tests.log
    timeout ${AB_S:-200} python $here/ab_switches.py "$OUT" $seqlens > "$OUT"/ab_switches.log 2>&1
    tail -c 1500 "$OUT"/ab_switches.log ;;
  bench)
    timeout ${BWD_S:-300} python docs/perf/2026-12-07-cpu-bwd-mods/bench_mods_bwd.py "$OUT" \
      $seqlens > "$OUT"/bench_mods_bwd.log 2>&1
    tail -c 1500 "$OUT"/bench_mods_bwd.log
    timeout ${AB_S:-150} python docs/perf/2026-12-07-mods-tiles/ab_mod_tiles.py "$OUT" \
      $seqlens > "$OUT"/ab_mod_tiles.log 2>&1
    tail -c 1500 "$OUT"/ab_mod_tiles.log ;;
esac
true
