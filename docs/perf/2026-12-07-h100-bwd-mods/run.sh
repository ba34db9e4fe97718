#!/usr/bin/env bash
# This session's second device call, on the warm machine that ran ../2026-12-07-cpu-bwd-mods/
# run.sh tests (half 1 of the DSL's part a staged first: carry .devpkgs/a1, bash
# .devpkgs/a1/install.sh). Carry .devpkgs/a2 and .devpkgs/b:
#   run.sh retest  the rest of the DSL; the GPU tests that failed in the first call (the mod
#                  probe, captured tensors' and block masks' gradients) again with this
#                  session's fixes; then the backward's benchmark and the mod tiles' A/B,
#                  each within a time bound
set -uo pipefail
bash .devpkgs/a2/install.sh && bash .devpkgs/b/install.sh || exit 1
. /opt/cutedsl/env.sh
sed -i 's/^FASTMATH = False/FASTMATH = True/' cute_fa/kernels/common/mods.py
sed -i 's/^WHOLE_TILES = False/WHOLE_TILES = True/; s/^SPARSE_BACKWARD = False/SPARSE_BACKWARD = True/' \
  cute_fa/mods/block_mask.py
export PYTHONPATH=$PWD:$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=/tmp/cfa
old=docs/perf/2026-12-07-cpu-bwd-mods
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT"/env.txt
timeout ${TEST_S:-200} python -m pytest -q -p no:cacheprovider -n 12 -rA \
  tests/test_mod_probe_gpu.py tests/test_mods_gpu.py -k "probe or gradients or block_mask" \
  > "$OUT"/retest_gpu_tests.log 2>&1
grep -E "FAILED|ERROR" "$OUT"/retest_gpu_tests.log | head -20; tail -2 "$OUT"/retest_gpu_tests.log
timeout ${BWD_S:-240} python $old/bench_mods_bwd.py "$OUT" ${SEQLENS:-4096,16384} \
  > "$OUT"/bench_mods_bwd.log 2>&1
tail -12 "$OUT"/bench_mods_bwd.log
timeout ${AB_S:-120} python docs/perf/2026-12-07-mods-tiles/ab_mod_tiles.py "$OUT" \
  ${SEQLENS:-4096,16384} > "$OUT"/ab_mod_tiles.log 2>&1
tail -12 "$OUT"/ab_mod_tiles.log
true
