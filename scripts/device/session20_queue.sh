#!/usr/bin/env bash
# Issue 4, twentieth session (one H200): train.grad_accum=graph (the micro-steps' gradients added up inside
# the compiled backward, grad_accum.py), the new default where the whole model is compiled.
#   check   keep the carried shards (stage_proxy); the strict cold start of the new default as the machine's
#           first Python process; the grad_accum GPU test; then A/B/A/B benches, graph (default) against
#           train.grad_accum=autograd, on the strict caches (rounds $AB_ROUNDS, default "1 2") [all.done]
#   full    restore the kept shards; two proxy212 runs of the default on the strict caches [full.done]
#   prof    a 3-step profile of each arm on the strict caches (speedrun bench --profile) [all.done]
#   pdl     train.pdl (Inductor's kernels with programmatic dependent launch): its GPU test, then A/B/A/B
#           benches against the default on one fresh shared cache (random tokens: no shards needed) [all.done]
#   ab      A/B/A/B benches, graph against autograd, on another machine: one fresh shared cache, random
#           tokens (rounds $AB_ROUNDS, default "3 4") [all.done]
#   wait S [D [LOG]]  as session18_queue.sh's
# Carry [".proxy"] without shard 4 for check, then [".proxy"] with shard 4 alone for full, at once after.
set -u
source scripts/device/common.sh

queue_on_gpu0() {  # queue_on_gpu0 NAME: no stale done files, the GPU named, its clocks logged; then GPU 0
  rm -f "$RES"/*.done
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$RES/gpus-$1.csv"
  clocks_log "clocks-$1.csv"
  export CUDA_VISIBLE_DEVICES=0
}

case "${1:-}" in
  check)
    check_start
    ( verify_prelude
      gpu_tests grad-accum 240 tests/test_grad_accum.py
      bytecode_on
      ab_rounds strict "1 2" graph "" autograd "--set train.grad_accum=autograd"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  prof)
    rm -f "$RES"/*.done
    ( export CUDA_VISIBLE_DEVICES=0
      bytecode_on
      for arm in graph autograd; do profile_bench "$arm" --set train.grad_accum=$arm; done
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  pdl)
    ( queue_on_gpu0 pdl
      gpu_tests pdl 240 tests/test_pdl.py
      bytecode_on
      ab_rounds ab-pdl "1 2" pdl "--set train.pdl=true" default ""
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  ab)
    ( queue_on_gpu0 ab
      bytecode_on
      ab_rounds ab-ga "3 4" graph "" autograd "--set train.grad_accum=autograd"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 check | full | prof | pdl | ab | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
