#!/usr/bin/env bash
# Issue 4, for the thirty-fifth session: CUDA graphs with the gradient sums added in place
# (train.grad_accum=inplace, the default with train.cudagraphs).
#   ab     the GPU tests of test_cudagraphs.py [gpu-tests-cg.log]; then A/B/C rounds of `speedrun bench` on
#          one cache, the order turned each round: the default, --set train.cudagraphs=true (in-place sums)
#          and --set train.grad_accum=inplace without graphs (no new round after ${AB_BUDGET:-380} s)
#          [all.done, q.log]
#   full   a proxy212 pair (common.sh's full_pair) with the arguments in $FULL_EXTRA (e.g.
#          "--set train.cudagraphs=true") [full.done, q-full.log]
#   fullab a proxy212 run with --set train.cudagraphs=true (full-cg), then one with the default (full-def),
#          both on the caches of the earlier `full` calls [full.done, q-full.log]
#   wait S [D [LOG]]  follow until $RES/D.done or S seconds; tar results into $OUT
# Carry [".proxy"] (shards 1-3 and val) for `ab`; `full` needs a later call carrying shard 4.
set -u
source scripts/device/common.sh

ab_queue() {
  gpu_tests cg 200 tests/test_cudagraphs.py
  measure_start "${AB_BUDGET:-380}"
  ARM_ARGS=([plain]="" [cg]="--set train.cudagraphs=true" [ip]="--set train.grad_accum=inplace")
  arm_rounds ab35 "plain cg ip" "ip cg plain" "cg plain ip" "ip plain cg"
}

case "${1:-}" in
  ab) check_start; ( ab_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full) [ -n "${FULL_EXTRA:-}" ] && { echo "$FULL_EXTRA" > /tmp/full-extra; export TRAIN_EXTRA_FILE=/tmp/full-extra; }
        full_pair ;;
  fullab) restore_proxy; bytecode_on; echo "--set train.cudagraphs=true" > /tmp/full-extra
          ( TRAIN_EXTRA_FILE=/tmp/full-extra train 0 full-cg strict; train 0 full-def strict; summaries
            touch "$RES/full.done" ) > "$RES/q-full.log" 2>&1 ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 ab | full | fullab | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
