#!/usr/bin/env bash
# ncu profiles of cute_fa's forward ('auto') and flash-attn-4's on the peak shape and three of
# the shapes furthest behind. Usage: prof.sh OUT_DIR   (on the device, from the repo root)
set -u
out=$1; mkdir -p "$out"
here=$(dirname "$0")
for shape in "2 8192 16 16 128 0" "16 1024 16 16 128 1" "1 2000 32 8 128 1" "8 2048 32 32 64 1"; do
  for m in cute_fa flash_attn_4; do
    name="${m}_$(echo $shape | tr ' ' '_')"
    ncu --clock-control none --nvtx --nvtx-include "prof/" \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats \
        python "$here/prof.py" $m $shape > "$out/$name.txt" 2>&1
    echo "$name rc=$?"
  done
done
