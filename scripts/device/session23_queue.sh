#!/usr/bin/env bash
# Issue 4, twenty-third session (one H200): train.head_once (the FP8 head's weight operands quantised once a
# step) on the GPU for the first time, the device-timed Muon figures, a full pair and a profile.
#   head    keep the carried shards (stage_proxy); the clock log; the GPU tests of head_once (test_head.py,
#           test_grad_accum.py); optim_bench (muon_*_device_us); three A/B rounds on one cache: the default
#           against train.head_once=true; log q-head.log [all.done]
#   full    restore the kept shards; two proxy212 runs of the default on the strict caches [full.done]
#   prof    a 3-step profile of the default on the strict caches, extra bench arguments from $PROF_ARGS;
#           ($PROF_NAME names its files, default new); then, when $AB_ROUNDS is set, those rounds of head's
#           A/B; log q-prof$PROF_NAME.log [all.done]
#   wait S [D [LOG]]  as session18_queue.sh's
# Carry [".proxy"] without shard 4 for head, then [".proxy"] with shard 4 alone for full, at once after.
set -u
source scripts/device/common.sh
OFF="--set train.head_once=false"  # the A/B's "default" arm: head_once off, the default when this ran
ON="--set train.head_once=true"

head_queue() {
  clocks_log clocks.csv
  gpu_tests head-once 300 tests/test_head.py tests/test_grad_accum.py
  optim_bench
  bytecode_on
  ab_rounds strict "1 2 3" default "$OFF" headonce "$ON"
}

prof_queue() {
  bytecode_on
  profile_bench "${PROF_NAME:-new}" ${PROF_ARGS:-}
  if [ -n "${AB_ROUNDS:-}" ]; then ab_rounds strict "" default "$OFF" headonce "$ON"; fi
}

case "${1:-}" in
  head) check_start; logged q-head.log head_queue ;;
  prof) logged "q-prof${PROF_NAME:-}.log" prof_queue ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 head | full | prof | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
