#!/usr/bin/env bash
# The training step of configurations against each other: `speedrun bench --preset proxy212 --steps 10
# --repeats 3` of each arm in turns, ROUNDS rounds, each arm on its own compiler cache (empty at its
# first bench), the proxy's real tokens (--data .proxy), on GPU 0. Arms: common.sh's ARM_ARGS (def = the
# defaults). Compare the results with `speedrun compare ab-A-*.json --vs ab-B-*.json --paired`.
# usage: bash scripts/bench/step_ab.sh ROUNDS ARM...      (e.g. `2 def nosmem`)
# Results: $RES/ab-ARM-N.{json,log}, clocks.csv, then $OUT/results.tar.gz. A bench takes 2-3 minutes with
# its compile, about 1 minute on a warm cache: two arms, two rounds fit one 600 s call.
set -u
source scripts/bench/common.sh
rounds=${1:?usage: step_ab.sh ROUNDS ARM...}; shift
[ $# -gt 0 ] || set -- def
for arm in "$@"; do arm_args "$arm" > /dev/null; done
gpus_csv
unpack_proxy
bytecode_on
clocks_log clocks.csv
for r in $(seq 1 "$rounds"); do
  fresh=""; [ "$r" = 1 ] && fresh=fresh
  for arm in "$@"; do
    bench_on 0 "$arm-$r" "ab-$arm" $fresh -- --data .proxy $(arm_args "$arm")
  done
done
collect
