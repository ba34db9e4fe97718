export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=$PWD/.cfacache
python -m compileall -q -j 16 /opt/cutedsl/site $PWD/cute_fa > /dev/null 2>&1
(cd tests && timeout 150 python gpu_grid.py sm_90a 14 > /tmp/grid.log 2>&1); tail -1 /tmp/grid.log
T=$(mktemp -d)
python -m pytest -q --collect-only ${TEST_FILES:-tests/test_decode_gpu.py tests/test_forward_gpu.py tests/test_probe_gpu.py tests/test_varlen_gpu.py tests/test_hf_gpu.py} 2>/dev/null | grep "::" > $T/ids.txt
wc -l $T/ids.txt
split -n r/12 $T/ids.txt $T/shard_
for f in $T/shard_*; do (timeout ${SHARD_TIMEOUT:-420} python -m pytest -q -p no:cacheprovider --maxfail=30 $(cat $f) > $f.log 2>&1; echo "rc=$?" >> $f.log) & done
wait
cat $T/shard_*.log > $OUT/gpu_tests.log
grep -E "passed|failed|rc=" $OUT/gpu_tests.log
grep -E "^(FAILED|ERROR)" $OUT/gpu_tests.log | head -40
ls .cfacache | wc -l
