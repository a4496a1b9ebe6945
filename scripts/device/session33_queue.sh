#!/usr/bin/env bash
# Issue 4, for the thirty-third session: the thirty-second session's new default (model.ce_transposed=true,
# the head's CE gradient in both layouts from ce_grad_gluon.py) measured where it had not been.
#   verify  the strict cold start as the machine's first Python process (empty compiler caches, no bytecode;
#           strict-cold.log), the clock and power log, then the whole GPU suite in one pytest process
#           [gpu-tests-all.log, all.done, q.log]
#   full    the default pair of proxy212 runs (common.sh's full_pair, on the strict run's caches)
#           [full.done, q-full.log]
#   full-c  the same pair with --set model.ce_transposed=false (the old default), for A/B on this card
#           [full.done, q-full.log]
#   prof    `speedrun bench --profile` of the default on the strict caches [profile-default.txt,
#           prof-default.{json,log}, all.done, q.log]
#   wgrad   (written for the next session) the GPU tests of blas.py [gpu-tests-wgrad.log]; mm_blas_bench.py
#           (per call, cuBLAS against cuBLASLt, every linear layer's three products) [mm-blas.json, mm-blas.log];
#           then, if the tests passed, A/B rounds of `speedrun bench` on one cache: the default against
#           --set model.wgrad_blas=auto (no new bench starts after ${AB_BUDGET:-300} s) [all.done, q.log]
#   full-w  the pair of proxy212 runs with --set model.wgrad_blas=auto [full.done, q-full.log]
#   wait S [D [LOG]]  follow until $RES/D.done or S seconds; tar results into $OUT
# Carry [".proxy"] (shards 1-3 and val) for `verify`; `full`/`full-c` need a later call carrying shard 4.
set -u
source scripts/device/common.sh

prof_default() { bytecode_on; profile_bench default; }

wgrad_queue() {
  measure_start "${AB_BUDGET:-300}"
  gpu_tests wgrad 200 tests/test_blas.py
  (cd scripts/device && timeout 120 python3 mm_blas_bench.py "$RES/mm-blas.json") > "$RES/mm-blas.log" 2>&1
  grep " us" "$RES/mm-blas.log"
  grep -q " passed" "$RES/gpu-tests-wgrad.log" && ! grep -qE "[0-9]+ (failed|error)" "$RES/gpu-tests-wgrad.log" \
    || { echo "$(date +%T) tests did not pass: no A/B"; return; }
  ab_rounds ab33 "1 2" plain "" "lt" "--set model.wgrad_blas=auto"
}

case "${1:-}" in
  verify) check_start; ( strict_cold; clocks_log clocks.csv; export CUDA_VISIBLE_DEVICES=0
    gpu_suite_inline ) > "$RES/q.log" 2>&1 ;;
  full) full_pair ;;
  full-c) echo "--set model.ce_transposed=false" > /tmp/train-extra.txt
    TRAIN_EXTRA_FILE=/tmp/train-extra.txt full_pair ;;
  prof) logged q.log prof_default ;;
  wgrad) check_start; ( wgrad_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full-w) echo "--set model.wgrad_blas=auto" > /tmp/train-extra.txt
    TRAIN_EXTRA_FILE=/tmp/train-extra.txt full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 verify | full | full-c | prof | wgrad | full-w | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
