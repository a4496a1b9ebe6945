#!/usr/bin/env bash
# Issue 4, thirteenth session (one H200); written at the end of the twelfth, whose device time ran out.
#   micro   A/B benches of proxy212, one after the other on GPU 0, own empty compiler caches each:
#           "sort" (.old/src: the block lists built by argsort, the twelfth session's measured code)
#           and "scan" (this tree: the same lists by prefix sums, attention._true_first) [ab.done];
#           a profiled bench of this tree (2 x 5 steps, --profile: top kernels, device idle, Chrome
#           trace) [prof.done]; the FlexAttention option sweep around the default
#           (flex_mask_bench.py, SWEEP_SET=options) [sweep.done]; the whole GPU suite [all.done]
#   micro2  (after micro found that Inductor 2.11 could not generate the prefix-sum lists' scatter in
#           the model's graph) the mask build alone, compiled, for .old/src and this tree
#           (mask_build_bench.py); A/B benches "sort2" (.old/src) and "rank" (this tree: the window's
#           blocks by rank, lists by prefix sums), and "alt" (.alt/src: this tree with argsort lists)
#           if "rank" fails; a profiled bench of the winner [all.done]
#   stage   keep the carried proxy shards in /tmp/proxy-keep (the tree and all four shards exceed one
#           call's carry)
#   full    wait (up to 480 s) for micro2's all.done, restore the kept shards beside the carried one,
#           one proxy212 run of micro2's winner on its bench's caches [full.done]
#   ab NAME [ARGS...]  one more A/B bench (own empty caches) of this tree with `speedrun bench` ARGS,
#           after micro's all.done [ab-NAME.done]
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

wait_done() {  # wait_done FILE SECONDS: until FILE exists or SECONDS pass
  local end=$(( $(date +%s) + $2 ))
  while [ ! -e "$1" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
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
      echo "$(date +%T) profile: exit $? | $(grep -A3 'device idle' "$RES/prof.log" | tr '\n' ' ')"
      touch "$RES/prof.done"
      (cd scripts/device && SWEEP_SET=options CUDA_VISIBLE_DEVICES=0 python3 flex_mask_bench.py ../../.proxy \
        "$RES/flex-options.json") > "$RES/flex-options.log" 2>&1
      echo "$(date +%T) flex options: exit $?"; grep -E "^s64" "$RES/flex-options.log"
      touch "$RES/sweep.done"
      CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m gpu -q tests > "$RES/gpu-tests-all.log" 2>&1
      echo "$(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests-all.log")"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  micro2)
    queue_start
    ( for src in .old/src src; do
        (cd scripts/device && PYTHONPATH="$PWD/../../$src" python3 mask_build_bench.py ../../.proxy \
          "$RES/mask-build-${src%%/*}.json") 2>&1 | grep -v -i warn | tail -3
      done
      ab_src sort2 .old/src
      ab_src rank src
      best=rank
      grep -q "ms/step" "$RES/ab-rank.log" || { ab_src alt .alt/src; best=alt; }
      echo $best > "$RES/best"; touch "$RES/ab.done"
      src=src; [ $best = alt ] && src=.alt/src
      echo "$(date +%T) profile ($best)"
      env $(caches "ab-$best") PYTHONPATH="$PWD/$src" CUDA_VISIBLE_DEVICES=0 python3 -m speedrun.cli bench \
        --preset proxy212 --steps 5 --repeats 2 --profile "$RES/profile.txt" --json "$RES/prof.json" \
        > "$RES/prof.log" 2>&1
      echo "$(date +%T) profile: exit $? | $(grep -A4 'device idle' "$RES/prof.log" | tr '\n' ' ')"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  stage) stage_proxy ;;
  full)
    wait_done "$RES/all.done" 480
    restore_proxy
    best=$(cat "$RES/best" 2>/dev/null || echo rank)
    [ "$best" = alt ] && export PYTHONPATH="$PWD/.alt/src"
    ( train 0 "full-$best" "ab-$best"
      summaries
      touch "$RES/full.done" ) > "$RES/q-full.log" 2>&1 ;;
  ab)
    wait_done "$RES/all.done" 480
    name=$2; shift 2
    ( ab "$name" "$@"; touch "$RES/ab-$name.done" ) >> "$RES/q-ab.log" 2>&1 ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 micro | stage | full | ab NAME [ARGS...] | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
