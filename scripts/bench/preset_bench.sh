#!/usr/bin/env bash
# Step time, communication and cold start of a preset on the GPU machine.
# usage: bash scripts/bench/preset_bench.sh [STAGE ...]   (PRESET=proxy212 by default)
#   cold        a cold start with empty compiler caches                         (~3 min)
#   cache       speedrun warm, then a cold start that loads the portable cache   (~3 min)
#   throughput  1-GPU step time with --profile                                   (~2 min)
#   comm        2 GPUs under torchrun, with --comm                                (~3 min)
#   all         every stage, in that order (over 10 minutes: split it up)
# Results: /tmp/speedrun-results/bench/*.json|log (and $OUT/results.tar.gz).
set -u
source scripts/bench/common.sh
PRESET=${PRESET:-proxy212}
B="$RES/bench"
T=/tmp/speedrun-bench-caches
mkdir -p "$B" "$T"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$B/gpus.csv" 2>/dev/null
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
SR="python3 -m speedrun.cli"
STEPS=${STEPS:-10}; REPEATS=${REPEATS:-5}

fresh() {  # empty local compiler caches for one run: $1 = name
  rm -rf "$T/$1"; mkdir -p "$T/$1/inductor" "$T/$1/triton"
  echo "TORCHINDUCTOR_CACHE_DIR=$T/$1/inductor TRITON_CACHE_DIR=$T/$1/triton"
}

cold() {  # first_step_s = process start -> end of the first step, caches empty, one compile at a time
  env $(fresh cold) SPEEDRUN_COMPILE_CACHE=off CUDA_VISIBLE_DEVICES=0 \
    $SR bench --preset "$PRESET" --warmup 2 --steps 5 --repeats 1 --no-sync-check \
    --json "$B/cold.json" > "$B/cold.log" 2>&1
  grep -E "first step|ms/step|error|Error" "$B/cold.log"
}

cache() {  # warm -> portable cache file; then a run with empty local caches that loads it
  export SPEEDRUN_HOME=$T/home
  env $(fresh warm) CUDA_VISIBLE_DEVICES=0 $SR warm --preset "$PRESET" > "$B/warm.log" 2>&1
  tail -2 "$B/warm.log"
  env $(fresh loaded) CUDA_VISIBLE_DEVICES=0 \
    $SR bench --preset "$PRESET" --warmup 2 --steps 5 --repeats 1 --no-sync-check \
    --json "$B/cold-with-cache.json" > "$B/cold-with-cache.log" 2>&1
  grep -E "compile cache|first step|error|Error" "$B/cold-with-cache.log"
  unset SPEEDRUN_HOME
}

throughput() {  # steady-state step time, 1 GPU; the whole-model run also profiles and counts host syncs
  CUDA_VISIBLE_DEVICES=0 $SR bench --preset "$PRESET" --steps "$STEPS" --repeats "$REPEATS" \
    --profile "$B/1gpu-profile.txt" --json "$B/1gpu.json" > "$B/1gpu.log" 2>&1
  cat "$B/1gpu.log"
}

comm() {  # 2 GPUs: step time, collectives per size, and the step with local stand-ins for them
  if [ "$NGPU" -lt 2 ]; then echo "comm: needs 2 GPUs, found $NGPU"; return; fi
  CUDA_VISIBLE_DEVICES=0,1 torchrun --standalone --nproc_per_node=2 -m speedrun.cli bench --preset "$PRESET" \
    --steps "$STEPS" --repeats "$REPEATS" --comm --json "$B/2gpu.json" > "$B/2gpu.log" 2>&1
  cat "$B/2gpu.log" | grep -v "^W1"
}

stages=${*:-all}
[ "$stages" = all ] && stages="cold cache throughput comm"
for s in $stages; do echo "=== $s"; $s; done
collect
