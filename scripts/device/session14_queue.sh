#!/usr/bin/env bash
# Issue 4, fourteenth session (one H200); written at the end of the thirteenth, whose device time ran out.
#   verify  the strict cold start of the default code (the machine's first Python process: empty compiler
#           caches, no bytecode written); the CE kernel's variants (ce_math_bench.py, with "lean");
#           the Gluon ReLU² products against the Triton ones (relu2_gluon_bench.py, 300 s at most);
#           A/B benches of ce_math precise and lean on one shared cache [ab.done]; then the whole GPU
#           suite with Python's bytecode kept, among it the thirteenth session's two record-size compile
#           tests [all.done]. SM clock, power and temperature sampled every 500 ms into clocks.csv.
#   final   (written after verify's results) on a fresh machine: A/B benches of the old default
#           (ce_math precise, the Triton ReLU² backward) and the new (ce_math lean, the Gluon backward) on
#           one cache [ab.done], then the GPU tests of the changed kernels [all.done]
#   stage   keep the carried proxy shards in /tmp/proxy-keep (the tree and all four shards exceed one
#           call's carry)
#   full    restore the kept shards beside the carried one; two proxy212 runs of the default code on the
#           strict run's caches (the step time and the spread of the final loss) [full.done]
#   wait S [D [LOG]]  print LOG (default q.log) until $RES/D.done exists (default all) or S seconds
#           passed; tar the results into $OUT
# Carry [".proxy"] without shard 4 for verify and stage (move fineweb_train_000004.bin.xz out first), then
# [".proxy"] with shard 4 alone for full, issued at once after the first call returns.
# Launch: (setsid nohup bash scripts/device/session14_queue.sh verify > /tmp/q-launch.log 2>&1 &)
set -u
source scripts/device/common.sh

case "${1:-}" in
  verify)
    queue_start
    ( verify_prelude
      export PYTHONPYCACHEPREFIX=/tmp/pycache
      unset PYTHONDONTWRITEBYTECODE
      echo "$(date +%T) ce_math_bench"
      (cd scripts/device && timeout 300 python3 ce_math_bench.py "$RES/ce-math.json" > "$RES/ce-math.log" 2>&1)
      echo "$(date +%T) ce_math_bench: exit $? | $(grep -c train_us "$RES/ce-math.log") variants timed"
      if [ "${GLUON:-0}" = 1 ] && [ -f scripts/device/relu2_gluon_bench.py ]; then
        echo "$(date +%T) relu2_gluon_bench"
        (cd scripts/device && timeout 300 python3 relu2_gluon_bench.py "$RES/relu2-gluon.json" > "$RES/relu2-gluon.log" 2>&1)
        echo "$(date +%T) relu2_gluon_bench: exit $? | $(tail -3 "$RES/relu2-gluon.log" | tr '\n' ' ' | cut -c1-300)"
      fi
      export AB_CACHE=strict  # the strict start compiled the default graphs
      ab_shared precise --set model.ce_math=precise
      ab_shared lean --set model.ce_math=lean
      touch "$RES/ab.done"
      python3 -m pytest -m gpu -q tests > "$RES/gpu-tests-all.log" 2>&1
      echo "$(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests-all.log")"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  final)  # a fresh machine: the old and the new default on one cache, then the new kernels' GPU tests
    queue_start
    ( clocks_log clocks-final.csv
      export PYTHONPYCACHEPREFIX=/tmp/pycache CUDA_VISIBLE_DEVICES=0 AB_CACHE=strict
      ab_shared old --set model.ce_math=precise --set model.mlp_options=bwd.GLUON=0
      ab_shared new
      touch "$RES/ab.done"
      python3 -m pytest -m gpu -q tests/test_relu2_gluon.py tests/test_relu2_mlp.py tests/test_softcap_ce.py \
        tests/test_bench.py > "$RES/gpu-tests-final.log" 2>&1
      echo "$(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests-final.log")"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  stage) stage_proxy ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 verify | stage | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
