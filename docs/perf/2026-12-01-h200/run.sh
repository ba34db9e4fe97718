set -x
export PYTHONPATH=$PWD:$PWD/.dbg/ab:$PYTHONPATH PYTHONUNBUFFERED=1
export CUTE_FA_CACHE_DIR=$PWD/.cfacache
python -c "import sys, os; print('dont_write_bytecode', sys.flags.dont_write_bytecode, os.environ.get('PYTHONDONTWRITEBYTECODE'), sys.pycache_prefix)"
ls -d /opt/cutedsl/site/nvidia_cutlass_dsl/dsl_packages/cutlass/__pycache__ 2>&1
cat > /tmp/st.py <<'PY'
import json, sys
from cute_fa.bench import START_CONFIGS, start_times
configs = START_CONFIGS if sys.argv[1] == "all" else [(128, False)]
for rep in range(int(sys.argv[2])):
    for d, c in configs:
        r = start_times(d, c)
        print(json.dumps(dict(label=sys.argv[3], rep=rep, head_dim=d, causal=c, cold=round(r["cold_cache"]["after_torch"], 3), warm=round(r["warm_cache"]["after_torch"], 3), cold_total=round(r["cold_cache"]["process_total"], 3))), flush=True)
PY
python /tmp/st.py one 1 no_bytecode 2>&1 | tee $OUT/start_times.txt
time python -m compileall -q -j 16 /opt/cutedsl/site $PWD/cute_fa > /dev/null 2>&1
python /tmp/st.py all 2 bytecode_compiled 2>&1 | tee -a $OUT/start_times.txt
timeout 300 python -m pytest -q tests/test_forward_gpu.py tests/test_probe_gpu.py 2>&1 | tee $OUT/gpu_tests.log | tail -6
ls .cfacache | wc -l
timeout 400 python .dbg/ab_sm80.py 2>&1 | tee $OUT/ab_sm80.txt | tail -3
