set -x
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
export CUTE_FA_CACHE_DIR=$PWD/.cfacache
python -m compileall -q -j 16 /opt/cutedsl/site $PWD/cute_fa > /dev/null 2>&1
cat > /tmp/st.py <<'PY'
import json, sys
from cute_fa.bench import START_CONFIGS, start_times
for rep in range(int(sys.argv[1])):
    for d, c in START_CONFIGS:
        r = start_times(d, c)
        print(json.dumps(dict(rep=rep, head_dim=d, causal=c, cold=round(r["cold_cache"]["after_torch"], 3), warm=round(r["warm_cache"]["after_torch"], 3), cold_total=round(r["cold_cache"]["process_total"], 3))), flush=True)
PY
timeout 100 python /tmp/st.py 2 2>&1 | tee $OUT/start_times.txt
(cd tests && timeout 60 python gpu_grid.py sm_90a 16 > /tmp/grid.log 2>&1 &)
timeout 75 python .dbg/sweep_splits.py stages 2>&1 | tee $OUT/sweep_stages.txt
BEST=$(python - <<'PY'
import json, math
rows = [json.loads(l) for l in open("/tmp/out_stages.txt")] if False else [json.loads(l) for l in open(__import__("os").environ["OUT"] + "/sweep_stages.txt") if l.startswith("{")]
g = {st: math.exp(sum(math.log(r[f"stages{st}"][0]) for r in rows) / len(rows)) for st in (0, 2, 3)}
print(min(g, key=g.get))
PY
)
echo "best stages: $BEST" | tee -a $OUT/sweep_stages.txt
mkdir -p $OUT/decode
timeout 60 python .dbg/precompile_sweep.py 16 $BEST
timeout 260 python -c "import cute_fa.tuning as t; t.DECODE_KV_STAGES = $BEST; from cute_fa.bench import decode_main; decode_main('$OUT/decode')" > $OUT/decode/bench.log 2>&1; tail -3 $OUT/decode/bench.log
python -m pytest -q --collect-only tests/test_decode_gpu.py 2>/dev/null | grep "::" > /tmp/ids.txt
split -n r/8 /tmp/ids.txt /tmp/shard_
for f in /tmp/shard_*; do (timeout 150 python -m pytest -q -p no:cacheprovider $(cat $f) > $f.log 2>&1; echo "rc=$?" >> $f.log) & done
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_forward_gpu.py tests/test_probe_gpu.py > $OUT/forward_tests.log 2>&1
wait
cat /tmp/shard_*.log > $OUT/decode_tests.log; grep -E "passed|failed|rc=" $OUT/decode_tests.log; tail -2 $OUT/forward_tests.log
grep -E "^(FAILED|ERROR)" $OUT/decode_tests.log $OUT/forward_tests.log | head -30
