#!/usr/bin/env bash
# The training step of an older commit against this tree on the same machine: `speedrun bench --preset
# proxy212 --steps 10 --repeats 3` of both. On two GPUs each GPU runs both in turn (old then new on GPU 0,
# new then old on GPU 1), each bench on its own empty compiler caches. On one GPU two rounds in A-B-B-A
# order: the first round on empty caches, the second on each tree's caches from the first (the compiled
# code is the same; only the cold start differs, and the bench times steps only).
# Make the older tree with `git archive COMMIT src | tar -x -C .old` (or `git worktree add .old COMMIT`),
# and name .old in the device call's carry: the device copies a nested worktree without its files otherwise.
# usage: bash scripts/bench/commit_ab.sh        (about 8 minutes on either machine)
# Results: $RES/ab-{old,new}-*.{json,log}, then $OUT/results.tar.gz.
set -u
source scripts/bench/common.sh
[ -d .old/src/speedrun ] || { echo "no .old/src/speedrun: git archive COMMIT src | tar -x -C .old" >&2; exit 2; }
bench() {  # bench GPU NAME SRC CACHE [fresh]: one bench of the sources SRC
  env $(caches "$4" ${5:-}) PYTHONPATH="$PWD/$3" CUDA_VISIBLE_DEVICES=$1 python3 -m speedrun.cli bench \
    --preset proxy212 --steps 10 --repeats 3 --json "$RES/ab-$2.json" > "$RES/ab-$2.log" 2>&1
  echo "[gpu$1] $(date +%T) $2: $(grep -E 'ms/step \(median\)|peak|rror' "$RES/ab-$2.log" | tr '\n' ' ')"
}
gpus_csv
bytecode_on
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  ( bench 0 old-gpu0 .old/src old-gpu0 fresh; bench 0 new-gpu0 src new-gpu0 fresh ) & p0=$!
  ( bench 1 new-gpu1 src new-gpu1 fresh; bench 1 old-gpu1 .old/src old-gpu1 fresh ) & p1=$!
  wait $p0 $p1
else
  bench 0 old-1 .old/src old fresh
  bench 0 new-1 src new fresh
  bench 0 new-2 src new
  bench 0 old-2 .old/src old
fi
collect
