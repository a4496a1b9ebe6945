#!/usr/bin/env bash
# The training step of an older commit against this tree on the same machine: `speedrun bench --preset
# proxy212 --steps 10 --repeats 3` of both, each GPU running both in turn (old then new on GPU 0, new then
# old on GPU 1), each bench on its own empty compiler caches.
# Make the older tree with `git worktree add .old COMMIT` (and drop .old/docs/runs), and name .old in the
# device call's carry: the device copies a nested worktree without its files otherwise.
# usage: bash scripts/bench/commit_ab.sh        (2-GPU machine; about 8 minutes)
# Results: $RES/ab-{old,new}-gpu{0,1}.{json,log}, then $OUT/results.tar.gz.
set -u
source scripts/bench/common.sh
[ -d .old/src/speedrun ] || { echo "no .old/src/speedrun: git worktree add .old COMMIT" >&2; exit 2; }
bench() {  # bench GPU NAME SRC: one bench of the sources SRC
  env $(caches "ab-$2" fresh) PYTHONPATH="$PWD/$3" CUDA_VISIBLE_DEVICES=$1 python3 -m speedrun.cli bench \
    --preset proxy212 --steps 10 --repeats 3 --json "$RES/ab-$2.json" > "$RES/ab-$2.log" 2>&1
  echo "[gpu$1] $(date +%T) $2: $(grep -E 'ms/step \(median\)|rror' "$RES/ab-$2.log" | tr '\n' ' ')"
}
gpus_csv
bytecode_on
( bench 0 old-gpu0 .old/src; bench 0 new-gpu0 src ) & p0=$!
( bench 1 new-gpu1 src; bench 1 old-gpu1 .old/src ) & p1=$!
wait $p0 $p1
collect
