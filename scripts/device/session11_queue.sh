#!/usr/bin/env bash
# Issue 4, eleventh session (nvidia-h200-x2: two H200s of one host).
#   micro     GPU 0: the strict cold start (a 20-step proxy212 run, empty compiler caches, Python's bytecode
#             not written: the image's default) while GPU 1 runs the embeddings GPU test and
#             embed_bench.py. Then two rounds of A/B benches (3 x 10 steps): round 1 with empty caches,
#             emb (model.embed_kernel default) on GPU 0 and base (model.embed_kernel=torch) on GPU 1 at
#             once; round 2 swapped, on round 1's caches
#   twogpu    the 2-GPU bench (torchrun, 2 ranks) twice on the emb caches, then `bench --comm`
#   stage     keep the carried proxy shards in /tmp/proxy-keep (the tree and all four shards exceed
#             one call's carry)
#   full      restore the kept shards beside the carried one; two proxy212 runs of the default code at once,
#             GPU 0 and GPU 1, on the benches' caches
#   micro1    (one-GPU machine) embed_bench.py, then the A/B pair emb2 / base2 on GPU 0 one after the other
#   full1     (one-GPU machine) one proxy212 run of the default code on the emb2 bench's caches
#   gputests  the whole GPU suite (pytest -m gpu) on GPU 0
#   wait S [D [LOG]]  print LOG (default q.log) until $RES/D.done exists (default all) or S seconds passed;
#             tar the results into $OUT
# Launch: (setsid nohup bash scripts/device/session11_queue.sh micro > /tmp/q-launch.log 2>&1 &)
set -u
source scripts/device/common.sh

embed_micro() {  # GPU 1: the embeddings GPU test and micro-benchmark (no bytecode written either)
  export PYTHONDONTWRITEBYTECODE=1 CUDA_VISIBLE_DEVICES=1
  python3 -m pytest -m gpu -q tests/test_embeddings.py > "$RES/gpu-tests.log" 2>&1
  echo "[gpu1] $(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests.log")"
  (cd scripts/device && python3 embed_bench.py "$RES/embed.json" ../../.proxy/fineweb_val_000000.bin) \
    > "$RES/embed.log" 2>&1
  echo "[gpu1] $(date +%T) embed_bench: exit $? | $(grep -E '^(ref|accuracy)' "$RES/embed.log" | cut -c1-400 | tr '\n' ' ')"
}

case "${1:-}" in
  micro)
    queue_start
    ( strict_cold &
      ( embed_micro ) &
      wait
      touch "$RES/first.done"
      bytecode_on
      ab_on 0 emb ab-emb fresh &
      ab_on 1 base ab-base fresh -- --set model.embed_kernel=torch &
      wait
      touch "$RES/round1.done"
      ab_on 0 base-b ab-base -- --set model.embed_kernel=torch &
      ab_on 1 emb-b ab-emb &
      wait
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  twogpu)
    rm -f "$RES"/*.done
    bytecode_on
    ( for name in 2gpu 2gpu-b; do
        echo "$(date +%T) $name"
        env $(caches ab-emb) torchrun --standalone --nproc_per_node=2 -m speedrun.cli bench --preset proxy212 \
          --steps 10 --repeats 3 --json "$RES/$name.json" > "$RES/$name.log" 2>&1
        echo "$(date +%T) $name: exit $? | $(grep -E 'ms/step|peak mem|graphs|rror' "$RES/$name.log" | tr '\n' ' ')"
      done
      touch "$RES/pair.done"
      env $(caches ab-emb) torchrun --standalone --nproc_per_node=2 -m speedrun.cli bench --preset proxy212 \
        --steps 5 --repeats 3 --comm --json "$RES/comm.json" > "$RES/comm.log" 2>&1
      echo "$(date +%T) comm: exit $? | $(grep -E 'hidden|exposed|rror' "$RES/comm.log" | head -5 | tr '\n' ' ')"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  stage) stage_proxy ;;
  full)
    restore_proxy
    bytecode_on
    rm -rf "$C/ab-emb2" && cp -r "$C/ab-emb" "$C/ab-emb2"
    ( train 0 full-emb ab-emb &
      train 1 full-emb-b ab-emb2 &
      wait
      summaries
      touch "$RES/all.done" ) > "$RES/q-full.log" 2>&1 ;;
  micro1)  # one-GPU machine: embed_bench.py, then the A/B pair on GPU 0, one after the other
    queue_start gpus1
    bytecode_on
    ( (cd scripts/device && python3 embed_bench.py "$RES/embed2.json" ../../.proxy/fineweb_val_000000.bin) \
        > "$RES/embed2.log" 2>&1
      echo "$(date +%T) embed_bench: exit $? | $(grep -E '^(ref|accuracy)' "$RES/embed2.log" | cut -c1-400 | tr '\n' ' ')"
      touch "$RES/first.done"
      ab_on 0 emb2 ab-emb fresh
      ab_on 0 base2 ab-base fresh -- --set model.embed_kernel=torch
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full1)  # one-GPU machine: one proxy212 run of the default code on the emb bench's caches
    restore_proxy
    bytecode_on
    ( train 0 full-emb2 ab-emb; summaries; touch "$RES/all.done" ) > "$RES/q-full.log" 2>&1 ;;
  gputests) bytecode_on; CUDA_VISIBLE_DEVICES=0 gpu_suite ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 micro | twogpu | stage | full | micro1 | full1 | gputests | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
