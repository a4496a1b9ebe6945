#!/usr/bin/env bash
# Two proxy-212 runs of a preset at once, one per GPU (1-GPU runs), then a summary.
# usage: [GPUS="0 1"] bash scripts/device/proxy212_pair.sh PRESET [extra train args...]
set -u
source scripts/device/common.sh
preset=${1:-record}; shift || true
unpack_proxy
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$RES/gpus.csv"
for g in ${GPUS:-0 1}; do
  CUDA_VISIBLE_DEVICES=$g python3 -m speedrun.train --preset "$preset" --steps 212 --val-tokens 2097152 \
    --val-every 53 --data-dir .proxy --out /tmp/runs/$preset-gpu$g --overwrite --no-progress "$@" \
    > "$RES/$preset-gpu$g.log" 2>&1 &
done
wait
for g in ${GPUS:-0 1}; do echo "== gpu$g"; grep -E "val_loss|error|Error" "$RES/$preset-gpu$g.log" | tail -8; cat /tmp/runs/$preset-gpu$g/summary.json 2>/dev/null; done
collect
