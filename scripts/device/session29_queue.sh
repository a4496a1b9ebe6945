#!/usr/bin/env bash
# Issue 4, twenty-ninth session: check the aligned λ pairs on the GPU, then look for other kernels
# compiled without alignment hints.
#   verify  the GPU test of the generated code's alignment (tests/test_attn_inputs.py -k aligned); a
#           profiled bench (3 steps) on fresh caches with flex_layers.py (every layer's FlexAttention
#           forward should now be one kernel); kernel_alignment.py over that bench's Inductor cache
#           (every generated kernel with a pointer argument not assumed 16-byte aligned) [all.done, q.log]
#   ab      the ReLU² MLP saving a alone (model.mlp_options FROM_A=1, the new default) against saving h and a
#           (FROM_A=0): the relu2 GPU tests, then A/B rounds of `speedrun bench` on one cache (no new bench
#           starts after ${AB_BUDGET:-430} s) [all.done, q.log]
#   gfwd    for the next session: the Gluon forward (fwd.GLUON=1, which now stores a alone) against the
#           default Triton forward, A/B rounds on one cache, as `ab` [all.done, q.log]
#   sweep   for the next session: relu2_bench.py's focused launch sweep of the Triton kernels as they run now
#           (the forward storing a alone, the backward from a) [all.done, q.log; relu2-sweep.json]
#   full1   restore the kept shards; one proxy212 run on the A/B's cache [full.done, q-full.log]
#   full    the default pair of proxy212 runs (common.sh's full_pair) [full.done, q-full.log]
#   wait S [D [LOG]]  follow until $RES/D.done or S seconds; tar results into $OUT
# Carry [".proxy"] (shards 1-3 and val).
set -u
source scripts/device/common.sh

verify_queue() {
  bytecode_on
  clocks_log clocks.csv
  gpu_tests aligned 300 tests/test_attn_inputs.py -k aligned
  local inductor=$C/flex/inductor
  flex_profile flex
  rm -f "$RES/prof.txt.trace.json.gz"
  python3 scripts/device/kernel_alignment.py "$inductor" --json "$RES/kernel-alignment.json"
  mkdir -p "$OUT/kernels"
  python3 - "$RES/kernel-alignment.json" "$inductor" "$OUT/kernels" <<'PY'
import json, os, shutil, sys
names = json.load(open(sys.argv[1]))["unaligned"]
for folder, _, files in os.walk(sys.argv[2]):
    for f in files:
        p = os.path.join(folder, f)
        if f.endswith(".py") and os.path.getsize(p) < 200_000:
            text = open(p, errors="replace").read()
            for n in names:
                if f"def {n}(" in text and not os.path.exists(os.path.join(sys.argv[3], n + ".py")):
                    shutil.copy(p, os.path.join(sys.argv[3], n + ".py"))
PY
  ls "$OUT/kernels" | head -40
}

ab_queue() {
  bytecode_on
  clocks_log clocks.csv
  local start=$(date +%s) r
  gpu_tests relu2 170 tests/test_relu2_mlp.py tests/test_relu2_gluon.py
  for r in ${AB_ROUNDS:-1 2 3}; do
    for arm in from_a from_h; do
      [ $(( $(date +%s) - start )) -lt "${AB_BUDGET:-430}" ] || { echo "$(date +%T) budget spent"; break 2; }
      if [ $arm = from_a ]; then AB_CACHE=ab29 ab_shared "$arm$r"
      else AB_CACHE=ab29 ab_shared "$arm$r" --set model.mlp_options=FROM_A=0; fi
    done
  done
  grep -H "set-up / first step\|peak mem" "$RES"/ab-*.log
}

gfwd_queue() {
  bytecode_on
  clocks_log clocks.csv
  local start=$(date +%s) r
  gpu_tests relu2 170 tests/test_relu2_gluon.py
  for r in ${AB_ROUNDS:-1 2 3}; do
    [ $(( $(date +%s) - start )) -lt "${AB_BUDGET:-430}" ] || { echo "$(date +%T) budget spent"; break; }
    AB_CACHE=ab29g ab_shared "triton_fwd$r"
    AB_CACHE=ab29g ab_shared "gluon_fwd$r" --set model.mlp_options=fwd.GLUON=1
  done
}

case "${1:-}" in
  verify) check_start; ( verify_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  ab) check_start; ( ab_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  gfwd) check_start; ( gfwd_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  sweep) check_start; ( (cd scripts/device && timeout 450 python3 relu2_bench.py "$RES/relu2-sweep.json" \
    "$RES/relu2-best.txt" focused) > "$RES/relu2-sweep.log" 2>&1; tail -3 "$RES/relu2-sweep.log"
    touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full1) restore_proxy; bytecode_on; ( train 0 full-a ab29; summaries; touch "$RES/full.done" ) > "$RES/q-full.log" 2>&1 ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 verify | ab | gfwd | sweep | full1 | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
