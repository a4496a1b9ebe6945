#!/usr/bin/env bash
# Issue 4, twenty-second session (one H200): the float32 matrices cast to bfloat16 once a step
# (train.cast_once, grad_accum.StepCasts) instead of in each of the eight micro-steps' graphs.
#   check   keep the carried shards (stage_proxy); the strict cold start of the new default as the machine's
#           first Python process; the GPU tests of the optimiser kernels (float32 criterion relaxed in the
#           twenty-first session), of attn_inputs (the shared bf16_rounding helper) and of grad_accum (the
#           casts); then three A/B rounds on the strict caches: new (default) against old (cast_once=false)
#           [all.done]
#   full    restore the kept shards; two proxy212 runs of the default on the strict caches [full.done]
#   suite   the whole GPU suite, a pytest per file with GPU tests, each at most 170 s, its own log q-suite.log
#           (wait S all q-suite.log) [all.done]
#   head    (written for the next session) the GPU tests of train.head_once (test_head.py, test_grad_accum.py),
#           then three A/B rounds: the default against train.head_once=true; log q-head.log [all.done]
#   wait S [D [LOG]]  as session18_queue.sh's
# Carry [".proxy"] without shard 4 for check, then [".proxy"] with shard 4 alone for full, at once after.
set -u
source scripts/device/common.sh
OLD="--set train.cast_once=false"

case "${1:-}" in
  check)
    check_start
    ( verify_prelude
      gpu_tests new 240 tests/test_optim_kernels.py tests/test_attn_inputs.py tests/test_grad_accum.py
      bytecode_on
      ab_rounds strict "1 2 3" new "" old "$OLD"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  suite) logged q-suite.log suite_per_file ;;
  head)
    queue_start
    ( export CUDA_VISIBLE_DEVICES=0
      gpu_tests head-once 300 tests/test_head.py tests/test_grad_accum.py
      bytecode_on
      ab_rounds strict "1 2 3" default "" headonce "--set train.head_once=true"
      touch "$RES/all.done" ) > "$RES/q-head.log" 2>&1 ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 check | full | suite | head | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
