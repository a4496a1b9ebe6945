#!/usr/bin/env bash
# Issue 4, for the thirty-first session: the Gluon backward loading the next tile's first slice with this
# tile's last (XTILE), and the epilogue's register share.
#   xtile   the Gluon GPU tests (XTILE bit-equal to the default at four shapes); relu2_gluon_bench.py
#           (per-call µs of the backward from a: the default against BWD_A_VARIANTS in alternating
#           passes) [relu2-gluon.json, relu2-gluon.log]; then, if the tests passed and XTILE beat the
#           default by 5 µs a call (median over the passes), A/B rounds of `speedrun bench` on one cache:
#           the default against --set model.mlp_options=bwd.XTILE=1 (no new bench starts after
#           ${AB_BUDGET:-300} s) [all.done, q.log]
#   steady  relu2_gluon_bench.py (with the variants timed in turns after a warm-up: steady_us)
#           [relu2-gluon.json, relu2-gluon.log], then the whole GPU suite in one pytest process
#           [gpu-tests-all.log, all.done, q.log]
#   regs    A/B rounds of `speedrun bench` on one cache: the default against
#           --set model.mlp_options=bwd.XTILE=1,bwd.EPI_REGS=136 (the steady per-call timings' best; no
#           new bench starts after ${AB_BUDGET:-230} s) [all.done, q.log]
#   prof    for the next session: `speedrun bench --profile` of the default and of
#           bwd.XTILE=1,bwd.EPI_REGS=136 on one cache, to see whether the per-call gain (451 against 476 µs
#           in turns) reaches the kernel inside the step [prof-*.txt, ab-prof_*.log, all.done, q.log]
#   full    the default pair of proxy212 runs (common.sh's full_pair) [full.done, q-full.log]
#   full-x  the same pair with --set model.mlp_options=bwd.XTILE=1 [full.done, q-full.log]
#   wait S [D [LOG]]  follow until $RES/D.done or S seconds; tar results into $OUT
# Carry [".proxy"] (shards 1-3 and val); `full`/`full-x` need a second call carrying shard 4.
set -u
source scripts/device/common.sh

xtile_queue() {
  measure_start "${AB_BUDGET:-300}"
  gluon_tests_and_bench 240 || { echo "$(date +%T) no A/B"; return; }
  local gain  # default minus XTILE, µs a call, medians over the passes
  gain=$(python3 - "$RES/relu2-gluon.json" <<'PY'
import json, statistics, sys
r = json.load(open(sys.argv[1]))
names, rows = r.get("bwd_a_variant_names", []), r.get("bwd_a_passes_us", [])
col = lambda n: statistics.median(row[names.index(n)] for row in rows)
print(f"{col('default') - col('xtile'):.1f}" if rows and "xtile" in names else "0")
PY
)
  echo "$(date +%T) XTILE gain per call: $gain us"
  python3 -c "import sys; sys.exit(0 if float('$gain') >= 5 else 1)" || { echo "$(date +%T) no A/B"; return; }
  ab_rounds ab31 "1 2" plain "" "xtile" "--set model.mlp_options=bwd.XTILE=1"
}

case "${1:-}" in
  xtile) check_start; ( xtile_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  steady) ( measure_start
    (cd scripts/device && timeout 150 python3 relu2_gluon_bench.py "$RES/relu2-gluon.json") > "$RES/relu2-gluon.log" 2>&1
    grep -E "check|us" "$RES/relu2-gluon.log"
    gpu_suite_inline ) > "$RES/q.log" 2>&1 ;;
  regs) ( measure_start "${AB_BUDGET:-230}"
    ab_rounds ab31r "1 2" plain "" "x136_" "--set model.mlp_options=bwd.XTILE=1,bwd.EPI_REGS=136"
    touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  prof) ( measure_start
    AB_CACHE=ab31p ab_shared prof_plain --profile "$RES/prof-plain.txt"
    AB_CACHE=ab31p ab_shared prof_x136 --profile "$RES/prof-x136.txt" --set model.mlp_options=bwd.XTILE=1,bwd.EPI_REGS=136
    grep -h -i "relu2" "$RES"/prof-*.txt
    touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full) full_pair ;;
  full-x) echo "--set model.mlp_options=bwd.XTILE=1" > /tmp/train-extra.txt
    TRAIN_EXTRA_FILE=/tmp/train-extra.txt full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 xtile | steady | regs | prof | full | full-x | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
