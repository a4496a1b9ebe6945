#!/usr/bin/env bash
# Issue 4, twelfth session (one H200): FlexAttention on a 64-token block mask (attention.sparse_block).
# As run (docs/benchmarks.md, twelfth session): `micro` on machine 1 failed (its sweep installed the
# 64-token tile heuristics after a 128-token backward had compiled, and its GPU tests did the same);
# `micro2` (call 2) waited for a file of machine 1's and was lost; `micro3`, `full` and one more full
# run measured.
#   micro   the attention GPU tests; flex_mask_bench.py; then the A/B benches base and s64
#   micro2  after micro's base bench: the sweep again, the 64-token GPU tests, the s64 bench
#   micro3  (a fresh machine) the sweep, the s64 bench, the base bench (3 x 10 steps, own empty caches
#           each, one after the other on GPU 0; s64 = sparse_block=64 with the sweep's best backward
#           tiles, written to $RES/s64.args), then the 64-token GPU tests
#   stage   keep the carried proxy shards in /tmp/proxy-keep (the tree and all four shards exceed one
#           call's carry)
#   full    restore the kept shards beside the carried one; proxy212 runs, s64 then base, on the
#           benches' caches
#   wait S [D [LOG]]  print LOG (default q.log) until $RES/D.done exists (default all) or S seconds
#           passed; tar the results into $OUT
# Launch: (setsid nohup bash scripts/device/session12_queue.sh micro3 > /tmp/q-launch.log 2>&1 &)
set -u
source scripts/device/common.sh
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache

choose_s64() {  # the fastest 64-token option set of the sweep, as `speedrun` arguments, into $RES/s64.args
  python3 - "$RES/flex-mask.json" > "$RES/s64.args" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ok = {n: v for n, v in r.items() if n.startswith("s64") and "error" not in v and v["max_abs_diff_vs_first"] < 0.25}
best = min(ok, key=lambda n: ok[n]["step_ms_fwd_bwd"])
opts = ",".join(f"{k}={v}" for k, v in ok[best]["options"].items())
print(f"--set attention.sparse_block=64 --set attention.flex_options={opts}")
PY
  echo "$(date +%T) s64 arguments: $(cat "$RES/s64.args")"
}

case "${1:-}" in
  micro)
    queue_start
    ( export CUDA_VISIBLE_DEVICES=0
      python3 -m pytest -m gpu -q tests/test_attention.py > "$RES/gpu-tests-attention.log" 2>&1
      echo "$(date +%T) attention GPU tests: $(tail -1 "$RES/gpu-tests-attention.log")"
      (cd scripts/device && python3 flex_mask_bench.py ../../.proxy "$RES/flex-mask.json") > "$RES/flex-mask.log" 2>&1
      echo "$(date +%T) flex_mask_bench: exit $?"; cat "$RES/flex-mask.log" | grep -v Warning | tail -12
      touch "$RES/first.done"
      choose_s64
      ab base
      ab s64 $(cat "$RES/s64.args")
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  micro2)  # after micro's base bench: stop micro's queue, then the sweep again and the s64 bench
    rm -f "$RES"/*.done
    ( while [ ! -s "$RES/ab-base.json" ]; do sleep 5; done
      pkill -f "session12_queue.sh micro" ; pkill -f "speedrun.cli bench"; sleep 3
      export CUDA_VISIBLE_DEVICES=0
      (cd scripts/device && python3 flex_mask_bench.py ../../.proxy "$RES/flex-mask.json") > "$RES/flex-mask.log" 2>&1
      echo "$(date +%T) flex_mask_bench: exit $?"; grep -v Warning "$RES/flex-mask.log" | tail -12
      touch "$RES/first.done"
      python3 -m pytest -m gpu -q tests/test_attention.py -k "64" > "$RES/gpu-tests-attention64.log" 2>&1
      echo "$(date +%T) attention GPU tests (64): $(tail -1 "$RES/gpu-tests-attention64.log")"
      choose_s64
      ab s64 $(cat "$RES/s64.args")
      touch "$RES/all.done" ) > "$RES/q2.log" 2>&1 ;;
  micro3)  # (a fresh machine) the sweep, the s64 GPU tests, then the A/B benches s64 and base
    queue_start
    ( export CUDA_VISIBLE_DEVICES=0
      (cd scripts/device && python3 flex_mask_bench.py ../../.proxy "$RES/flex-mask.json") > "$RES/flex-mask.log" 2>&1
      echo "$(date +%T) flex_mask_bench: exit $?"; grep -v Warning "$RES/flex-mask.log" | tail -12
      choose_s64
      touch "$RES/first.done"
      ab s64 $(cat "$RES/s64.args")
      ab base
      touch "$RES/ab.done"
      python3 -m pytest -m gpu -q tests/test_attention.py -k "64" > "$RES/gpu-tests-attention64.log" 2>&1
      echo "$(date +%T) attention GPU tests (64): $(tail -1 "$RES/gpu-tests-attention64.log")"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  stage) stage_proxy ;;
  full)
    restore_proxy
    ( TRAIN_EXTRA_FILE="$RES/s64.args" train 0 full-s64 ab-s64
      train 0 full-base ab-base
      summaries
      touch "$RES/all.done" ) > "$RES/q-full.log" 2>&1 ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 micro | micro2 | micro3 | stage | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
