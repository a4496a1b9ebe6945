#!/usr/bin/env bash
# The attention's Gluon kernels (speedrun.kernels.attn_gluon) at the record's shapes, after their GPU tests
# (tests/test_attn_gluon.py):
#   kernels [STAGES]  attn_gluon_bench.py: agreement with FlexAttention, time and energy a call of the
#                     forward and backward at each window, eager and replayed from CUDA graphs
#   variants          attn_gluon_variants_bench.py: the kernels with int32 against int64 document ids (the
#                     same bits), from CUDA graphs, 3 rounds in turns
#   host              attn_gluon_host_time.py: where a launch's host time goes (no tests, no data)
# usage: bash scripts/bench/attn_gluon.sh kernels [STAGES] | variants | host
# Needs .proxy with the first training shard (kernels, variants). Results in $RES, then $OUT/results.tar.gz.
set -u
source scripts/bench/common.sh
gpus_csv
mode=${1:-}; shift || true
case "$mode" in
  kernels|variants)
    unpack_proxy
    gpu_tests attn 300 tests/test_attn_gluon.py
    grep -E "Error|assert|passed|failed" "$RES/gpu-tests-attn.log" | head -30
    bytecode_on
    clocks_log clocks.csv
    if [ "$mode" = kernels ]; then
      timeout 280 python3 scripts/bench/attn_gluon_bench.py .proxy "$RES/attn-gluon.json" 1.5 "${1:-2}" \
        > "$RES/attn-gluon.log" 2>&1
      echo "$(date +%T) kernels: exit $?"; tail -60 "$RES/attn-gluon.log"
    else
      timeout 330 python3 scripts/bench/attn_gluon_variants_bench.py .proxy "$RES/attn-variants.json" 0.7 3 \
        > "$RES/attn-variants.log" 2>&1
      echo "$(date +%T) variants: exit $?"; cat "$RES/attn-variants.log"
    fi ;;
  host)
    timeout 200 python3 scripts/bench/attn_gluon_host_time.py "$RES/attn-host.txt" 200
    echo "$(date +%T) host: exit $?" ;;
  *) echo "usage: $0 kernels [STAGES] | variants | host" >&2; exit 2 ;;
esac
collect
