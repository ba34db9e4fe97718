#!/usr/bin/env bash
# This session's device calls, from the repo root on one warm machine, after half 1 of the DSL's
# part a is staged (carry .devpkgs/a1: bash .devpkgs/a1/install.sh). Logs go to $OUT as they are
# written; the compile cache (/tmp/cfa) is shared across the calls.
#   run.sh tests   carry .devpkgs/a2 and .devpkgs/b: the rest of the DSL, then the mods' GPU
#                  tests with FASTMATH, WHOLE_TILES and SPARSE_BACKWARD on (both backwards), and
#                  gpt-oss through the HF integration
#   run.sh quick   as tests, this session's changes alone (a short device budget)
#   run.sh bench [SEQLENS] fwd then bwd, each within a time bound (one call)
#   run.sh fwd [SEQLENS]  the mods' forward against FlexAttention (../2026-12-06-mods/)
#   run.sh bwd [SEQLENS]  their backward (bench_mods_bwd.py)
#   run.sh ab [SEQLENS]   ../2026-12-07-mods-tiles/ab_mod_tiles.py, the tiles for mods
set -uo pipefail
if [ "$1" = tests ] || [ "$1" = quick ]; then
  bash .devpkgs/a2/install.sh && bash .devpkgs/b/install.sh || exit 1
fi
. /opt/cutedsl/env.sh
# The switches this run checks, set in the device's copy of the tree (each call gets a fresh
# copy): FASTMATH shapes the compiled code, so it is a source edit (which also changes the
# disk cache's fingerprint), not a monkeypatch; WHOLE_TILES and SPARSE_BACKWARD go with it.
# tuning_bwd.SM90_MODS stays off here: the tests and bench_mods_bwd.py run both backwards.
sed -i 's/^FASTMATH = False/FASTMATH = True/' cute_fa/kernels/common/mods.py
sed -i 's/^WHOLE_TILES = False/WHOLE_TILES = True/; s/^SPARSE_BACKWARD = False/SPARSE_BACKWARD = True/' \
  cute_fa/mods/block_mask.py
export PYTHONPATH=$PWD:$PWD/tests:$PYTHONPATH PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=/tmp/cfa
here=docs/perf/2026-12-07-cpu-bwd-mods
case $1 in
  tests)
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT"/env.txt
    python -c "import torch; print(torch.__version__, torch.version.cuda)" >> "$OUT"/env.txt
    timeout ${MODS_S:-420} python -m pytest -q -p no:cacheprovider -n 12 --durations=15 \
      tests/test_mod_probe_gpu.py tests/test_mods_gpu.py tests/test_hf_gpu.py \
      -k "not test_hf_gpu or gpt_oss" > "$OUT"/mods_gpu_tests.log 2>&1
    grep -E "FAILED|ERROR" "$OUT"/mods_gpu_tests.log | head -30; tail -3 "$OUT"/mods_gpu_tests.log ;;
  quick)  # what this session changed, where the device time left is short: both backwards'
    # gradients through mods, captured tensors and block masks, the block-mask forwards
    # (the TMA kernel's new), gpt-oss
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT"/env.txt
    timeout ${MODS_S:-200} python -m pytest -q -p no:cacheprovider -n 12 \
      tests/test_mods_gpu.py tests/test_hf_gpu.py -k "gradients or block_mask or gpt_oss" \
      > "$OUT"/quick_gpu_tests.log 2>&1
    grep -E "FAILED|ERROR" "$OUT"/quick_gpu_tests.log | head -30; tail -3 "$OUT"/quick_gpu_tests.log ;;
  bench)  # the forward's and the backward's benchmarks at S 4k and 16k, each bounded
    BENCH_S=${FWD_S:-230} bash $here/run.sh fwd ${2:-4096,16384}
    BENCH_S=${BWD_S:-300} bash $here/run.sh bwd ${2:-4096,16384} ;;
  fwd)
    timeout ${BENCH_S:-560} python docs/perf/2026-12-06-mods/bench_mods.py "$OUT" \
      ${2:-1024,4096,16384} bench_mods > "$OUT"/bench_mods.log 2>&1
    tail -20 "$OUT"/bench_mods.log ;;
  bwd)
    timeout ${BENCH_S:-560} python $here/bench_mods_bwd.py "$OUT" ${2:-1024,4096,16384} \
      > "$OUT"/bench_mods_bwd.log 2>&1
    tail -20 "$OUT"/bench_mods_bwd.log ;;
  ab)
    timeout ${AB_S:-400} python docs/perf/2026-12-07-mods-tiles/ab_mod_tiles.py "$OUT" \
      ${2:-1024,4096,16384} > "$OUT"/ab_mod_tiles.log 2>&1
    tail -20 "$OUT"/ab_mod_tiles.log ;;
esac
true
