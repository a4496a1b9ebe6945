#!/usr/bin/env bash
# Issue 4, for the twenty-fifth session (one H200): Inductor's coordinate-descent tuning through
# train.inductor_options, first on a GPU.
#   tune    keep the carried shards (stage_proxy); the clock log; the GPU test of train.inductor_options;
#           three A/B rounds on one cache: the default against coordinate_descent_tuning=true (round 1's
#           tuned arm pays the tuning: its bench JSON's first_step_s is the compile cost); log q-tune.log
#           [all.done]
#   full    restore the kept shards; two proxy212 runs on the strict caches, with the extra arguments in
#           $TRAIN_EXTRA_FILE when set [full.done]
#   wait S [D [LOG]]  as session18_queue.sh's
# Carry [".proxy"] without shard 4 for tune, then [".proxy"] with shard 4 alone for full, at once after.
set -u
source scripts/device/common.sh
CDT="--set train.inductor_options=coordinate_descent_tuning=true"

tune_queue() {
  clocks_log clocks.csv
  gpu_tests inductor-options 300 tests/test_inductor_options.py
  bytecode_on
  ab_rounds strict "1 2 3" default "" cdt "$CDT"
}

case "${1:-}" in
  tune) check_start; logged q-tune.log tune_queue ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 tune | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
