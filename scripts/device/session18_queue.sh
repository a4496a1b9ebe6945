#!/usr/bin/env bash
# Issue 4, eighteenth session (one H200), after model.head_rowsums=split became the default.
#   prof    keep the carried shards (stage_proxy); the strict cold start of the default as the machine's
#           first Python process; then a profiled bench on its caches (3 warm-up, 3 timed, 3 profiled
#           steps: where the step goes now, and the device's idle time) [all.done]
#   cg      train.cudagraphs (the compiled forward and backward replayed as CUDA graphs): A/B/A/B benches
#           against the default on one shared compiler cache (rounds: $CG_ROUNDS, default "1 2"), then
#           12 proxy212 steps each way on that cache, their losses compared step by step, then the GPU
#           test (tests/test_cudagraphs.py) [all.done]. Ran in the eighteenth session with a first version
#           that failed in the warm-up (calls 4-8, docs/runs/2026-12-01-h200-r/); the gradient copy
#           (Trainer.own_grads) was written after, for the next session's first call
#   pack    (run in the nineteenth session, call 2: its GPU test found the transposes wrong; TILE_CONFIG["PACK"]
#           is gone since, session19_queue.sh ct runs the rebuilt kernel) the CE tile kernel's packed transpose (softcap_ce.TILE_CONFIG["PACK"],
#           written in the eighteenth, never run on a GPU): the head bench with TILE_VARIANTS=1 (every
#           tile shape byte-wise and packed, against the CE plus the transposed copy), then the CE
#           kernel's GPU tests (the packed tiles at the record's size among them) [all.done]
#   full    restore the kept shards; two proxy212 runs of the default on the strict caches [full.done]
#   wait S [D [LOG]]  print LOG (default q.log) until $RES/D.done exists (default all) or S seconds
#           passed; tar the results into $OUT
# Carry [".proxy"] without shard 4 for prof, then [".proxy"] with shard 4 alone for full, at once after.
# Launch: (setsid nohup bash scripts/device/session18_queue.sh prof > /tmp/q-launch.log 2>&1 &)
set -u
source scripts/device/common.sh

on_gpu0() {  # inside a queue's logged subshell: the clock log (disowned: no `wait` waits for it), GPU 0
  clocks_log clocks.csv
  disown
  export CUDA_VISIBLE_DEVICES=0
}

gpu_tests() {  # gpu_tests NAME FILES...: `pytest -m gpu` on FILES into $RES/gpu-tests-NAME.log, one line out
  local name=$1; shift
  env -u PYTHONPYCACHEPREFIX timeout 300 python3 -m pytest -m gpu -q "$@" > "$RES/gpu-tests-$name.log" 2>&1
  echo "$(date +%T) GPU tests ($name): $(tail -1 "$RES/gpu-tests-$name.log")"
}

case "${1:-}" in
  prof)
    stage_proxy > /dev/null
    queue_start
    ( strict_cold
      on_gpu0
      bytecode_on
      env $(caches strict) python3 -m speedrun.cli bench --preset proxy212 --steps 3 --repeats 1 --warmup 3 \
        --profile "$RES/profile.txt" --json "$RES/prof.json" > "$RES/prof.log" 2>&1
      echo "$(date +%T) prof: exit $? | $(grep -E 'ms/step|busy|idle|GPU clock|rror' "$RES/prof.log" | tr '\n' ' ')"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  cg)
    stage_proxy > /dev/null
    queue_start
    ( on_gpu0
      bytecode_on
      for r in ${CG_ROUNDS:-1 2}; do
        AB_CACHE=ab-cg ab_shared "default$r"
        AB_CACHE=ab-cg ab_shared "cudagraphs$r" --set train.cudagraphs=true
      done
      for arm in default cudagraphs; do
        env $(caches ab-cg) python3 -m speedrun.train "${ARGS[@]}" --steps 12 --set train.val_every=0 \
          --set train.cudagraphs=$([ $arm = cudagraphs ] && echo true || echo false) --out "/tmp/runs/cg-$arm" \
          > "$RES/cg-$arm.log" 2>&1
        echo "$(date +%T) train $arm: exit $? | $(grep -E 'final val|rror' "$RES/cg-$arm.log" | tail -2 | tr '\n' ' ')"
      done
      python3 - <<'PY'
import json
rows = {a: [json.loads(l) for l in open(f"/tmp/runs/cg-{a}/metrics.jsonl")] for a in ("default", "cudagraphs")}
for a, b in zip(*rows.values()):
    print("step", a.get("step"), "loss", a.get("train_loss", a.get("loss")), b.get("train_loss", b.get("loss")),
          "val", a.get("val_loss"), b.get("val_loss"))
PY
      gpu_tests cudagraphs tests/test_cudagraphs.py
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  pack)
    queue_start
    ( on_gpu0
      (cd scripts/device && TILE_VARIANTS=1 timeout 400 python3 head_fwd_gluon_bench.py "$RES/head-pack.json") \
        > "$RES/head-pack.log" 2>&1
      echo "$(date +%T) head bench: exit $? | $(tail -4 "$RES/head-pack.log" | tr '\n' ' ')"
      gpu_tests ce tests/test_softcap_ce.py
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 prof | cg | pack | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
