#!/usr/bin/env bash
# Issue 4, fourth session: one background queue on a 2-GPU machine, followed over several device calls.
#   run     A  GPU 0: the GPU tests, then the QK-norm + rotary and the cross-entropy micro-benchmarks;
#              GPU 1: the FlexAttention kernel-option sweep (scripts/device/flex_sweep.py)
#           -> choose.py writes the settings the runs below use ($RES/choice.txt: --set overrides)
#           B  GPU 0: proxy212 with empty compiler caches (cold-a);
#              GPU 1: once cold-a has started timing (compiles never overlap), the same with its own caches (cold-b)
#           C  GPU 0: proxy212 again on cold-a's caches (warm-a), then speedrun bench with a profile;
#              GPU 1: proxy212 again on cold-b's caches (warm-b)
#           D  both GPUs under torchrun: proxy212 (two-gpu) on cold-a's caches
#   final   the committed defaults (no overrides), empty caches: GPU 0 proxy212 (final-a), then the GPU tests;
#           GPU 1: once final-a has started timing, proxy212 (final-b)
#   wait S  print progress until the queue is done or S seconds passed; tar results to $OUT
# Launch: setsid nohup bash scripts/device/session4_queue.sh run > /tmp/q.log 2>&1 &
set -u
source scripts/device/common.sh
TRAIN_EXTRA_FILE=$RES/choice.txt  # the --set arguments choose.py picked

stage_lab() {
  ( CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m gpu -q tests/ > "$RES/gpu-tests.log" 2>&1
    echo "[gpu0] $(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests.log")"
    # (the fourth session ran qk_rotary_bench.py here; qk_rotary was replaced by attn_inputs, tenth session)
    CUDA_VISIBLE_DEVICES=0 python3 scripts/device/ce_bench.py "$RES/ce_bench.json" > "$RES/ce-bench.log" 2>&1
    echo "[gpu0] $(date +%T) CE bench: exit $?"; tail -2 "$RES/ce-bench.log" ) > "$RES/q0.log" 2>&1 &
  ( CUDA_VISIBLE_DEVICES=1 python3 scripts/device/flex_sweep.py .proxy "$RES/flex_sweep.json" > "$RES/flex-sweep.log" 2>&1
    echo "[gpu1] $(date +%T) flex sweep: exit $?"; cat "$RES/flex-sweep.log" | grep -v Warning | tail -15 ) > "$RES/q1.log" 2>&1 &
  wait
  python3 scripts/device/choose.py "$RES" > "$RES/choice.log" 2>&1
  cat "$RES/choice.log"
}

stage_runs() {
  ( train 0 cold-a a fresh; train 0 warm-a a
    echo "[gpu0] $(date +%T) bench"
    env $(caches a) CUDA_VISIBLE_DEVICES=0 python3 -m speedrun.cli bench --preset proxy212 --steps 10 --repeats 3 \
      $(cat "$TRAIN_EXTRA_FILE") --profile "$RES/bench-profile.txt" --json "$RES/bench.json" > "$RES/bench.log" 2>&1
    grep -E "ms/step|fraction|set-up|graphs|host syncs|rror" "$RES/bench.log"
    touch "$RES/q0.done" ) >> "$RES/q0.log" 2>&1 &
  ( until grep -q "cold start" "$RES/cold-a.log" 2>/dev/null || [ -e "$RES/q0.done" ]; do sleep 2; done
    train 1 cold-b b fresh; train 1 warm-b b
    touch "$RES/q1.done" ) >> "$RES/q1.log" 2>&1 &
  wait
  echo "[gpu01] $(date +%T) start two-gpu"
  env $(caches a) CUDA_VISIBLE_DEVICES=0,1 torchrun --standalone --nproc_per_node=2 -m speedrun.train "${ARGS[@]}" \
    $(cat "$TRAIN_EXTRA_FILE") --out /tmp/runs/two-gpu > "$RES/two-gpu.log" 2>&1
  echo "[gpu01] $(date +%T) end two-gpu: exit $? | $(grep -E 'cold start|final val_loss' "$RES/two-gpu.log" | tr '\n' ' ')"
}

stage_final() {
  ( train 0 final-a c fresh
    CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m gpu -q tests/ > "$RES/gpu-tests-final.log" 2>&1
    echo "[gpu0] $(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests-final.log")" ) > "$RES/q0.log" 2>&1 &
  ( until grep -q "cold start" "$RES/final-a.log" 2>/dev/null; do sleep 2; done
    train 1 final-b d fresh ) > "$RES/q1.log" 2>&1 &
  wait
}


case "${1:-}" in
  run)
    rm -f "$RES"/*.done; : > "$RES/choice.txt"
    unpack_proxy
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$RES/gpus.csv"
    stage_lab; stage_runs
    touch "$RES/all.done" ;;
  final)
    rm -f "$RES"/*.done /tmp/runs/*/summary.json; : > "$RES/choice.txt"
    unpack_proxy
    stage_final
    touch "$RES/all.done" ;;
  wait)
    if follow "${2:-540}" "$RES/all.done" "/tmp/q.log $RES/q0.log $RES/q1.log"; then echo "QUEUE DONE"; fi
    summaries
    cp /tmp/q.log "$RES/queue.log" 2>/dev/null
    collect ;;
  *) echo "usage: $0 run|wait SECONDS"; exit 2 ;;
esac
