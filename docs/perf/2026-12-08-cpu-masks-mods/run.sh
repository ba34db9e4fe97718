#!/usr/bin/env bash
# What this session built on the CPU and a GPU must check, from the repo root, after staging
# the DSL (../2026-12-06-cpu-bwd-persistent/stage_split.sh; first call: carry .devpkgs/a1 and
# run `bash .devpkgs/a1/install.sh`; within 30 s the next, which `check` is):
#   run.sh check   carry .devpkgs/a2 and .devpkgs/b: the ragged and paged block-mask GPU tests
#                  (block_mask.SEQUENCE_BLOCK_MASKS turns on when they pass), the mods' GPU
#                  tests whose kernels changed (score_mods: their derivatives' and the score's
#                  folded constants), the block-mask tests (a shared helper, PTX unchanged)
#   run.sh bench   the softcap score_mod's backward against the built-in softcap and
#                  FlexAttention (its constants folded), the window backward's head splits, and
#                  a ragged batch's tile order (tuning.VARLEN_ORDER turns on where it wins),
#                  a block mask's backward with causal's head splits
set -uo pipefail
if [ "$1" = check ]; then
  bash .devpkgs/a2/install.sh && bash .devpkgs/b/install.sh || exit 1
fi
. /opt/cutedsl/env.sh
export PYTHONPATH=$PWD:$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=/tmp/cfa
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > "$OUT"/env.txt
case $1 in
  check)
    timeout 300 python -m pytest -q -p no:cacheprovider -n 8 -rfE \
      tests/test_block_mask_ragged_gpu.py tests/test_ragged_order_gpu.py \
      > "$OUT"/ragged_block_mask_gpu.log 2>&1
    grep -E "^(FAILED|ERROR)" "$OUT"/ragged_block_mask_gpu.log | head -20
    tail -1 "$OUT"/ragged_block_mask_gpu.log
    timeout 250 python -m pytest -q -p no:cacheprovider -n 8 -rfE tests/test_mods_gpu.py \
      -k "softcap or alibi or relative_bias or gradients or block_mask or builtins" \
      > "$OUT"/mods_gpu.log 2>&1
    grep -E "^(FAILED|ERROR)" "$OUT"/mods_gpu.log | head -20
    tail -1 "$OUT"/mods_gpu.log ;;
  bench)
    ONLY=softcap timeout 300 python docs/perf/2026-12-07-cpu-bwd-mods/bench_mods_bwd.py "$OUT" \
      4096,16384 > "$OUT"/bench_mods_bwd_softcap.log 2>&1
    tail -c 2000 "$OUT"/bench_mods_bwd_softcap.log
    timeout 200 python docs/perf/2026-12-07-cpu-window-bwd/ab_window_splits.py "$OUT" \
      4096,16384 > "$OUT"/ab_window_splits.log 2>&1
    tail -c 2000 "$OUT"/ab_window_splits.log
    timeout 240 python docs/perf/2026-12-08-cpu-masks-mods/ab_varlen_order.py "$OUT" \
      > "$OUT"/ab_varlen_order.log 2>&1
    tail -c 3000 "$OUT"/ab_varlen_order.log
    timeout 150 python docs/perf/2026-12-08-cpu-masks-mods/ab_block_mask_splits.py "$OUT" \
      4096,16384 > "$OUT"/ab_block_mask_splits.log 2>&1
    tail -c 2000 "$OUT"/ab_block_mask_splits.log ;;
esac
true
