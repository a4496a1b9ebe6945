source scripts/device/common.sh
train 0 final-a c fresh & train 1 final-b d fresh & wait
grep -hE "cold start|final val_loss|warning" $RES/final-a.log $RES/final-b.log
python3 - <<'PY'
import json
for r in ("final-a", "final-b"):
    s = json.load(open(f"/tmp/runs/{r}/summary.json"))
    print(r, {k: s.get(k) for k in ("final_val_loss", "ms_per_step", "peak_memory_bytes", "cold_start_s", "graphs_compiled_in_timed_run")}, s.get("cold_start_phases_s"))
PY
collect
