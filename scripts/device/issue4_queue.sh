#!/usr/bin/env bash
# Issue 4's measurements on a 2-GPU machine, as background queues that outlive one device call.
#   start   unpack the proxy corpus; then
#           GPU 0: proxy212 with empty compiler caches (run cold-a), then the GPU tests;
#           GPU 1: once cold-a has started timing (so the two compiles never overlap),
#                  proxy212 with its own empty caches (run cold-b)
#   warm    GPU 0 / GPU 1 at once: proxy212 again on cold-a's / cold-b's caches (warm-a, warm-b);
#           then GPU 0: speedrun bench with a profile, on cold-a's caches
#   two     proxy212 on both GPUs under torchrun (two-gpu), then speedrun bench --comm on both
#   wait S  print progress until the current stage is done or S seconds passed; tar results to $OUT
# Launch a stage with: setsid nohup bash scripts/device/issue4_queue.sh STAGE > /tmp/q.log 2>&1 &
set -u
source scripts/device/common.sh
stage_start() {
  unpack_proxy
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$RES/gpus.csv"
  ( train 0 cold-a a fresh
    CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m gpu -q -x tests/ > "$RES/gpu-tests.log" 2>&1
    echo "[gpu0] $(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests.log")"
    touch "$RES/q0.done" ) > "$RES/q0.log" 2>&1 &
  ( until grep -q "cold start" "$RES/cold-a.log" 2>/dev/null || [ -e "$RES/q0.done" ]; do sleep 2; done
    train 1 cold-b b fresh
    touch "$RES/q1.done" ) > "$RES/q1.log" 2>&1 &
  wait
}

stage_warm() {
  ( train 0 warm-a a
    echo "[gpu0] $(date +%T) bench"
    env $(caches a) CUDA_VISIBLE_DEVICES=0 python3 -m speedrun.cli bench --preset proxy212 --steps 10 --repeats 3 \
      --profile "$RES/bench-profile.txt" --json "$RES/bench.json" > "$RES/bench.log" 2>&1
    grep -E "ms/step|fraction|set-up|graphs|host syncs|rror" "$RES/bench.log"
    touch "$RES/q0.done" ) > "$RES/q0.log" 2>&1 &
  ( train 1 warm-b b; touch "$RES/q1.done" ) > "$RES/q1.log" 2>&1 &
  wait
}

stage_two() {
  ( echo "[gpu01] $(date +%T) start two-gpu"
    env $(caches a) CUDA_VISIBLE_DEVICES=0,1 torchrun --standalone --nproc_per_node=2 -m speedrun.train "${ARGS[@]}" \
      --out /tmp/runs/two-gpu > "$RES/two-gpu.log" 2>&1
    echo "[gpu01] $(date +%T) end two-gpu: exit $? | $(grep -E 'cold start|final val_loss' "$RES/two-gpu.log" | tr '\n' ' ')"
    env $(caches a) CUDA_VISIBLE_DEVICES=0,1 torchrun --standalone --nproc_per_node=2 -m speedrun.cli bench \
      --preset proxy212 --steps 10 --repeats 3 --comm --json "$RES/bench-2gpu.json" > "$RES/bench-2gpu.log" 2>&1
    grep -v "^W1" "$RES/bench-2gpu.log" | tail -30
    touch "$RES/q0.done" "$RES/q1.done" ) > "$RES/q0.log" 2>&1
}

summaries() {
  python3 - <<'PY'
import json, glob, os
for p in sorted(glob.glob("/tmp/runs/*/summary.json")):
    s = json.load(open(p))
    print(os.path.basename(os.path.dirname(p)), {k: s.get(k) for k in (
        "final_val_loss", "train_time_ms", "ms_per_step", "peak_memory_bytes", "cold_start_s",
        "graphs_compiled_in_timed_run", "world_size")})
    print("   phases", s.get("cold_start_phases_s"))
PY
}

case "${1:-}" in
  start|warm|two)
    rm -f "$RES"/q0.done "$RES"/q1.done
    "stage_$1" ;;
  wait)
    if follow "${2:-540}" "$RES/q0.done $RES/q1.done" "$RES/q0.log $RES/q1.log"; then echo "STAGE DONE"; summaries; fi
    collect ;;
  *) echo "usage: $0 start|warm|two|wait SECONDS"; exit 2 ;;
esac
