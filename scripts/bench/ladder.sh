#!/usr/bin/env bash
# The record ladder on the proxy corpus: each rung as a 1-GPU run at proxy-212's
# token budget (83,361,792 tokens: 212 steps of 393,216 or 159 of 524,288), with
# its schedules scaled to that many steps (--steps), val loss on 2,097,152
# tokens about four times per run. As many runs at once as there are GPUs
# (one per GPU, CUDA_VISIBLE_DEVICES); then a table of the results.
# usage: [GPUS="0 1"] bash scripts/bench/ladder.sh [RUNG ...]   (default: eight rungs, baseline to record)
# Each run takes ~3-4 min on an H200, so on 2 GPUs eight rungs take ~15 min:
# give it four rungs per call to stay under a 10-minute command limit.
set -u
source scripts/bench/common.sh
rungs=("$@")
[ ${#rungs[@]} -gt 0 ] || rungs=(llmc_baseline muon modern_arch value_skips flex_attention value_embeds long_short record)
unpack_proxy
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$RES/gpus.csv"
gpus=(${GPUS:-$(seq 0 $(( $(nvidia-smi -L | wc -l) - 1 )))}); ngpu=${#gpus[@]}; [ "$ngpu" -ge 1 ] || { gpus=(0); ngpu=1; }
run_one() {  # run_one GPU RUNG
  local g=$1 name=$2 steps every
  steps=$(python3 -m speedrun ladder --proxy-steps "$name") || return 1
  every=$(( (steps + 3) / 4 ))
  echo "[gpu$g] $name: $steps steps, val every $every"
  CUDA_VISIBLE_DEVICES=$g python3 -m speedrun.train --preset "$name" --steps "$steps" --val-tokens 2097152 \
    --val-every "$every" --data-dir .proxy --out "/tmp/runs/ladder-$name" --overwrite --no-progress \
    > "$RES/ladder-$name.log" 2>&1
  echo "[gpu$g] $name: exit $? $(grep -E 'final val_loss|error' "$RES/ladder-$name.log" | tail -1)"
}
i=0
for name in "${rungs[@]}"; do
  run_one "${gpus[$((i % ngpu))]}" "$name" &
  i=$((i + 1))
  if [ $((i % ngpu)) -eq 0 ]; then wait; fi
done
wait
dirs=(); for name in "${rungs[@]}"; do [ -d "/tmp/runs/ladder-$name" ] && dirs+=("/tmp/runs/ladder-$name"); done
if [ ${#dirs[@]} -gt 0 ]; then
  python3 -m speedrun ladder --report "${dirs[@]}" | tee "$RES/ladder-table.md"
  python3 -m speedrun plot "${dirs[@]}" --out "$RES/ladder.png" || true
fi
collect
