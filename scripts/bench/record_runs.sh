#!/usr/bin/env bash
# The 2026 record's measurements on one GPU, one compiler cache for the whole call (empty first):
#   proxy161 SEED...   whole proxy161 runs from .proxy161 (the first on empty caches: the cold start)
#   proxy322           one proxy322 run from .proxy322
#   bench              `speedrun bench --preset record`: ms a step in each stage, the proxy's document lengths
# Carry .proxy161 or .proxy322 (scripts/bench/record_carry_sets.py makes them). A proxy161 run takes about
# 5 minutes with empty caches; give each mode its own call.
# Results: /tmp/runs/RUN (summary.json, metrics.jsonl, config.json), $RES/RUN.log, then $OUT/results.tar.gz.
set -u
source scripts/bench/common.sh
unpack() { (cd "$1" && for f in *.xz; do [ -f "${f%.xz}" ] || xz -dk "$f" & done; wait); }
run() {  # run RUN DATA ARGS...: speedrun train into /tmp/runs/RUN on the call's cache
  local name=$1 data=$2; shift 2
  echo "$(date +%T) start $name $*"
  env $(caches record) python3 -m speedrun.train --data-dir "$data" --no-progress --overwrite --out "/tmp/runs/$name" "$@" \
    > "$RES/$name.log" 2>&1
  echo "$(date +%T) end $name: exit $? | $(grep -E 'cold start|precompile|final val|rror' "$RES/$name.log" | tr '\n' ' ')"
}
gpus_csv
bytecode_on
rm -rf "$C/record"
mode=${1:-proxy161}; shift || true
case $mode in
  proxy161) unpack .proxy161; for seed in "${@:-0}"; do run "proxy161-seed$seed" .proxy161 --preset proxy161 --seed "$seed"; done ;;
  proxy322) unpack .proxy322; run proxy322 .proxy322 --preset proxy322 ;;
  bench) unpack .proxy161; env $(caches record) python3 -m speedrun.cli.__main__ bench --preset record --pairs 5 \
           --data .proxy161 --json "$RES/bench-record.json" 2>&1 | tee "$RES/bench-record.log" | grep -v '^\s*$' | tail -12 ;;
  *) echo "usage: $0 proxy161 [SEED...] | proxy322 | bench"; exit 2 ;;
esac
summaries
collect
