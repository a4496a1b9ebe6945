#!/usr/bin/env bash
# Full proxy-212 training runs on GPU 0, one after the other, all on one local compiler cache (`strict`,
# empty before the first run unless KEEP_CACHE=1), Python's bytecode kept; run ARM-N with common.sh's
# ARM_ARGS (def = the defaults). The first run's cold start is the empty-cache figure, the next ones' the
# warm figure. Needs all four training shards in .proxy (common.sh: stage_proxy, restore_proxy).
# usage: bash scripts/bench/proxy212_runs.sh ARM...       (e.g. `def def`; a run takes about 3 minutes)
# Results: /tmp/runs/full-ARM-N (summary.json, metrics.jsonl, config.json), $RES/full-ARM-N.log,
# clocks-full.csv, a summary line per run, then $OUT/results.tar.gz.
set -u
source scripts/bench/common.sh
[ $# -gt 0 ] || set -- def def
for arm in "$@"; do arm_args "$arm" > /dev/null; done
gpus_csv
restore_proxy
bytecode_on
clocks_log clocks-full.csv
[ "${KEEP_CACHE:-0}" = 1 ] || rm -rf "$C/strict"
for arm in "$@"; do
  n=1; while [ -e "/tmp/runs/full-$arm-$n" ]; do n=$((n + 1)); done
  train 0 "full-$arm-$n" strict $(arm_args "$arm")
done
summaries
collect
