#!/usr/bin/env bash
# ncu of the packed and unpacked wgmma forward and flash-attn-4 on two small-batch head_dim-64
# shapes; a summary of each profile's headline counters goes to OUT_DIR/ncu_summary.txt.
# Usage: prof.sh OUT_DIR   (on the device, from the repo root)
set -u
out=$1; mkdir -p "$out"
prof=$(dirname "$0")/../2026-12-04-h200-mask/prof.py
for shape in "4 1024 64 8 64 1" "1 2000 64 8 64 1"; do
  for m in unpacked packed flash_attn_4; do
    echo "== $m $shape" >> "$out/ncu_summary.txt"
    ncu --clock-control none --nvtx --nvtx-include "prof/" \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        python "$prof" $m $shape 2>&1 | grep -E "^  [a-zA-Z_]+.*\(|Duration|Executed Instructions  |Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|DRAM Throughput|Grid Size|Issue Slots Busy|L1/TEX Hit" >> "$out/ncu_summary.txt"
  done
done
