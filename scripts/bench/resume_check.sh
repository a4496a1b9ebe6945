#!/usr/bin/env bash
# Resume on the GPU: an uninterrupted proxy212 run (GPU 0) against the same run
# checkpointing every 53 steps, stopped by SIGTERM after its step-106 checkpoint
# and resumed (GPU 1). Prints both val curves and the checkpoint costs.
# usage: bash scripts/bench/resume_check.sh   (2-GPU machine)
set -u
source scripts/bench/common.sh
unpack_proxy
args=(--preset proxy212 --data-dir .proxy --overwrite --no-progress)
CUDA_VISIBLE_DEVICES=0 python3 -m speedrun.train "${args[@]}" --out /tmp/runs/straight > "$RES/straight.log" 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  python3 -m speedrun.train "${args[@]}" --out /tmp/runs/resumed --checkpoint-every 53 > "$RES/resumed-a.log" 2>&1 &
  pid=$!
  until [ -e /tmp/runs/resumed/checkpoints/step_000106 ] || ! kill -0 $pid 2>/dev/null; do sleep 1; done
  kill -TERM $pid; wait $pid; echo "first part exited with $?" >> "$RES/resumed-a.log"
  python3 -m speedrun.train --resume /tmp/runs/resumed --no-progress > "$RES/resumed-b.log" 2>&1
) &
wait
python3 - <<'PY'
import json
def curve(run):
    rows = [json.loads(l) for l in open(f"/tmp/runs/{run}/metrics.jsonl")]
    return {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}, [r for r in rows if r.get("event", "").startswith("checkpoint")]
a, _ = curve("straight"); b, events = curve("resumed")
for s in sorted(a):
    print(f"step {s:4d}  straight {a[s]:.4f}  resumed {b.get(s, float('nan')):.4f}  diff {b.get(s, float('nan')) - a[s]:+.4f}")
for e in events:
    print(e)
PY
collect
