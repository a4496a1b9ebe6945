#!/usr/bin/env bash
# Issue 4, for the thirty-second session: the head's CE gradient in both layouts in one Gluon pass
# (ce_grad_gluon.py, behind model.ce_transposed; the default since this session).
#   both    the GPU tests of the new path (bytes equal to the lean kernel and its transposed copy; the compiled
#           head bit-equal with and without model.ce_transposed; the Triton tile fall-back) [gpu-tests-both.log];
#           ce_both_bench.py (per call in turns: the default's lean kernel + copy against the new path, its
#           parts and launch variants) [ce-both.json, ce-both.log]; then, if the tests passed and the new path
#           beat the lean kernel and the copy by 100 µs a call, A/B rounds of `speedrun bench` on one cache:
#           --set model.ce_transposed=false against the default (no new bench starts after ${AB_BUDGET:-300} s)
#           [all.done, q.log]
#   more    two more A/B rounds on the same cache (no new bench after ${AB_BUDGET:-330} s) [all.done, q.log]
#   full-t  the pair of proxy212 runs with --set model.ce_transposed=true [full.done, q-full.log]
#   full    the default pair (common.sh's full_pair) [full.done, q-full.log]; run in this session before the
#           default changed, so it measured the transposed copy
#   full-c  the pair with --set model.ce_transposed=false (the old default) [full.done, q-full.log]
#   wait S [D [LOG]]  follow until $RES/D.done or S seconds; tar results into $OUT
# Carry [".proxy"] (shards 1-3 and val); `full`/`full-t` need a second call carrying shard 4.
set -u
source scripts/device/common.sh

both_queue() {
  measure_start "${AB_BUDGET:-300}"
  gpu_tests both 200 tests/test_ce_grad_gluon.py tests/test_head.py tests/test_softcap_ce.py \
    -k "both_layouts or ce_transposed or transposed_gradient_at_record"
  (cd scripts/device && timeout 150 python3 ce_both_bench.py "$RES/ce-both.json") > "$RES/ce-both.log" 2>&1
  cat "$RES/ce-both.log" | grep -v "^ - \|nanobind"
  grep -q " passed" "$RES/gpu-tests-both.log" && ! grep -qE "[0-9]+ (failed|error)" "$RES/gpu-tests-both.log" \
    || { echo "$(date +%T) tests did not pass: no A/B"; return; }
  local gain
  gain=$(python3 -c "import json; u = json.load(open('$RES/ce-both.json'))['us']; print(f\"{u['lean_copy'] - u['both']:.1f}\")" \
    2>/dev/null || echo 0)
  echo "$(date +%T) gain per call: $gain us"
  python3 -c "import sys; sys.exit(0 if float('$gain') >= 100 else 1)" || { echo "$(date +%T) no A/B"; return; }
  ab_rounds ab32 "1 2" copy "--set model.ce_transposed=false" "both" ""
}

case "${1:-}" in
  both) check_start; ( both_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  more) rm -f "$RES/all.done"; ( measure_start "${AB_BUDGET:-330}"
    ab_rounds ab32 "3 4" copy "--set model.ce_transposed=false" "both" ""
    touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full-t) echo "--set model.ce_transposed=true" > /tmp/train-extra.txt
    TRAIN_EXTRA_FILE=/tmp/train-extra.txt full_pair ;;
  full) full_pair ;;
  full-c) echo "--set model.ce_transposed=false" > /tmp/train-extra.txt
    TRAIN_EXTRA_FILE=/tmp/train-extra.txt full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 both | more | full-t | full | full-c | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
