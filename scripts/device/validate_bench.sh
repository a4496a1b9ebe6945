#!/usr/bin/env bash
# One call on a 2-GPU machine with empty compiler caches: the GPU tests, then
# the step time of the record's math (proxy212) with the default fast paths,
# profiled (GPU 0); alongside, the same bench with regional compilation and
# with the unfused cross-entropy (GPU 1). Caches go to torch's default places,
# so later calls on the same warm machine start from them.
# usage: bash scripts/device/validate_bench.sh
set -u
source scripts/device/common.sh
B="$RES/bench"; mkdir -p "$B"
SR="python3 -m speedrun.cli"
args=(--preset proxy212 --steps 10 --repeats 3)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$B/gpus.csv" 2>/dev/null
(
  export CUDA_VISIBLE_DEVICES=0
  python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > "$RES/pytest-gpu.log" 2>&1
  echo "[gpu0] pytest: $(tail -1 "$RES/pytest-gpu.log")"
  $SR bench "${args[@]}" --profile "$B/fused-profile.txt" --json "$B/fused.json" > "$B/fused.log" 2>&1
  echo "[gpu0] fused: $(grep -E 'ms/step|first step|error|Error' "$B/fused.log" | tr '\n' ' ')"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  $SR bench "${args[@]}" --set train.compile=regional --no-sync-check --json "$B/regional.json" > "$B/regional.log" 2>&1
  echo "[gpu1] regional: $(grep -E 'ms/step|first step|error|Error' "$B/regional.log" | tr '\n' ' ')"
  $SR bench "${args[@]}" --set model.ce_kernel=torch --no-sync-check --json "$B/unfused.json" > "$B/unfused.log" 2>&1
  echo "[gpu1] unfused: $(grep -E 'ms/step|first step|error|Error' "$B/unfused.log" | tr '\n' ' ')"
) &
wait
grep -E "passed|failed|Error" "$RES/pytest-gpu.log" | tail -5
collect
