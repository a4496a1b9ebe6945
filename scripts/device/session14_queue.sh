#!/usr/bin/env bash
# Issue 4, fourteenth session (one H200); written at the end of the thirteenth, whose device time ran out.
#   verify  the strict cold start of the default code (the machine's first Python process: empty compiler
#           caches, no bytecode written), then the whole GPU suite with Python's bytecode kept, among it
#           the thirteenth session's two record-size compile tests (the mask build, one proxy212 step)
#           that have not all run on a GPU yet [all.done]
#   stage   keep the carried proxy shards in /tmp/proxy-keep (the tree and all four shards exceed one
#           call's carry)
#   full    restore the kept shards beside the carried one; two proxy212 runs of the default code on the
#           strict run's caches (the step time and the spread of the final loss) [full.done]
#   wait S [D [LOG]]  print LOG (default q.log) until $RES/D.done exists (default all) or S seconds
#           passed; tar the results into $OUT
# Carry [".proxy"] without shard 4 for verify and stage (move fineweb_train_000004.bin.xz out first), then
# [".proxy"] with shard 4 alone for full, issued at once after the first call returns.
# Launch: (setsid nohup bash scripts/device/session14_queue.sh verify > /tmp/q-launch.log 2>&1 &)
set -u
source scripts/device/common.sh

case "${1:-}" in
  verify)
    queue_start
    ( strict_cold
      export PYTHONPYCACHEPREFIX=/tmp/pycache
      unset PYTHONDONTWRITEBYTECODE
      CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m gpu -q tests > "$RES/gpu-tests-all.log" 2>&1
      echo "$(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests-all.log")"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  stage) stage_proxy ;;
  full)
    restore_proxy
    export PYTHONPYCACHEPREFIX=/tmp/pycache
    unset PYTHONDONTWRITEBYTECODE
    ( train 0 full-a strict
      train 0 full-b strict
      summaries
      touch "$RES/full.done" ) > "$RES/q-full.log" 2>&1 ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 verify | stage | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
