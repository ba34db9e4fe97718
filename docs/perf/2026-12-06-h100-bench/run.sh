#!/usr/bin/env bash
# The benchmark calls of this run, from the repo root on the lent GPU, after
# docs/perf/2026-12-06-h100-tma-persistent/run.sh has staged the DSL on the same warm
# machine.
#   run.sh decode | prefill | grid     one benchmark per call (each fits a call's 10 minutes)
set -uo pipefail
. /opt/cutedsl/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=/tmp/cfa
case $1 in
  decode)  python -m cute_fa bench --decode --out "$OUT/decode" 2>&1 | tail -8 ;;
  prefill) python -m cute_fa bench --prefill --out "$OUT/prefill" 2>&1 | tail -8 ;;
  grid)    python -m cute_fa bench --out "$OUT/grid" 2>&1 | tail -8 ;;
esac
