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

three_way() {  # three_way ROUND ORDER...: one bench per name in ORDER (plain, cg, ip) on the shared cache
  local r=$1 name; shift
  for name in "$@"; do
    case $name in
      plain) AB_CACHE=ab35 ab_shared "plain$r" ;;
      cg) AB_CACHE=ab35 ab_shared "cg$r" --set train.cudagraphs=true ;;
      ip) AB_CACHE=ab35 ab_shared "ip$r" --set train.grad_accum=inplace ;;
    esac
  done
}

ab_queue() {
  gpu_tests cg 200 tests/test_cudagraphs.py
  measure_start "${AB_BUDGET:-380}"
  local r=1 order
  for order in "plain cg ip" "ip cg plain" "cg plain ip" "ip plain cg"; do
    [ "$(date +%s)" -lt "$AB_DEADLINE" ] || { echo "$(date +%T) A/B budget spent"; break; }
    three_way $r $order
    r=$((r + 1))
  done
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
