#!/usr/bin/env bash
# Issue 4, for the thirty-sixth session: the embedding tables' gradients added into the in-place sums row
# by row (model.embed_kernel=rows, embed_rows.py).
#   ab     the GPU tests of test_embed_rows.py [gpu-tests-rows.log]; then A/B rounds of `speedrun bench` on
#          the proxy's shards 1-3 (--data .proxy: real tokens, whose rows repeat as in a run) on one cache,
#          the order turned each round: the default and --set model.embed_kernel=rows (no new round after
#          ${AB_BUDGET:-330} s) [all.done, q.log]
#   fullab ORDER  proxy212 runs one after the other on one compiler cache, ORDER a list of arms: "rows"
#          (--set model.embed_kernel=rows) or "def" (the default), each run named full-ARM-N with N the
#          next free number; with TESTS_FIRST=1, test_embed_rows.py's GPU tests first [gpu-tests-rows2.log]
#          [full.done, q-full.log]
#   wait S [D [LOG]]  follow until $RES/D.done or S seconds; tar results into $OUT
# Carry [".proxy"] (shards 1-3 and val) for `ab`; `fullab` needs a later call carrying shard 4.
set -u
source scripts/device/common.sh

ab_queue() {
  gpu_tests rows 240 tests/test_embed_rows.py
  measure_start "${AB_BUDGET:-330}"
  ARM_ARGS=([plain]="--data .proxy" [rows]="--data .proxy --set model.embed_kernel=rows")
  arm_rounds ab36 "plain rows" "rows plain" "plain rows" "rows plain" "plain rows"
}

declare -A FULL_ARGS=([rows]="--set model.embed_kernel=rows")
fullab_queue() {
  [ -n "${TESTS_FIRST:-}" ] && gpu_tests rows2 200 tests/test_embed_rows.py
  full_arms "$@"
}

case "${1:-}" in
  ab) check_start; ( ab_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  fullab) shift; restore_proxy; bytecode_on
          ( fullab_queue "$@"; touch "$RES/full.done" ) > "$RES/q-full.log" 2>&1 ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 ab | fullab ARM... | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
