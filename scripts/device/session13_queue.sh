#!/usr/bin/env bash
# Issue 4, thirteenth session (one H200); written at the end of the twelfth, whose device time ran out.
#   micro   A/B benches of proxy212, one after the other on GPU 0, own empty compiler caches each:
#           "sort" (.old/src: the block lists built by argsort, the twelfth session's measured code)
#           and "scan" (this tree: the same lists by prefix sums, attention._true_first); then a
#           profiled bench of this tree (2 x 5 steps, --profile) to split the step again; then the
#           whole GPU suite (pytest -m gpu)
#   stage   keep the carried proxy shards in /tmp/proxy-keep (the tree and all four shards exceed one
#           call's carry)
#   full    restore the kept shards beside the carried one; two proxy212 runs of this tree on the
#           scan bench's caches
#   wait S [D [LOG]]  print LOG (default q.log) until $RES/D.done exists (default all) or S seconds
#           passed; tar the results into $OUT
# Before the call: mkdir -p .old && git archive 2ea16ad src | tar -x -C .old
# and carry [".proxy", ".old"] (.proxy without shard 4, which the `full` call carries).
# Launch: (setsid nohup bash scripts/device/session13_queue.sh micro > /tmp/q-launch.log 2>&1 &)
set -u
source scripts/device/common.sh
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache

ab_src() {  # ab_src NAME SRC [ARGS...]: one bench of the sources under SRC, own empty caches
  local name=$1 src=$2
  shift 2
  echo "$(date +%T) ab $name ($src) $*"
  env $(caches "ab-$name" fresh) PYTHONPATH="$PWD/$src" CUDA_VISIBLE_DEVICES=0 python3 -m speedrun.cli bench \
    --preset proxy212 --steps 10 --repeats 3 "$@" --json "$RES/ab-$name.json" > "$RES/ab-$name.log" 2>&1
  echo "$(date +%T) ab $name: exit $? | $(grep -E 'ms/step|peak mem|graphs|rror' "$RES/ab-$name.log" | tr '\n' ' ')"
}

case "${1:-}" in
  micro)
    queue_start
    ( ab_src sort .old/src
      ab_src scan src
      touch "$RES/ab.done"
      echo "$(date +%T) profile"
      env $(caches ab-scan) PYTHONPATH="$PWD/src" CUDA_VISIBLE_DEVICES=0 python3 -m speedrun.cli bench \
        --preset proxy212 --steps 5 --repeats 2 --profile "$RES/profile.txt" --json "$RES/prof.json" \
        > "$RES/prof.log" 2>&1
      echo "$(date +%T) profile: exit $?"
      touch "$RES/first.done"
      CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m gpu -q tests > "$RES/gpu-tests-all.log" 2>&1
      echo "$(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests-all.log")"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  stage) stage_proxy ;;
  full)
    restore_proxy
    ( train 0 full-scan ab-scan
      train 0 full-scan-b ab-scan
      summaries
      touch "$RES/all.done" ) > "$RES/q-full.log" 2>&1 ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 micro | stage | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
