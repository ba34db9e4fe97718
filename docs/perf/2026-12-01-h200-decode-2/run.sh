export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=$PWD/.cfacache
python -m compileall -q -j 16 /opt/cutedsl/site $PWD/cute_fa > /dev/null 2>&1
for d in 64 128; do for g in 1 4 8; do (timeout 150 python -c "import cute_fa; cute_fa.precompile(head_dims=($d,), dtypes='bfloat16', causal=True, decode_groups=($g,), page_sizes=(64, 256))" > /tmp/pre_${d}_${g}.log 2>&1 &); done; done
(cd tests && timeout 150 python gpu_grid.py sm_90a 10 > /tmp/grid.log 2>&1); tail -1 /tmp/grid.log
python -m pytest -q --collect-only tests/test_decode_gpu.py 2>/dev/null | grep "::" > /tmp/ids.txt
split -n r/8 /tmp/ids.txt /tmp/shard_
for f in /tmp/shard_*; do (timeout 200 python -m pytest -q -p no:cacheprovider $(cat $f) > $f.log 2>&1; echo "rc=$?" >> $f.log) & done
timeout 200 python -m pytest -q -p no:cacheprovider tests/test_forward_gpu.py tests/test_probe_gpu.py > $OUT/forward_tests.log 2>&1
wait
while pgrep -f "cute_fa.precompile" > /dev/null; do sleep 2; done
cat /tmp/shard_*.log > $OUT/decode_tests.log; grep -E "passed|failed|rc=" $OUT/decode_tests.log; tail -2 $OUT/forward_tests.log
grep -E "^(FAILED|ERROR)" $OUT/decode_tests.log $OUT/forward_tests.log | head -30
ls .cfacache | wc -l
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=$PWD/.cfacache
mkdir -p $OUT/decode
timeout 420 python -m cute_fa bench --decode --out $OUT/decode > $OUT/decode/bench.log 2>&1; tail -5 $OUT/decode/bench.log
timeout 60 python docs/perf/2026-12-01-h200-decode/host_overhead.py 2>&1 | tee $OUT/host_overhead.txt
