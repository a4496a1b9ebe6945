#!/usr/bin/env bash
# Issue 4, for the thirty-fourth session: the bench's new energy and SM-cycle figures per step, and A/B
# rounds that read them.
#   ab     the GPU test of gpu_clocks.py [gpu-tests-clocks.log]; then A/B/C rounds of `speedrun bench` on one
#          cache, the order turned each round: the default, --set model.wgrad_blas=auto, and
#          --set model.embed_kernel=triton (no new round after ${AB_BUDGET:-330} s) [all.done, q.log]
#   cold   the strict cold start (the machine's first Python process, empty compiler caches, no bytecode;
#          strict-cold.log), then a warm start on its caches (strict-warm.log) [all.done, q.log]
#   full   the default pair of proxy212 runs (common.sh's full_pair) [full.done, q-full.log]
#   wait S [D [LOG]]  follow until $RES/D.done or S seconds; tar results into $OUT
# Carry [".proxy"] (shards 1-3 and val) for `ab`; `full` needs a later call carrying shard 4.
set -u
source scripts/device/common.sh

ab_queue() {
  measure_start "${AB_BUDGET:-330}"
  gpu_tests clocks 120 tests/test_gpu_clocks.py
  ARM_ARGS=([plain]="" [lt]="--set model.wgrad_blas=auto" [emb]="--set model.embed_kernel=triton")
  arm_rounds ab34 "plain lt emb" "emb lt plain" "lt plain emb" "emb plain lt"
}

warm_after_strict() {  # GPU 0: 20 proxy212 steps on the strict run's caches, no bytecode written
  echo "[gpu0] $(date +%T) warm start"
  env -u PYTHONPYCACHEPREFIX PYTHONDONTWRITEBYTECODE=1 $(caches strict) CUDA_VISIBLE_DEVICES=0 \
    python3 -m speedrun.train "${ARGS[@]}" --steps 20 --out /tmp/runs/strict-warm > "$RES/strict-warm.log" 2>&1
  echo "[gpu0] $(date +%T) warm: exit $? | $(grep -E 'cold start' "$RES/strict-warm.log" | head -2 | tr '\n' ' ')"
}

case "${1:-}" in
  cold) check_start; ( strict_cold; warm_after_strict; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  ab) check_start; ( ab_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 cold | ab | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
