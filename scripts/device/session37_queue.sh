#!/usr/bin/env bash
# Issue 4, for the thirty-seventh session: the whole GPU suite with model.embed_kernel=rows the default
# (grad_accum -> inplace), then full runs of the default against CUDA graphs on top of it.
#   suite  the whole GPU suite in one pytest process [gpu-tests-all.log, all.done, q.log]
#   fullab ARM...  proxy212 runs one after the other on one compiler cache, ARM "def" (the default) or "cg"
#          (--set train.cudagraphs=true), each run named full-ARM-N with N the next free number
#          [full.done, q-full.log]
#   wait S [D [LOG]]  follow until $RES/D.done or S seconds; tar results into $OUT
# Carry [".proxy"] (shards 1-3 and val) for `suite`; `fullab` needs a later call carrying shard 4.
set -u
source scripts/device/common.sh

declare -A FULL_ARGS=([cg]="--set train.cudagraphs=true")

case "${1:-}" in
  suite) check_start; ( clocks_log clocks-suite.csv; gpu_suite_inline ) > "$RES/q.log" 2>&1 ;;
  fullab) shift; restore_proxy; bytecode_on
          ( full_arms "$@"; touch "$RES/full.done" ) > "$RES/q-full.log" 2>&1 ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 suite | fullab ARM... | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
