#!/usr/bin/env bash
# Issue 4, ninth session (one H200): the ReLU² MLP with its activation in the products' epilogues.
#   micro        relu2_bench.py (reference pieces, launch sweep, whole layer; writes the best launch
#                options to $RES/relu2.options), the GPU tests of relu2_mlp, then two benches of this
#                tree (3 x 10 steps, random tokens, own empty caches): model.mlp_kernel=torch and
#                model.mlp_kernel=triton with the sweep's options
#   micro2       on a fresh machine: relu2_bench.py focused (around micro's best), the GPU tests, the
#                two benches (kernel with the focused sweep's options first)
#   ab NAME ARGS...  one such bench with extra `speedrun bench` arguments
#   full         proxy212 runs (needs the whole .proxy carried) on the benches' caches: triton (the
#                sweep's options), torch, triton, torch
#   gputests     the whole GPU suite (pytest -m gpu)
#   wait S [D [LOG]]  print LOG (default q.log) until $RES/D.done exists (default all) or S seconds
#                passed; tar to $OUT
# Launch: setsid nohup bash scripts/device/session9_queue.sh micro > /tmp/q.log 2>&1 &
set -u
source scripts/device/common.sh
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache

kernel_args() { echo "--set model.mlp_kernel=triton --set model.mlp_options=$(cat "$RES/relu2.options" 2>/dev/null)"; }

case "${1:-}" in
  micro)
    rm -f "$RES"/*.done
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$RES/gpus.csv"
    ( echo "$(date +%T) relu2_bench"
      (cd scripts/device && python3 relu2_bench.py "$RES/relu2.json" "$RES/relu2.options") > "$RES/relu2.log" 2>&1
      echo "$(date +%T) relu2_bench: exit $? | $(grep -E '^(reference|best|layer)' "$RES/relu2.log" | cut -c1-300 | tr '\n' ' ')"
      touch "$RES/sweep.done"
      python3 -m pytest -m gpu -q tests/test_relu2_mlp.py > "$RES/gpu-tests.log" 2>&1
      echo "$(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests.log")"
      ab base
      ab relu2 $(kernel_args)
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  micro2)  # call 2 (a fresh machine): the focused sweep, the GPU tests, both benches again
    rm -f "$RES"/*.done
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$RES/gpus.csv"
    ( echo "$(date +%T) relu2_bench focused"
      (cd scripts/device && python3 relu2_bench.py "$RES/relu2-focused.json" "$RES/relu2.options" focused) \
        > "$RES/relu2-focused.log" 2>&1
      echo "$(date +%T) relu2_bench: exit $? | $(grep -E '^(reference|best|layer)' "$RES/relu2-focused.log" | cut -c1-300 | tr '\n' ' ')"
      python3 -m pytest -m gpu -q tests/test_relu2_mlp.py > "$RES/gpu-tests.log" 2>&1
      echo "$(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests.log")"
      ab relu2 $(kernel_args)
      ab base
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  ab) rm -f "$RES"/*.done; shift; ( ab "$@"; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full)
    rm -f "$RES"/*.done
    unpack_proxy
    ( kernel_args > /tmp/relu2.args
      TRAIN_EXTRA_FILE=/tmp/relu2.args train 0 full-relu2 ab-relu2
      train 0 full-base ab-base
      touch "$RES/pair1.done"
      TRAIN_EXTRA_FILE=/tmp/relu2.args train 0 full-relu2-b ab-relu2
      touch "$RES/third.done"
      train 0 full-base-b ab-base
      summaries
      touch "$RES/all.done" ) > "$RES/q-full.log" 2>&1 ;;
  gputests) gpu_suite ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 micro | ab NAME ARGS... | full | gputests | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
