#!/usr/bin/env bash
# Issue 4, for the thirty-eighth session: where the step's energy goes (the card's energy counter).
#   energy  the energy counter's GPU test [gpu-tests-energy.log]; `speedrun bench` of the default on the
#           proxy's shards 1-3 (--data .proxy), its energy a step now from the counter [ab-def.json];
#           then scripts/device/energy_parts.py on the same shards [energy-parts.json, energy-parts.log]
#           [all.done, q.log]
#   parts   energy_parts.py alone, the step and the optimisers included (no bench, no test)
#           [energy-parts.json, energy-parts.log, all.done, q.log]
#   fullab ARM...  proxy212 runs one after the other on one compiler cache, ARM "def" (the default) or "cg"
#          (--set train.cudagraphs=true), each run named full-ARM-N with N the next free number
#          [full.done, q-full.log]
#   wait S [D [LOG]]  follow until $RES/D.done or S seconds; tar results into $OUT
# Carry [".proxy"] (shards 1-3 and val) for `energy`; `fullab` needs a later call carrying shard 4.
set -u
source scripts/device/common.sh

declare -A FULL_ARGS=([cg]="--set train.cudagraphs=true")

energy_queue() {
  gpu_tests energy 120 tests/test_energy_counter.py
  measure_start
  echo "$(date +%T) bench def"
  env $(caches energy fresh) python3 -m speedrun.cli bench --preset proxy212 --steps 10 --repeats 3 --data .proxy \
    --json "$RES/ab-def.json" > "$RES/ab-def.log" 2>&1
  echo "$(date +%T) bench: exit $? | $(grep -E 'ms/step|energy|GPU clock' "$RES/ab-def.log" | tr '\n' ' ')"
  env $(caches energy) timeout 420 python3 scripts/device/energy_parts.py .proxy "$RES/energy-parts.json" \
    > "$RES/energy-parts.log" 2>&1
  echo "$(date +%T) energy parts: exit $?"
  tail -40 "$RES/energy-parts.log"
}

parts_queue() {
  measure_start
  env $(caches energy fresh) timeout 500 python3 scripts/device/energy_parts.py .proxy "$RES/energy-parts.json" \
    > "$RES/energy-parts.log" 2>&1
  echo "$(date +%T) energy parts: exit $?"
  tail -45 "$RES/energy-parts.log"
}

case "${1:-}" in
  parts) check_start; ( parts_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  energy) check_start; ( energy_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  fullab) shift; restore_proxy; bytecode_on
          ( full_arms "$@"; touch "$RES/full.done" ) > "$RES/q-full.log" 2>&1 ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 energy | parts | fullab ARM... | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
