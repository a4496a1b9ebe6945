#!/usr/bin/env bash
# Issue 4, sixteenth session (one H200); written at the end of the fifteenth.
#   verify  the candidate Gluon FP8 head forward (head_fwd_gluon_bench.py: ragged shapes, then the record's
#           shape against cuBLAS, bit equality and times); the clock sampler's GPU test; a bench of the
#           default that reports the GPU's clock (first GPU run of gpu_clocks inside `speedrun bench`)
#           [all.done]
#   gluon   (written in the sixteenth session) the FP8 head's Gluon forward with the CE row sums
#           (head_fwd_gluon_bench.py: variants, CE with and without row sums, both paths end to end); the
#           GPU tests of the head, the CE kernel and the Gluon head; A/B/A/B benches of model.head_kernel
#           cublas against gluon on one shared compiler cache [all.done]
#   final   (sixteenth session, after head_kernel=auto became the default) the strict cold start of the
#           default; the Gluon head's GPU tests; benches of the default and of head_kernel=cublas on one
#           shared compiler cache [all.done]
#   transposed  (for the seventeenth session) the CE writing the gradient in both layouts
#           (`model.ce_transposed`, written and CPU-tested in the sixteenth, never run on a GPU): the head
#           bench (its launch_transposed rows), the head's and the CE kernel's GPU tests, A/B/A/B benches of
#           ce_transposed false against true on one shared compiler cache [all.done]
#   stage   keep the carried proxy shards in /tmp/proxy-keep (the tree and all four shards exceed one
#           call's carry)
#   full    restore the kept shards; two proxy212 runs of the default (their summaries now carry the GPU
#           clock) [full.done]
#   wait S [D [LOG]]  print LOG (default q.log) until $RES/D.done exists (default all) or S seconds
#           passed; tar the results into $OUT
# Carry [".proxy"] without shard 4 for verify and stage, then [".proxy"] with shard 4 alone for full.
# Launch: (setsid nohup bash scripts/device/session16_queue.sh verify > /tmp/q-launch.log 2>&1 &)
set -u
source scripts/device/common.sh

head_bench() {  # head_bench NAME SECONDS LINES: the clock log, GPU 0, head_fwd_gluon_bench.py into $RES/NAME.*
  clocks_log clocks.csv
  export CUDA_VISIBLE_DEVICES=0
  (cd scripts/device && timeout "$2" python3 head_fwd_gluon_bench.py "$RES/$1.json") > "$RES/$1.log" 2>&1
  echo "$(date +%T) $1: exit $? | $(tail -"$3" "$RES/$1.log" | tr '\n' ' ')"
}

head_ab() {  # head_ab NAME CACHE A "A's ARGS" B "B's ARGS": head_bench NAME, the head's and the CE kernel's GPU
  # tests ($RES/gpu-tests-NAME.log), then A/B/A/B benches on the shared compiler cache CACHE
  head_bench "$1" 300 4
  env -u PYTHONPYCACHEPREFIX timeout 420 python3 -m pytest -m gpu -q -s tests/test_head_gluon.py tests/test_head.py \
    tests/test_softcap_ce.py > "$RES/gpu-tests-$1.log" 2>&1
  echo "$(date +%T) GPU tests (head, CE): $(tail -1 "$RES/gpu-tests-$1.log")"
  for round in 1 2; do
    AB_CACHE=$2 ab_shared "$3$round" $4
    AB_CACHE=$2 ab_shared "$5$round" $6
  done
}

case "${1:-}" in
  verify)
    queue_start
    ( head_bench head-fwd-gluon 420 12
      env -u PYTHONPYCACHEPREFIX timeout 120 python3 -m pytest -m gpu -q tests/test_gpu_clocks.py \
        > "$RES/gpu-tests-clocks.log" 2>&1
      echo "$(date +%T) clock GPU test: $(tail -1 "$RES/gpu-tests-clocks.log")"
      ab default
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  gluon)
    queue_start
    ( head_ab head-gluon ab-head cublas "--set model.head_kernel=cublas" gluon "--set model.head_kernel=gluon"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  final)
    queue_start
    ( verify_prelude
      env -u PYTHONPYCACHEPREFIX timeout 200 python3 -m pytest -m gpu -q -s tests/test_head_gluon.py \
        > "$RES/gpu-tests-head-final.log" 2>&1
      echo "$(date +%T) GPU tests (Gluon head): $(tail -1 "$RES/gpu-tests-head-final.log")"
      AB_CACHE=ab-final ab_shared default
      AB_CACHE=ab-final ab_shared cublas --set model.head_kernel=cublas
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  transposed)
    queue_start
    ( head_ab head-transposed ab-t copy "" transposed "--set model.ce_transposed=true"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  stage) stage_proxy ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 verify | gluon | final | transposed | stage | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
