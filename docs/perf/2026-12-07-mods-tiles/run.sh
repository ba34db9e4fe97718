#!/usr/bin/env bash
# This session's device calls, from the repo root on one warm machine, after part a of the DSL
# is staged in two calls (docs/perf/2026-12-06-cpu-bwd-persistent/stage_split.sh). Logs go to
# $OUT; the compile cache (/tmp/cfa) is shared across the calls.
#   run.sh tests  part b of the DSL; the mods' GPU tests (FASTMATH and WHOLE_TILES on, block
#                 masks on tiles fitted to their blocks or reading their kinds, head_dim 64's
#                 128-row tile with mods, captured tensors' gradients, block masks' backward)
#   run.sh new    part b; this session's new GPU cases alone (a short device budget)
#   run.sh bench [SEQLENS]  the mods against FlexAttention and the built-ins
#                 (../2026-12-06-mods/bench_mods.py, unchanged), S 1k, 4k and 16k by default
#   run.sh ab [SEQLENS]     ab_mod_tiles.py: the tiles for mods, new against old
set -uo pipefail
case $1 in tests|new) bash .devpkgs/b/install.sh || exit 1 ;; esac
. /opt/cutedsl/env.sh
export PYTHONPATH=$PWD:$PWD/tests:$PYTHONPATH PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=/tmp/cfa
pytest="python -m pytest -q -p no:cacheprovider -n 12"
here=docs/perf/2026-12-07-mods-tiles
case $1 in
  tests)
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT"/env.txt
    python -c "import torch; print(torch.__version__, torch.version.cuda)" >> "$OUT"/env.txt
    timeout ${MODS_S:-300} $pytest tests/test_mod_probe_gpu.py tests/test_mods_gpu.py \
      > "$OUT"/mods_gpu_tests.log 2>&1
    tail -3 "$OUT"/mods_gpu_tests.log ;;
  new)  # this session's GPU cases alone, where the device time left is short
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT"/env.txt
    timeout ${MODS_S:-200} $pytest tests/test_mods_gpu.py -k "lists_decide or \
      captured_tensor or block_mask_gradients or under_torch_compile" \
      > "$OUT"/new_gpu_tests.log 2>&1
    tail -3 "$OUT"/new_gpu_tests.log ;;
  bench)
    timeout ${BENCH_S:-560} python docs/perf/2026-12-06-mods/bench_mods.py "$OUT" \
      ${2:-1024,4096,16384} bench_mods > "$OUT"/bench_mods.log 2>&1
    tail -20 "$OUT"/bench_mods.log ;;
  ab)
    timeout ${AB_S:-400} python $here/ab_mod_tiles.py "$OUT" ${2:-1024,4096,16384} \
      > "$OUT"/ab_mod_tiles.log 2>&1
    tail -20 "$OUT"/ab_mod_tiles.log ;;
esac
true
