#!/usr/bin/env bash
# Issue 4, for the next session lent two H200s (nvidia-h200-x2): the 2-GPU target, not re-measured since
# the seventeenth session (0.505 / 0.511 of the 1-GPU step, older code).
#   two     the 1-GPU bench on GPU 0 and GPU 1 at once (each on its own empty compiler caches), then the
#           2-GPU bench (torchrun, GPU 0's caches) twice, then `bench --comm` on two GPUs; the ratios
#           into q-two.log [all.done]
#   full2   restore the kept shards; a proxy212 run on two GPUs (torchrun) on GPU 0's caches [full.done]
#   wait S [D [LOG]]  as session18_queue.sh's
# Carry [".proxy"] with shards 1-2 and val for `two` (the benches read random tokens; the shards are kept
# for full2), then [".proxy"] with shards 3-4 alone for full2, at once after (since the forty-second
# session the tree and shards 1-3 pass the 64 MiB a call may carry: common.sh, stage_proxy).
set -u
source scripts/device/common.sh

bench2() {  # bench2 NAME [ARGS...]: the 2-GPU bench on the caches of GPU 0's 1-GPU bench
  local name=$1; shift
  echo "$(date +%T) $name $*"
  env $(caches ab-one0) torchrun --standalone --nproc_per_node=2 -m speedrun.cli bench --preset proxy212 \
    "$@" --json "$RES/ab-$name.json" > "$RES/ab-$name.log" 2>&1
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

two_queue() {
  bytecode_on
  clocks_log clocks.csv
  ab_on 0 one0 ab-one0 fresh & local p0=$!
  ab_on 1 one1 ab-one1 fresh & local p1=$!
  wait $p0 $p1  # not a bare `wait`: clocks_log's nvidia-smi runs in the background until the machine goes
  export CUDA_VISIBLE_DEVICES=0,1
  bench2 two-a --steps 10 --repeats 3
  bench2 two-b --steps 10 --repeats 3
  bench2 comm --steps 5 --repeats 3 --comm
  ratios
}

case "${1:-}" in
  two) check_start; rm -f "$RES"/*.done; ( two_queue; touch "$RES/all.done" ) > "$RES/q-two.log" 2>&1 ;;
  full2) restore_proxy; bytecode_on
    ( echo "$(date +%T) full2"
      env $(caches ab-one0) CUDA_VISIBLE_DEVICES=0,1 torchrun --standalone --nproc_per_node=2 -m speedrun.train \
        "${ARGS[@]}" --out /tmp/runs/full2 > "$RES/full2.log" 2>&1
      echo "$(date +%T) full2: exit $? | $(grep -E 'cold start|final val_loss|GPU clock|rror' "$RES/full2.log" | tail -3 | tr '\n' ' ')"
      summaries; touch "$RES/full.done" ) > "$RES/q-full2.log" 2>&1 ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 two | full2 | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
