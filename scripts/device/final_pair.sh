source scripts/device/common.sh
C=/tmp/compile-caches
run() { rm -rf $C/$2; env TORCHINDUCTOR_CACHE_DIR=$C/$2/inductor TRITON_CACHE_DIR=$C/$2/triton SPEEDRUN_COMPILE_CACHE=off CUDA_VISIBLE_DEVICES=$1 python3 -m speedrun.train --preset proxy212 --data-dir .proxy --overwrite --no-progress --out /tmp/runs/$3 > $RES/$3.log 2>&1; }
run 0 c final-a & run 1 d final-b & wait
grep -hE "cold start|final val_loss|warning" $RES/final-a.log $RES/final-b.log
python3 - <<'PY'
import json
for r in ("final-a", "final-b"):
    s = json.load(open(f"/tmp/runs/{r}/summary.json"))
    print(r, {k: s.get(k) for k in ("final_val_loss", "ms_per_step", "peak_memory_bytes", "cold_start_s", "graphs_compiled_in_timed_run")}, s.get("cold_start_phases_s"))
PY
collect
