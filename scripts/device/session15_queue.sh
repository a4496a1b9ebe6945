#!/usr/bin/env bash
# Issue 4, fifteenth session (one H200); written at the end of the fourteenth.
#   verify  the strict cold start of the new default (lean CE kernel, Gluon ReLU² backward: both compile
#           at first use), as the machine's first Python process; a profiled bench of the new default
#           (where the step's time goes now; idle time); then the whole GPU suite [all.done]
#   direct  the Gluon ReLU² epilogues that store from registers (DIRECT): kernel bench, GPU tests, step
#           A/B/A/B against the default [all.done]. Measured, rejected: it needs
#           docs/runs/2026-12-01-h200-o/relu2-gluon-direct.patch applied (the DIRECT launch key)
#   stage   keep the carried proxy shards in /tmp/proxy-keep (the tree and all four shards exceed one
#           call's carry)
#   full    restore the kept shards; two proxy212 runs of the default on the strict run's caches [full.done]
#   wait S [D [LOG]]  print LOG (default q.log) until $RES/D.done exists (default all) or S seconds
#           passed; tar the results into $OUT
# Carry [".proxy"] without shard 4 for verify and stage, then [".proxy"] with shard 4 alone for full.
# Launch: (setsid nohup bash scripts/device/session15_queue.sh verify > /tmp/q-launch.log 2>&1 &)
# Lesson of the fourteenth session: the suite's first run, with PYTHONPYCACHEPREFIX shared with the
# benches, stopped at collection (bare ImportErrors); gpu_suite runs it without the prefix.
set -u
source scripts/device/common.sh

case "${1:-}" in
  verify)
    queue_start
    ( verify_prelude
      env $(caches strict) python3 -m speedrun.cli bench --preset proxy212 --steps 3 --repeats 1 --warmup 3 \
        --profile "$RES/profile.txt" --json "$RES/prof.json" > "$RES/prof.log" 2>&1
      echo "$(date +%T) profile: exit $? | $(grep -E 'ms/step|idle' "$RES/prof.log" | head -3 | tr '\n' ' ')"
      gpu_suite_inline ) > "$RES/q.log" 2>&1 ;;
  direct)  # the Gluon epilogues storing from registers (relu2_gluon DIRECT): kernel bench with bit checks,
    # their GPU tests, then the step A/B/A/B on one shared compiler cache (random tokens: no corpus needed)
    rm -f "$RES"/*.done
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$RES/gpus.csv"
    ( clocks_log clocks-direct.csv
      export CUDA_VISIBLE_DEVICES=0
      (cd scripts/device && timeout 300 python3 relu2_gluon_bench.py "$RES/relu2-gluon-direct.json") \
        > "$RES/relu2-gluon-direct.log" 2>&1
      echo "$(date +%T) kernel bench: exit $? | $(grep -E '^(forward|backward|direct)|MISMATCH' "$RES/relu2-gluon-direct.log" | tr '\n' ' ')"
      env -u PYTHONPYCACHEPREFIX timeout 300 python3 -m pytest -m gpu -q tests/test_relu2_gluon.py tests/test_relu2_mlp.py \
        > "$RES/gpu-tests-relu2.log" 2>&1
      echo "$(date +%T) relu2 GPU tests: $(tail -1 "$RES/gpu-tests-relu2.log")"
      AB_CACHE=ab-direct
      ab_shared base --set model.mlp_options=fwd.GLUON=0,DIRECT=0
      ab_shared direct --set model.mlp_options=fwd.GLUON=1,DIRECT=1
      ab_shared base2 --set model.mlp_options=fwd.GLUON=0,DIRECT=0
      ab_shared direct2 --set model.mlp_options=fwd.GLUON=1,DIRECT=1
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  stage) stage_proxy ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 verify | direct | stage | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
