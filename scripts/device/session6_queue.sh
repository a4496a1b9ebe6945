#!/usr/bin/env bash
# Issue 4, sixth session: warm start (one warm-up step on a warm start; FlexAttention's backward block lists
# built without vmap, so both graphs trace faster) and the head's e5m2 gradient written by the CE kernel.
# One background queue on a 2-GPU machine, followed over several device calls:
#   run     GPU 0: proxy212 cut to 20 steps with empty caches (cold-a), then three warm starts on its caches
#                  (warm-a1..a3), then a full proxy212 run (full-a), then the GPU tests;
#           GPU 1: once GPU 0's warm starts are done (no compile overlaps them): speedrun bench of the
#                  previous commit (.old/src, from `git archive`) and of this tree, each 3 x 10 steps with
#                  its own empty caches, then a full proxy212 run on the bench's caches (full-b)
#   pyc     as `run`'s GPU 0 warm starts, but with Python's bytecode cached between runs: this machine sets
#           PYTHONDONTWRITEBYTECODE=1, so every start compiled torch's modules from source (about 8 s more).
#           PYTHONPYCACHEPREFIX=/tmp/pycache, emptied before the cold run (cold = no caches of any kind);
#           20-step runs need only the first training shard. Then the GPU tests of test_head.py on GPU 1
#   two     both GPUs: one proxy212 run through torchrun (two-gpu), empty caches
#   wait S  print progress until the queue is done or S seconds passed; tar results to $OUT
# Launch: setsid nohup bash scripts/device/session6_queue.sh run > /tmp/q.log 2>&1 &
# Carry: the tracked tree (5.6 MiB) and .proxy (58.6 MiB) no longer fit one call's 64 MiB, so the shards
# travel over two calls to a warm machine (ignored files stay there between calls): first training shards
# 1-3 and the validation shard (unpacked at once), then shard 4 with .old (`git archive HEAD src | tar -x -C
# .old`, assets removed) in the call that launches the queue.
set -u
source scripts/device/common.sh

bench() {  # bench GPU NAME SRC CACHE
  echo "[gpu$1] $(date +%T) bench $2"
  env $(caches "$4" fresh) PYTHONPATH="$PWD/$3" CUDA_VISIBLE_DEVICES=$1 python3 -m speedrun.cli bench --preset proxy212 \
    --steps 10 --repeats 3 --json "$RES/bench-$2.json" > "$RES/bench-$2.log" 2>&1
  echo "[gpu$1] $(date +%T) $2: $(grep -E 'ms/step|graphs|rror' "$RES/bench-$2.log" | tr '\n' ' ')"
}

case "${1:-}" in
  run)
    rm -f "$RES"/*.done
    unpack_proxy
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$RES/gpus.csv"
    short=$RES/short.txt; echo "--set train.steps=20" > "$short"
    ( TRAIN_EXTRA_FILE=$short train 0 cold-a a fresh
      for w in 1 2 3; do TRAIN_EXTRA_FILE=$short train 0 warm-a$w a; done
      touch "$RES/warm.done"
      train 0 full-a a
      echo "[gpu0] $(date +%T) GPU tests"
      CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m gpu -q tests/ > "$RES/gpu-tests.log" 2>&1
      echo "[gpu0] $(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests.log")"
      touch "$RES/q0.done" ) > "$RES/q0.log" 2>&1 &
    ( until [ -e "$RES/warm.done" ] || [ -e "$RES/q0.done" ]; do sleep 2; done
      bench 1 old .old/src o1
      bench 1 new src b
      train 1 full-b b
      touch "$RES/q1.done" ) > "$RES/q1.log" 2>&1 &
    wait
    summaries > "$RES/summaries.txt" 2>&1
    touch "$RES/all.done" ;;
  pyc)
    unset PYTHONDONTWRITEBYTECODE
    export PYTHONPYCACHEPREFIX=/tmp/pycache
    rm -rf "$PYTHONPYCACHEPREFIX" "$RES"/*.done
    unpack_proxy
    short=$RES/short.txt; echo "--set train.steps=20" > "$short"
    ( TRAIN_EXTRA_FILE=$short train 0 cold-p p fresh
      for w in 1 2 3; do TRAIN_EXTRA_FILE=$short train 0 warm-p$w p; done
      CUDA_VISIBLE_DEVICES=1 python3 -m pytest -m gpu -q tests/test_head.py > "$RES/gpu-tests-head.log" 2>&1
      echo "[gpu1] $(date +%T) GPU tests (test_head.py): $(tail -1 "$RES/gpu-tests-head.log")"
      summaries > "$RES/summaries.txt" 2>&1
      touch "$RES/pyc.done" ) > "$RES/q0.log" 2>&1 ;;
  two)
    rm -f "$RES"/two.done
    ( echo "$(date +%T) two-gpu start"
      env $(caches two fresh) torchrun --standalone --nproc_per_node=2 -m speedrun.train "${ARGS[@]}" \
        --out /tmp/runs/two-gpu > "$RES/two-gpu.log" 2>&1
      echo "$(date +%T) two-gpu end: exit $? | $(grep -E 'cold start|final val_loss' "$RES/two-gpu.log" | tr '\n' ' ')"
      summaries > "$RES/summaries.txt" 2>&1
      touch "$RES/two.done" ) > "$RES/two.log" 2>&1 ;;
  wait)
    follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/q0.log $RES/q1.log $RES/two.log $RES/summaries.txt"
    exit $? ;;
  *) echo "usage: $0 run | pyc | two | wait SECONDS [DONE-NAME]" >&2; exit 2 ;;
esac
