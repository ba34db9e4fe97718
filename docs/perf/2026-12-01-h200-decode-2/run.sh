export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 CUTE_FA_CACHE_DIR=$PWD/.cfacache
python -m compileall -q -j 16 /opt/cutedsl/site $PWD/cute_fa > /dev/null 2>&1
for d in 64 128; do for g in 1 4 8; do (timeout 150 python -c "import cute_fa; cute_fa.precompile(head_dims=($d,), dtypes='bfloat16', causal=True, decode_groups=($g,), page_sizes=(64, 256))" > /tmp/pre_${d}_${g}.log 2>&1 &); done; done
for v in new rows64; do (timeout 150 python .dbg/ws_sweep.py warm $v > /tmp/warm_$v.log 2>&1 &); done
python -m pytest -q --collect-only tests/test_decode_gpu.py 2>/dev/null | grep "::" > /tmp/ids.txt
split -n r/8 /tmp/ids.txt /tmp/shard_
for f in /tmp/shard_*; do (timeout 200 python -m pytest -q -p no:cacheprovider $(cat $f) > $f.log 2>&1; echo "rc=$?" >> $f.log) & done
wait
sleep 1; while pgrep -f "cute_fa.precompile|ws_sweep.py warm" > /dev/null; do sleep 2; done
cat /tmp/shard_*.log > $OUT/decode_tests.log; grep -E "passed|failed" $OUT/decode_tests.log | tr '\n' ' '; echo
grep -E "^(FAILED|ERROR)" $OUT/decode_tests.log | head -20
cat /tmp/warm_*.log
timeout 100 python .dbg/ws_sweep.py time new rows64 2>&1 | tee $OUT/sweep.txt
mkdir -p $OUT/decode
timeout 300 python -m cute_fa bench --decode --out $OUT/decode > $OUT/decode/bench.log 2>&1; sed -n 14,18p $OUT/decode/decode.md
