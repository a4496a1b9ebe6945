#!/usr/bin/env bash
# Same-machine A/B of the step time: the previous commit's code (a git worktree in .old/) against this
# tree, each GPU running both (old then new on GPU 0, new then old on GPU 1), speedrun bench 3 x 10 steps.
# Make the worktree with `git worktree add .old COMMIT` (and drop .old/docs/runs) and name .old in the
# device call's carry: the device copies a nested worktree without its files otherwise.
#   run      launch (background);   wait S   follow it and tar the results to $OUT
set -u
source scripts/device/common.sh
bench() {  # bench GPU NAME SRC CACHE
  env $(caches "$4") PYTHONPATH="$PWD/$3" CUDA_VISIBLE_DEVICES=$1 python3 -m speedrun.cli bench --preset proxy212 --steps 10 --repeats 3 \
    --json "$RES/ab-$2.json" > "$RES/ab-$2.log" 2>&1
  echo "[gpu$1] $(date +%T) $2: $(grep -E 'ms/step \(median\)' "$RES/ab-$2.log")"
}
case "$1" in
  run)
    rm -f "$RES"/ab.done
    ( bench 0 old-gpu0 .old/src o0; bench 0 new-gpu0 src c ) > "$RES/ab0.log" 2>&1 &
    ( bench 1 new-gpu1 src d; bench 1 old-gpu1 .old/src o1 ) > "$RES/ab1.log" 2>&1 &
    wait; touch "$RES/ab.done" ;;
  wait)
    follow "${2:-500}" "$RES/ab.done" "$RES/ab0.log $RES/ab1.log"; collect ;;
esac
