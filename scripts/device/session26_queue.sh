#!/usr/bin/env bash
# Issue 4, for the twenty-seventh session (one H200): the portable compile cache's cold start, never measured
# on a GPU before.
#   portable  keep the carried shards (stage_proxy); the strict cold start (the machine's first Python process,
#             empty compiler caches, no bytecode, no portable cache); `speedrun warm --preset proxy212` into
#             $PORT_HOME on its own empty local caches; then 20-step `train` runs, each on fresh empty local
#             caches with the portable cache on (a fresh machine that has the files): port-a and port-b with
#             <key>.bin and <key>.triton (speedrun's own Triton kernels), port-c with <key>.bin alone;
#             log q-portable.log [all.done]
#   tune      (after portable, same machine) A/B rounds on one cache: the default against Inductor's
#             autotuning of its pointwise and reduction kernels (max_autotune_pointwise=true: the best
#             configuration is cached across processes, unlike coordinate descent's on torch 2.11) and against
#             aggressive_fusion=true; log q-tune.log [tune.done]
#   full      restore the kept shards; two proxy212 runs on the strict caches, with the extra arguments in
#             $TRAIN_EXTRA_FILE when set [full.done]
#   wait S [D [LOG]]  as session18_queue.sh's
# Carry [".proxy"] without shard 4 for portable (and tune), then [".proxy"] with shard 4 alone for full, at once after.
set -u
source scripts/device/common.sh
PORT_HOME=/tmp/speedrun-home

no_bytecode() { echo "-u PYTHONPYCACHEPREFIX PYTHONDONTWRITEBYTECODE=1"; }  # the image's own setting

port_warm() {  # speedrun warm on empty local caches; the file it saved
  echo "$(date +%T) warm"
  rm -rf "$PORT_HOME"
  env $(no_bytecode) $(caches warm-src fresh | sed 's/SPEEDRUN_COMPILE_CACHE=off//') SPEEDRUN_HOME=$PORT_HOME \
    python3 -m speedrun.cli warm --preset proxy212 > "$RES/port-warm.log" 2>&1; local rc=$?
  echo "$(date +%T) warm: exit $rc | $(tail -3 "$RES/port-warm.log" | tr '\n' ' ')"
  ls -la "$PORT_HOME"/compile/ 2>&1
}

port_train() {  # port_train NAME: 20 proxy212 steps, fresh empty local caches, the portable cache on
  echo "[gpu0] $(date +%T) start $1 (empty local caches, portable cache $PORT_HOME)"
  env $(no_bytecode) $(caches "$1" fresh | sed 's/SPEEDRUN_COMPILE_CACHE=off//') SPEEDRUN_HOME=$PORT_HOME \
    python3 -m speedrun.train "${ARGS[@]}" --steps 20 --out "/tmp/runs/$1" > "$RES/$1.log" 2>&1; local rc=$?
  echo "[gpu0] $(date +%T) end $1: exit $rc | $(grep -E 'compile cache|local compile caches|cold start' "$RES/$1.log" | head -3 | tr '\n' ' ')"
  ls "$C/$1/triton" | wc -l | sed 's/^/    Triton cache folders after the run: /'
}

portable_queue() {
  strict_cold
  clocks_log clocks.csv
  port_warm
  port_train port-a
  mkdir -p /tmp/triton-aside && mv "$PORT_HOME"/compile/*.triton /tmp/triton-aside/
  port_train port-c
  mv /tmp/triton-aside/*.triton "$PORT_HOME"/compile/
  port_train port-b
  summaries
}

tune_queue() {
  bytecode_on
  ab_rounds strict "1 2" default "" map "--set train.inductor_options=max_autotune_pointwise=true"
  AB_CACHE=strict ab_shared aggr1 --set train.inductor_options=aggressive_fusion=true
}

case "${1:-}" in
  portable) check_start; logged q-portable.log portable_queue ;;
  tune) rm -f "$RES"/tune.done; ( export CUDA_VISIBLE_DEVICES=0; tune_queue; touch "$RES/tune.done" ) > "$RES/q-tune.log" 2>&1 ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 portable | tune | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
