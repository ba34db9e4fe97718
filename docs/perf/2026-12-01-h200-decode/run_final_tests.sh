export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
export CUTE_FA_CACHE_DIR=$PWD/.cfacache
python -m compileall -q -j 16 /opt/cutedsl/site $PWD/cute_fa > /dev/null 2>&1
(cd tests && timeout 90 python gpu_grid.py sm_90a 16 > /tmp/grid.log 2>&1); tail -1 /tmp/grid.log
python -m pytest -q --collect-only tests/test_decode_gpu.py 2>/dev/null | grep "::" > /tmp/ids.txt
split -n r/8 /tmp/ids.txt /tmp/shard_
for f in /tmp/shard_*; do (timeout 150 python -m pytest -q -p no:cacheprovider $(cat $f) > $f.log 2>&1; echo "rc=$?" >> $f.log) & done
wait
timeout 100 python -m pytest -q -p no:cacheprovider tests/test_forward_gpu.py tests/test_probe_gpu.py > $OUT/forward_tests.log 2>&1
cat /tmp/shard_*.log > $OUT/decode_tests.log; grep -E "passed|failed|rc=" $OUT/decode_tests.log; tail -2 $OUT/forward_tests.log
grep -E "^(FAILED|ERROR)" $OUT/decode_tests.log $OUT/forward_tests.log | head -30
timeout 40 python .dbg/host_overhead.py 2>&1 | tee $OUT/host_overhead.txt
