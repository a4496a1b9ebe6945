#!/usr/bin/env bash
# Two GPUs of one host (nvidia-h200-x2) against one.
#   two    the 1-GPU bench on GPU 0 and GPU 1 at once, each on its own empty compiler caches; then the
#          2-GPU bench (torchrun, GPU 0's caches) twice, and `bench --comm` (the optimisers' collectives:
#          their time alone and how much of it the step hides); each 2-GPU median as a fraction of the
#          mean 1-GPU median                                                          (about 8 minutes)
#   train  a proxy212 run on both GPUs (torchrun) on GPU 0's bench caches; needs the four training
#          shards (common.sh: restore_proxy)                                          (about 3 minutes)
# usage: bash scripts/bench/two_gpu.sh two | train
# Results: $RES/ab-{one0,one1,two-a,two-b,comm}.{json,log}, /tmp/runs/two-gpu, then $OUT/results.tar.gz.
set -u
source scripts/bench/common.sh

bench2() {  # bench2 NAME [ARGS...]: the 2-GPU bench on the caches of GPU 0's 1-GPU bench
  local name=$1; shift
  echo "$(date +%T) $name $*"
  env $(caches ab-one0) CUDA_VISIBLE_DEVICES=0,1 torchrun --standalone --nproc_per_node=2 -m speedrun.cli \
    bench --preset proxy212 "$@" --json "$RES/ab-$name.json" > "$RES/ab-$name.log" 2>&1
  echo "$(date +%T) $name: exit $? | $(grep -E 'ms/step|peak mem|graphs|GPU clock|hidden|exposed|rror' "$RES/ab-$name.log" | tr '\n' ' ')"
}

ratios() {  # each 2-GPU bench's median over the mean of the two 1-GPU medians
  python3 - "$RES" <<'PY'
import json, sys
res = sys.argv[1]
ms = lambda n: json.load(open(f"{res}/ab-{n}.json"))["ms_per_step"]
one = [ms("one0"), ms("one1")]
print(f"1-GPU benches: {one[0]:.2f} / {one[1]:.2f} ms/step")
for n in ("two-a", "two-b"):
    print(f"{n}: {ms(n):.2f} ms/step, {ms(n) / (sum(one) / 2):.3f} of the 1-GPU step (target <= 0.55)")
PY
}

gpus_csv
nvidia-smi topo -m > "$RES/topology.txt" 2>&1
bytecode_on
clocks_log clocks.csv
case "${1:-}" in
  two)
    bench_on 0 one0 ab-one0 fresh & p0=$!
    bench_on 1 one1 ab-one1 fresh & p1=$!
    wait $p0 $p1
    bench2 two-a --steps 10 --repeats 3
    bench2 two-b --steps 10 --repeats 3
    bench2 comm --steps 5 --repeats 3 --comm
    ratios ;;
  train)
    restore_proxy
    echo "$(date +%T) two-gpu"
    env $(caches ab-one0) CUDA_VISIBLE_DEVICES=0,1 torchrun --standalone --nproc_per_node=2 -m speedrun.train \
      "${ARGS[@]}" --out /tmp/runs/two-gpu > "$RES/two-gpu.log" 2>&1
    echo "$(date +%T) two-gpu: exit $? | $(grep -E 'cold start|final val_loss|GPU clock|rror' "$RES/two-gpu.log" | tail -3 | tr '\n' ' ')"
    summaries ;;
  *) echo "usage: $0 two | train" >&2; exit 2 ;;
esac
collect
