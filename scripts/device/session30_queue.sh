#!/usr/bin/env bash
# Issue 4, for the thirty-first session: the Gluon backward whose epilogue loads a's tile by TMA (A_TMA).
#   atma    the Gluon GPU tests (the A_TMA backward bit-equal to the default's at three shapes, both ring
#           shapes); relu2_gluon_bench.py (per-call µs of the backward from a: plain loads against a by TMA
#           with 2 x 64-wide and 4 x 32-wide ring stages: A_TMA 1, 2) [relu2-gluon.json, relu2-gluon.log];
#           then, if the tests passed and a ring shape beat the plain loads, A/B rounds of `speedrun bench`
#           on one cache: the default against --set model.mlp_options=bwd.A_TMA=<the faster> (no new
#           bench starts after ${AB_BUDGET:-400} s)
#           [all.done, q.log]
#   full1   restore the kept shards; one proxy212 run on the A/B's cache, extra arguments from
#           $TRAIN_EXTRA_FILE when set [full.done, q-full.log]
#   full    the default pair of proxy212 runs (common.sh's full_pair) [full.done, q-full.log]
#   full-atma N  the same pair with --set model.mlp_options=bwd.A_TMA=N [full.done, q-full.log]
#   wait S [D [LOG]]  follow until $RES/D.done or S seconds; tar results into $OUT
# Carry [".proxy"] (shards 1-3 and val); `full`/`full1` need a second call carrying shard 4.
set -u
source scripts/device/common.sh

atma_queue() {
  measure_start "${AB_BUDGET:-400}"
  gluon_tests_and_bench 200 || { echo "$(date +%T) no A/B"; return; }
  local arm  # the faster ring shape, if it beats the plain loads per call
  arm=$(python3 - "$RES/relu2-gluon.json" <<'PY'
import json, sys
us = json.load(open(sys.argv[1])).get("us", {})
plain, rings = us.get("bwd_gluon_from_a"), {1: us.get("bwd_gluon_from_a_tma_k64x2"), 2: us.get("bwd_gluon_from_a_tma_k32x4")}
best = min((v, k) for k, v in rings.items() if v) if plain and any(rings.values()) else None
print(best[1] if best and best[0] < plain else "")
PY
)
  [ -n "$arm" ] || { echo "$(date +%T) no A_TMA ring beat the plain loads per call: no A/B"; return; }
  echo "$(date +%T) A/B of bwd.A_TMA=$arm"
  ab_rounds ab30 "1 2 3" plain "" "atma${arm}_" "--set model.mlp_options=bwd.A_TMA=$arm"
}

case "${1:-}" in
  atma) check_start; ( atma_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full1) restore_proxy; bytecode_on; ( train 0 full-a ab30; summaries; touch "$RES/full.done" ) > "$RES/q-full.log" 2>&1 ;;
  full) full_pair ;;
  full-atma) echo "--set model.mlp_options=bwd.A_TMA=${2:?A_TMA value}" > /tmp/train-extra.txt
    TRAIN_EXTRA_FILE=/tmp/train-extra.txt full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 atma | full1 | full | full-atma N | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
