#!/usr/bin/env bash
# Issue 4, nineteenth session (one H200): train.cudagraphs worked in the session's first call
# (session18_queue.sh cg: A/B 630.09 -> 629.62 and 630.13 -> 626.67 ms/step).
#   check   keep the carried shards (stage_proxy); the strict cold start with train.cudagraphs=true as the
#           machine's first Python process; where launch_transposed's two layouts differ
#           (ce_transposed_check.py); then two more A/B rounds default vs cudagraphs on the strict
#           caches [all.done]
#   full    restore the kept shards; two proxy212 runs with train.cudagraphs=true on the strict caches
#           [full.done]
#   ct      the CE tile kernel rebuilt after check's finding (rows packed into words by e5m2x2 conversions,
#           no byte-wise tiles): the CE and head GPU tests, the head bench with TILE_VARIANTS=1 (every tile
#           shape timed and checked for the exact transpose), then A/B/A/B model.ce_transposed=true against
#           the default (rounds $CT_ROUNDS, default "1 2") [all.done]
#   wait S [D [LOG]]  as session18_queue.sh's
# Carry [".proxy"] without shard 4 for check, then [".proxy"] with shard 4 alone for full, at once after.
set -u
source scripts/device/common.sh

cg_extra() { echo "--set train.cudagraphs=true" > /tmp/cg-extra; export TRAIN_EXTRA_FILE=/tmp/cg-extra; }

case "${1:-}" in
  check)
    stage_proxy > /dev/null
    queue_start
    ( echo "[gpu0] $(date +%T) strict cold start (cudagraphs)"
      env -u PYTHONPYCACHEPREFIX PYTHONDONTWRITEBYTECODE=1 $(caches strict fresh) CUDA_VISIBLE_DEVICES=0 \
        python3 -m speedrun.train "${ARGS[@]}" --steps 20 --set train.cudagraphs=true --out /tmp/runs/strict-cold \
        > "$RES/strict-cold.log" 2>&1
      echo "[gpu0] $(date +%T) strict: exit $? | $(grep -E 'cold start' "$RES/strict-cold.log" | head -2 | tr '\n' ' ')"
      clocks_log clocks.csv
      disown
      export CUDA_VISIBLE_DEVICES=0
      (cd scripts/device && timeout 240 python3 ce_transposed_check.py "$RES/ce-transposed-check.json") \
        > "$RES/ce-transposed-check.log" 2>&1
      echo "$(date +%T) check: exit $? | $(grep -c . "$RES/ce-transposed-check.log") lines"
      bytecode_on
      for r in ${CG_ROUNDS:-3 4}; do
        AB_CACHE=strict ab_shared "cudagraphs$r" --set train.cudagraphs=true
        AB_CACHE=strict ab_shared "default$r"
      done
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  ct)
    rm -f "$RES"/*.done
    ( clocks_log clocks-ct.csv
      disown
      export CUDA_VISIBLE_DEVICES=0
      env -u PYTHONPYCACHEPREFIX timeout 300 python3 -m pytest -m gpu -q tests/test_softcap_ce.py tests/test_head.py \
        -k "transposed or record_size or gpu" > "$RES/gpu-tests-ct.log" 2>&1
      echo "$(date +%T) GPU tests (ct): $(tail -1 "$RES/gpu-tests-ct.log")"
      (cd scripts/device && TILE_VARIANTS=1 timeout 300 python3 head_fwd_gluon_bench.py "$RES/head-ct.json") \
        > "$RES/head-ct.log" 2>&1
      echo "$(date +%T) head bench: exit $? | $(tail -3 "$RES/head-ct.log" | tr '\n' ' ')"
      bytecode_on
      for r in ${CT_ROUNDS:-1 2}; do
        AB_CACHE=ab-ct ab_shared "cetransposed$r" --set model.ce_transposed=true
        AB_CACHE=ab-ct ab_shared "default$r"
      done
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full) cg_extra; full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 check | ct | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
