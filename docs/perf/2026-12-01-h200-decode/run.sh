set -x
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
export CUTE_FA_CACHE_DIR=$PWD/.cfacache
python -m compileall -q -j 16 /opt/cutedsl/site $PWD/cute_fa > /dev/null 2>&1
(cd tests && timeout 60 python gpu_grid.py sm_90a 16 > /tmp/grid.log 2>&1 &)
timeout 100 python .dbg/sweep_splits.py variants 2>&1 | tee $OUT/sweep_variants.txt
BEST=$(python - <<'PY'
import json, math, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/sweep_variants.txt") if l.startswith("{")]
names = [k for k in rows[0] if k.startswith("v")]
g = {n: math.exp(sum(math.log(r[n][0]) for r in rows) / len(rows)) for n in names}
print(min(g, key=g.get))
PY
)
echo "best variant: $BEST" | tee -a $OUT/sweep_variants.txt
python .dbg/variants.py cute_fa/tuning.py $BEST
cp cute_fa/tuning.py $OUT/tuning.py
timeout 60 python .dbg/precompile_sweep.py 16 $BEST
mkdir -p $OUT/decode
timeout 250 python -m cute_fa bench --decode --out $OUT/decode > $OUT/decode/bench.log 2>&1; tail -3 $OUT/decode/bench.log
python -m pytest -q --collect-only tests/test_decode_gpu.py 2>/dev/null | grep "::" > /tmp/ids.txt
split -n r/8 /tmp/ids.txt /tmp/shard_
for f in /tmp/shard_*; do (timeout 150 python -m pytest -q -p no:cacheprovider $(cat $f) > $f.log 2>&1; echo "rc=$?" >> $f.log) & done
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_forward_gpu.py tests/test_probe_gpu.py > $OUT/forward_tests.log 2>&1
wait
cat /tmp/shard_*.log > $OUT/decode_tests.log; grep -E "passed|failed|rc=" $OUT/decode_tests.log; tail -2 $OUT/forward_tests.log
grep -E "^(FAILED|ERROR)" $OUT/decode_tests.log $OUT/forward_tests.log | head -30
