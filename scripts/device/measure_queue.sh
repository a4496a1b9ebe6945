#!/usr/bin/env bash
# The long measurements of issues 3, 5 and 6 as two queues, one per GPU of a
# 2-GPU machine, all 1-GPU runs on ../shared/proxy:
#   GPU 0: proxy212 (uninterrupted, issue 3 run 1 and issue 6's straight run),
#          proxy212 again (issue 3 run 2), then ladder rungs from LADDER0
#   GPU 1: proxy212 checkpointing every 53 steps, SIGTERM after its step-106
#          checkpoint, resumed (issue 6), then ladder rungs from LADDER1
# Ladder rungs run at proxy-212's token budget (`speedrun ladder --proxy-steps`),
# val on 2,097,152 tokens about four times per run.
#
# The queues outlive one device call: start them with
#   setsid nohup bash scripts/device/measure_queue.sh start > /tmp/queue.log 2>&1 &
# and follow them with `bash scripts/device/measure_queue.sh wait SECONDS`
# (prints progress, returns when both queues are done or after SECONDS, and
# always tars what exists so far into $OUT). `report` prints the tables.
set -u
source scripts/device/common.sh
LADDER0=${LADDER0:-"llmc_baseline flex_attention muon"}
LADDER1=${LADDER1:-"record modern_arch value_embeds"}
ARGS=(--data-dir .proxy --overwrite --no-progress)

train() {  # train GPU NAME [args...]: one 1-GPU run into /tmp/runs/NAME, log in $RES/NAME.log
  local g=$1 name=$2; shift 2
  echo "[gpu$g] $(date +%T) start $name"
  CUDA_VISIBLE_DEVICES=$g python3 -m speedrun.train "${ARGS[@]}" --out "/tmp/runs/$name" "$@" > "$RES/$name.log" 2>&1
  echo "[gpu$g] $(date +%T) end $name: exit $? $(grep -E 'final val_loss|rror' "$RES/$name.log" | tail -1)"
}

rung() {  # rung GPU NAME
  local steps every
  steps=$(python3 -m speedrun ladder --proxy-steps "$2") || return 1
  every=$(( (steps + 3) / 4 ))
  train "$1" "ladder-$2" --preset "$2" --steps "$steps" --val-tokens 2097152 --val-every "$every"
}

queue0() {
  train 0 straight --preset proxy212
  train 0 proxy212-run2 --preset proxy212
  for r in $LADDER0; do rung 0 "$r"; done
  touch "$RES/queue0.done"
}

queue1() {
  (
    export CUDA_VISIBLE_DEVICES=1
    echo "[gpu1] $(date +%T) start resumed (part a)"
    python3 -m speedrun.train --preset proxy212 "${ARGS[@]}" --out /tmp/runs/resumed --checkpoint-every 53 \
      > "$RES/resumed-a.log" 2>&1 &
    pid=$!
    until [ -e /tmp/runs/resumed/checkpoints/step_000106 ] || ! kill -0 $pid 2>/dev/null; do sleep 1; done
    kill -TERM $pid; wait $pid; echo "first part exited with $?" >> "$RES/resumed-a.log"
    echo "[gpu1] $(date +%T) resume (part b)"
    python3 -m speedrun.train --resume /tmp/runs/resumed --no-progress > "$RES/resumed-b.log" 2>&1
    echo "[gpu1] $(date +%T) end resumed: exit $? $(grep -E 'final val_loss|rror' "$RES/resumed-b.log" | tail -1)"
  )
  for r in $LADDER1; do rung 1 "$r"; done
  touch "$RES/queue1.done"
}

report() {
  python3 - <<'PY'
import json, os
def load(run):
    p = f"/tmp/runs/{run}/metrics.jsonl"
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
a = {r["step"]: r["val_loss"] for r in load("straight") if "val_loss" in r}
rows = load("resumed")
b = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
for s in sorted(a):
    print(f"step {s:4d}  straight {a[s]:.4f}  resumed {b.get(s, float('nan')):.4f}  diff {b.get(s, float('nan')) - a[s]:+.4f}")
for r in rows:
    if "event" in r:
        print(r)
for run in ("straight", "proxy212-run2", "resumed"):
    p = f"/tmp/runs/{run}/summary.json"
    if os.path.exists(p):
        s = json.load(open(p))
        print(run, {k: s.get(k) for k in ("final_val_loss", "train_time_ms", "ms_per_step", "peak_memory_bytes", "cold_start_s")})
PY
  local dirs=()
  for d in /tmp/runs/ladder-*; do [ -f "$d/summary.json" ] && dirs+=("$d"); done
  if [ ${#dirs[@]} -gt 0 ]; then
    python3 -m speedrun ladder --report "${dirs[@]}" | tee "$RES/ladder-table.md"
    python3 -m speedrun plot "${dirs[@]}" --out "$RES/ladder.png" > /dev/null 2>&1 || true
  fi
}

case "${1:-}" in
  start)
    unpack_proxy
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$RES/gpus.csv"
    rm -f "$RES"/queue*.done
    queue0 > "$RES/queue0.log" 2>&1 &
    queue1 > "$RES/queue1.log" 2>&1 &
    wait ;;
  wait)
    if follow "${2:-540}" "$RES/queue0.done $RES/queue1.done" "$RES/queue0.log $RES/queue1.log"; then
      echo "QUEUES DONE"; report
    fi
    collect ;;
  report) report; collect ;;
  *) echo "usage: $0 start|wait SECONDS|report"; exit 2 ;;
esac
