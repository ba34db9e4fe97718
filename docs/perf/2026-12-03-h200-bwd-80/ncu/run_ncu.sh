# the source-level ncu of docs/perf/2026-12-03-h200-bwd-80 (run from the repository root, ncu on PATH)
prof() {  # name who d causal regex [entry]
  timeout 75 ncu --profile-from-start off --clock-control none -k regex:$5 -c 1 \
    --section SourceCounters --section WarpStateStats --section InstructionStats --section SpeedOfLight \
    -f -o /tmp/$1 python docs/perf/2026-12-03-h200-bwd-80/ncu/prof_one.py $2 $3 $4 ${6:+"$6"} > ${OUT:-/tmp}/ncu_$1.log 2>&1
  ncu -i /tmp/$1.ncu-rep --page source --print-source sass --csv > /tmp/$1_sass.csv 2>>${OUT:-/tmp}/ncu_$1.log
  ncu -i /tmp/$1.ncu-rep --page details --csv > ${OUT:-/tmp}/$1_details.csv 2>>${OUT:-/tmp}/ncu_$1.log
  gzip -c /tmp/$1_sass.csv > ${OUT:-/tmp}/$1_sass.csv.gz
}
prof ours128 ours 128 0 FlashBwdSm90
prof fa4_128 fa4 128 0 BackwardSm90
prof ours64 ours 64 1 FlashBwdSm90 "(64, 1, 2, 2, False, True)"  # the head_dim 64 tile shipped before
