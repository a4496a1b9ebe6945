#!/usr/bin/env bash
# Issue 4, twenty-first session (one H200): the optimisers' fused kernels (optim.kernel), the block lists'
# order kernel (attention.order_kernel), the inline attention gate (model.gate_kernel, the default while
# `check` ran; measured 42 ms/step slower there and made opt-in) and the λ partial sums of attn_inputs
# summed in the traced backward (no switch). Calls 5-6 of the session ran their A/B rounds as inline
# command lines (docs/benchmarks.md, twenty-first session).
#   check   keep the carried shards (stage_proxy); the strict cold start of the new default as the machine's
#           first Python process; the new kernels' GPU tests; the optimiser / order micro-benchmark; then
#           A/B benches on the strict caches: new (default) against old (the three switches back), round 1
#           with a third arm, gate_kernel=linear alone [all.done]
#   full    restore the kept shards; two proxy212 runs of the default on the strict caches [full.done]
#   prof    a 3-step profile of the default on the strict caches (speedrun bench --profile) [all.done]
#   wait S [D [LOG]]  as session18_queue.sh's
# Carry [".proxy"] without shard 4 for check, then [".proxy"] with shard 4 alone for full, at once after.
set -u
source scripts/device/common.sh
OLD="--set model.gate_kernel=linear --set optim.kernel=torch --set attention.order_kernel=torch"

case "${1:-}" in
  check)
    check_start
    ( verify_prelude
      gpu_tests new 300 tests/test_optim_kernels.py tests/test_block_order.py tests/test_attn_inputs.py
      optim_bench
      bytecode_on
      AB_CACHE=strict ab_shared new1
      AB_CACHE=strict ab_shared old1 $OLD
      AB_CACHE=strict ab_shared gatelinear1 --set model.gate_kernel=linear
      AB_CACHE=strict ab_shared new2
      AB_CACHE=strict ab_shared old2 $OLD
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  prof)
    rm -f "$RES"/*.done
    ( export CUDA_VISIBLE_DEVICES=0
      bytecode_on
      profile_bench new
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 check | full | prof | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
