#!/usr/bin/env bash
# Issue 4, tenth session (one H200): the attention's input side (QK RMS-norm + rotary + value mixing).
#   prof          the current code's step, profiled, with Inductor's generated code (TORCH_LOGS=output_code)
#                 kept (xz) for reading which kernels the attention's input side compiles to
#   micro         attn_inputs_bench.py (the fused op against the compiled reference, per layer call), the
#                 GPU tests of attn_inputs, then two benches (3 x 10 steps, own empty caches):
#                 model.qk_kernel=torch and model.qk_kernel=triton
#   pair          the two benches of micro alone
#   ab NAME ARGS...  one such bench with extra `speedrun bench` arguments
#   full          proxy212 runs (needs the whole .proxy carried) on the benches' caches: triton, torch, triton
#   gputests      the whole GPU suite (pytest -m gpu)
#   wait S [D [LOG]]  print LOG (default q.log) until $RES/D.done exists (default all) or S seconds
#                 passed; tar to $OUT
# Launch: setsid nohup bash scripts/device/session10_queue.sh micro > /tmp/q.log 2>&1 &
set -u
source scripts/device/common.sh
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache

case "${1:-}" in
  prof)
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$OUT/gpus.csv"
    env $(caches prof fresh) TORCH_LOGS=output_code python3 -m speedrun.cli bench --preset proxy212 --steps 5 \
      --repeats 2 --profile "$OUT/profile.txt" --json "$OUT/prof.json" > "$RES/prof-code.log" 2>&1
    echo "bench exit $?"
    grep -v '^\[\|^#\|^$' "$RES/prof-code.log" | grep -E 'ms/step|peak|graphs|rror' | head
    xz -9 -c "$RES/prof-code.log" > "$OUT/prof-code.log.xz"
    ls -la "$OUT" ;;
  micro)
    rm -f "$RES"/*.done
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$RES/gpus.csv"
    ( echo "$(date +%T) attn_inputs_bench"
      (cd scripts/device && python3 attn_inputs_bench.py "$RES/attn-inputs.json") > "$RES/attn-inputs.log" 2>&1
      echo "$(date +%T) attn_inputs_bench: exit $? | $(grep -E '^(ref|accuracy|best)' "$RES/attn-inputs.log" | cut -c1-600 | tr '\n' ' ')"
      touch "$RES/sweep.done"
      python3 -m pytest -m gpu -q tests/test_attn_inputs.py > "$RES/gpu-tests.log" 2>&1
      echo "$(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests.log")"
      ab qk --set model.qk_kernel=triton
      ab base --set model.qk_kernel=torch
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  pair)  # the two benches alone (the sweep already done)
    rm -f "$RES"/*.done
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$RES/gpus.csv"
    ( ab qk --set model.qk_kernel=triton
      touch "$RES/first.done"
      ab base --set model.qk_kernel=torch
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  ab) rm -f "$RES"/*.done; shift; ( ab "$@"; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full)
    rm -f "$RES"/*.done
    unpack_proxy
    ( echo "--set model.qk_kernel=triton" > /tmp/qk.args
      echo "--set model.qk_kernel=torch" > /tmp/base.args
      TRAIN_EXTRA_FILE=/tmp/qk.args train 0 full-qk ab-qk
      TRAIN_EXTRA_FILE=/tmp/base.args train 0 full-base ab-base
      touch "$RES/pair1.done"
      TRAIN_EXTRA_FILE=/tmp/qk.args train 0 full-qk-b ab-qk
      summaries
      touch "$RES/all.done" ) > "$RES/q-full.log" 2>&1 ;;
  gputests) gpu_suite ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 prof | micro | ab NAME ARGS... | full | gputests | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
