# Sourced by the device scripts: environment, proxy corpus, results folder.
# A held machine goes back after 30 s idle (status' idle_release_s, forty-third session) and a fresh one
# starts with empty caches: run a whole measurement in one call, results into $OUT before it returns
# (the modes end with `wait 1` for that), rather than a background queue followed across calls.
# NVLink multicast stays off (shared hosts); Python output unbuffered.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
RES=/tmp/speedrun-results
mkdir -p "$RES"
unpack_proxy() {
  (cd .proxy && for f in *.xz; do [ -f "${f%.xz}" ] || xz -dk "$f" & done; wait)
}
collect() {  # tar the small files of every run under /tmp/runs into $OUT; a checkpoint or export being
  # written (.tmp-step_*/, .model.safetensors.tmp) stays out too: the thirty-seventh session's tar caught
  # one mid-write, ran past the call's limit and came back too large
  (cd /tmp && tar czf "$OUT/results.tar.gz" --exclude='*.safetensors' --exclude='*.tmp' --exclude='.tmp-*' \
    --exclude='checkpoints' runs speedrun-results 2>/dev/null)
}
follow() {  # follow SECONDS "DONE FILES" "LOG FILES": wait until every done file exists or SECONDS pass,
  # print the logs and each run's last metrics line; succeeds when all are done
  local end=$(( $(date +%s) + $1 )) f all
  all() { for f in $2; do [ -e "$f" ] || return 1; done; }
  while [ "$(date +%s)" -lt "$end" ] && ! all "$@"; do sleep 5; done
  cat $3 2>/dev/null
  for f in /tmp/runs/*/metrics.jsonl; do [ -f "$f" ] && echo "$f: $(tail -1 "$f" | cut -c1-160)"; done
  all "$@"
}

follow_and_collect() {  # follow's arguments; then tar the results into $OUT; follow's status
  follow "$@"
  local rc=$?
  collect
  return $rc
}

# proxy212 runs, each with its own local compiler caches (/tmp/compile-caches/NAME)
ARGS=(--preset proxy212 --data-dir .proxy --overwrite --no-progress)
C=/tmp/compile-caches
caches() {  # caches NAME [fresh]: the environment of one run's own local compiler caches
  [ "${2:-}" = fresh ] && rm -rf "$C/$1"
  mkdir -p "$C/$1/inductor" "$C/$1/triton"
  echo "TORCHINDUCTOR_CACHE_DIR=$C/$1/inductor TRITON_CACHE_DIR=$C/$1/triton SPEEDRUN_COMPILE_CACHE=off"
}
train() {  # train GPU RUN CACHE [fresh]: proxy212 into /tmp/runs/RUN, log $RES/RUN.log; extra
  # arguments (e.g. --set ...) from the file $TRAIN_EXTRA_FILE when that is set
  local extra="" shards
  [ -n "${TRAIN_EXTRA_FILE:-}" ] && extra=$(cat "$TRAIN_EXTRA_FILE")
  shards=$(ls .proxy/fineweb_train_*.bin 2>/dev/null | wc -l)
  if [ "$shards" -lt 4 ]; then  # the twenty-ninth session's first pair ran on three and its data wrapped early
    echo "[gpu$1] $(date +%T) not starting $2: $shards of the proxy's 4 training shards in .proxy (restore_proxy first)"
    return 1
  fi
  echo "[gpu$1] $(date +%T) start $2 (caches $3 ${4:-}) $extra"
  env $(caches "$3" "${4:-}") CUDA_VISIBLE_DEVICES=$1 python3 -m speedrun.train "${ARGS[@]}" $extra \
    --out "/tmp/runs/$2" > "$RES/$2.log" 2>&1; local rc=$?
  echo "[gpu$1] $(date +%T) end $2: exit $rc | $(grep -E 'cold start' "$RES/$2.log" | head -1) | $(grep -E 'precompile|GPU clock|final val_loss|rror|warning' "$RES/$2.log" | tail -4 | tr '\n' ' ')"
}
# ab NAME ARGS...: one A/B bench (3 x 10 steps after warm-up, random tokens) with its own empty compiler
# caches, extra `speedrun bench` arguments appended; JSON and log in $RES/ab-NAME.*
ab() {  # ab NAME ARGS...
  local name=$1; shift
  echo "$(date +%T) ab $name $*"
  env $(caches "ab-$name" fresh) python3 -m speedrun.cli bench --preset proxy212 --steps 10 --repeats 3 "$@" \
    --json "$RES/ab-$name.json" > "$RES/ab-$name.log" 2>&1; local rc=$?
  echo "$(date +%T) ab $name: exit $rc | $(grep -E 'ms/step|peak mem|graphs|GPU clock|energy|rror' "$RES/ab-$name.log" | tr '\n' ' ')"
}

ab_shared() {  # ab_shared NAME ARGS...: as `ab`, on one compiler cache shared by all ab_shared benches
  # ($AB_CACHE, default ab-shared)
  local name=$1; shift
  echo "$(date +%T) ab $name (shared cache) $*"
  env $(caches "${AB_CACHE:-ab-shared}") python3 -m speedrun.cli bench --preset proxy212 --steps 10 --repeats 3 "$@" \
    --json "$RES/ab-$name.json" > "$RES/ab-$name.log" 2>&1; local rc=$?
  echo "$(date +%T) ab $name: exit $rc | $(grep -E 'ms/step|peak mem|graphs|GPU clock|energy|rror' "$RES/ab-$name.log" | tr '\n' ' ')"
}

# arm_rounds CACHE "ORDER"...: A/B rounds of ab_shared on the compiler cache CACHE, one round per ORDER (arm
# names, turned from round to round); arm NAME runs as "NAME<round>" with the arguments ARM_ARGS[NAME];
# no new round once $AB_DEADLINE (measure_start) has passed
declare -A ARM_ARGS
arm_rounds() {
  local cache=$1 r=1 order name; shift
  for order in "$@"; do
    [ "$(date +%s)" -lt "$AB_DEADLINE" ] || { echo "$(date +%T) A/B budget spent"; break; }
    for name in $order; do
      AB_CACHE=$cache ab_shared "$name$r" ${ARM_ARGS[$name]}
    done
    r=$((r + 1))
  done
}

gpu_suite_inline() {  # the whole GPU suite in the calling queue (no bytecode prefix), then $RES/all.done
  env -u PYTHONPYCACHEPREFIX python3 -m pytest -m gpu -q tests > "$RES/gpu-tests-all.log" 2>&1
  echo "$(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests-all.log")"
  touch "$RES/all.done"
}

gpu_suite() {  # the whole GPU suite (pytest -m gpu) into $RES/gpu-tests-all.log; $RES/all.done at the end
  rm -f "$RES"/*.done
  ( python3 -m pytest -m gpu -q tests > "$RES/gpu-tests-all.log" 2>&1
    echo "$(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests-all.log")"; touch "$RES/all.done" ) > "$RES/q.log" 2>&1
}

summaries() {  # one line per run folder under /tmp/runs: the summary's headline figures and its phases
  python3 - <<'PY'
import json, glob, os
for p in sorted(glob.glob("/tmp/runs/*/summary.json")):
    s = json.load(open(p))
    print(os.path.basename(os.path.dirname(p)), {k: s.get(k) for k in (
        "final_val_loss", "ms_per_step", "peak_memory_bytes", "cold_start_s", "graphs_compiled_in_timed_run",
        "world_size")}, "sm MHz", (s.get("gpu_clocks") or {}).get("sm_clock_mhz_median"))
    print("   phases", s.get("cold_start_phases_s"))
PY
}

queue_start() {  # the start of a queue mode that measures: no stale done files, the GPUs named, shards unpacked
  rm -f "$RES"/*.done
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$RES/${1:-gpus}.csv"
  unpack_proxy
}
# The tree and all four proxy shards exceed one call's carry: one call carries some shards and keeps them
# (stage_proxy), a later call carries the rest and restores the kept ones. Since the forty-second session
# the tree (17.5 MiB, growing with docs/runs) and shards 1-3 with the validation shard are over the 64 MiB
# too: carry shards 1-2 and the validation shard first, then shards 3 and 4.
stage_proxy() { mkdir -p /tmp/proxy-keep && cp -n .proxy/*.xz /tmp/proxy-keep/ && ls -la /tmp/proxy-keep; }
restore_proxy() { rm -f "$RES"/*.done; cp -n /tmp/proxy-keep/*.xz .proxy/ && unpack_proxy && ls .proxy; }

clocks_log() {  # clocks_log FILE: SM and memory clocks, power and temperature every 500 ms into $RES/FILE,
  # in the background until the machine is released
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
    -lms 500 > "$RES/$1" 2>&1 &
}

full_pair() {  # restore the kept shards; two proxy212 runs (full-a, full-b) on the strict caches, with
  # Python's bytecode kept; summaries into $RES/q-full.log, then $RES/full.done
  restore_proxy
  export PYTHONPYCACHEPREFIX=/tmp/pycache
  unset PYTHONDONTWRITEBYTECODE
  ( train 0 full-a strict
    train 0 full-b strict
    summaries
    touch "$RES/full.done" ) > "$RES/q-full.log" 2>&1
}

check_start() { stage_proxy > /dev/null; queue_start; }  # a check queue's start: keep the shards, unpack

gpu_tests() {  # gpu_tests NAME SECONDS FILES...: those files' GPU tests (no bytecode prefix), at most SECONDS,
  # into $RES/gpu-tests-NAME.log; one line with the exit status and pytest's summary
  local name=$1 secs=$2; shift 2
  env -u PYTHONPYCACHEPREFIX timeout "$secs" python3 -m pytest -m gpu -q "$@" -s > "$RES/gpu-tests-$name.log" 2>&1
  local rc=$?
  echo "$(date +%T) GPU tests ($name): exit $rc | $(tail -1 "$RES/gpu-tests-$name.log")"
}

measure_start() {  # measure_start [SECONDS]: a measuring queue's start, inside its logged subshell: bytecode kept,
  # the clock and power log (clocks.csv), and AB_DEADLINE (exported) SECONDS from now for ab_rounds
  bytecode_on
  clocks_log clocks.csv
  export AB_DEADLINE=$(( $(date +%s) + ${1:-9999999} ))
}

gluon_tests_and_bench() {  # gluon_tests_and_bench SECONDS: the Gluon GPU tests, then relu2_gluon_bench.py, each
  # at most SECONDS [gpu-tests-gluon.log, relu2-gluon.json, relu2-gluon.log]; status 1 if the tests did not pass
  gpu_tests gluon "$1" tests/test_relu2_gluon.py
  (cd scripts/device && timeout "$1" python3 relu2_gluon_bench.py "$RES/relu2-gluon.json") > "$RES/relu2-gluon.log" 2>&1
  grep -E "check|us" "$RES/relu2-gluon.log"
  grep -q " passed" "$RES/gpu-tests-gluon.log" && ! grep -q "failed" "$RES/gpu-tests-gluon.log" && return 0
  echo "$(date +%T) the Gluon GPU tests did not pass"; return 1
}

ab_rounds() {  # ab_rounds CACHE DEFAULT-ROUNDS NAME-A "ARGS-A" NAME-B "ARGS-B": A/B per round on one cache
  # (rounds $AB_ROUNDS when set; no round starts after the epoch second $AB_DEADLINE when set)
  local cache=$1 rounds=$2 r
  for r in ${AB_ROUNDS:-$rounds}; do
    [ "$(date +%s)" -lt "${AB_DEADLINE:-9999999999}" ] || { echo "$(date +%T) A/B budget spent"; break; }
    AB_CACHE=$cache ab_shared "$3$r" $4
    AB_CACHE=$cache ab_shared "$5$r" $6
  done
}

verify_prelude() {  # a verify queue's start, inside its logged subshell: the strict cold start as the machine's
  # first Python process, then the clock and power log, then GPU 0 for what follows
  strict_cold
  clocks_log clocks.csv
  export CUDA_VISIBLE_DEVICES=0
}

strict_cold() {  # GPU 0: 20 proxy212 steps, empty compiler caches, no bytecode written (the image's own
  # setting); run it as the machine's first Python process for the strict cold start
  echo "[gpu0] $(date +%T) strict cold start"
  env -u PYTHONPYCACHEPREFIX PYTHONDONTWRITEBYTECODE=1 $(caches strict fresh) CUDA_VISIBLE_DEVICES=0 \
    python3 -m speedrun.train "${ARGS[@]}" --steps 20 --out /tmp/runs/strict-cold > "$RES/strict-cold.log" 2>&1; local rc=$?
  echo "[gpu0] $(date +%T) strict: exit $rc | $(grep -E 'cold start' "$RES/strict-cold.log" | head -2 | tr '\n' ' ')"
}

bytecode_on() { unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache; }

ab_on() {  # ab_on GPU NAME CACHE [fresh] -- ARGS...: `speedrun bench` (3 x 10 steps) on GPU with the caches
  # CACHE, extra arguments appended; JSON and log in $RES/ab-NAME.*
  local gpu=$1 name=$2 cache=$3 fresh=""
  shift 3
  [ "${1:-}" = fresh ] && { fresh=fresh; shift; }
  [ "${1:-}" = -- ] && shift
  echo "$(date +%T) [gpu$gpu] ab $name (caches $cache $fresh) $*"
  env $(caches "$cache" $fresh) CUDA_VISIBLE_DEVICES=$gpu python3 -m speedrun.cli bench --preset proxy212 \
    --steps 10 --repeats 3 "$@" --json "$RES/ab-$name.json" > "$RES/ab-$name.log" 2>&1; local rc=$?
  echo "$(date +%T) [gpu$gpu] ab $name: exit $rc | $(grep -E 'ms/step|peak mem|graphs|GPU clock|energy|rror' "$RES/ab-$name.log" | tr '\n' ' ')"
}

profile_bench() {  # profile_bench NAME [ARGS...]: a 3-step profile (speedrun bench --profile) on GPU 0's
  # strict caches, extra bench arguments appended; profile-NAME.txt, prof-NAME.{json,log} in $RES
  local name=$1; shift
  echo "$(date +%T) profile $name $*"
  env $(caches strict) python3 -m speedrun.cli bench --preset proxy212 --steps 3 --repeats 1 --warmup 3 \
    "$@" --profile "$RES/profile-$name.txt" --json "$RES/prof-$name.json" > "$RES/prof-$name.log" 2>&1
  local rc=$?
  echo "$(date +%T) profile $name: exit $rc | $(grep -E 'ms/step|rror' "$RES/prof-$name.log" | tr '\n' ' ')"
}

logged() {  # logged LOG FUNCTION: a queue mode's body: no stale done files, then FUNCTION on GPU 0 with its
  # output in $RES/LOG, then $RES/all.done
  rm -f "$RES"/*.done
  ( export CUDA_VISIBLE_DEVICES=0; "$2"; touch "$RES/all.done" ) > "$RES/$1" 2>&1
}

optim_bench() {  # scripts/device/optim_bench.py (optimiser steps, host- and device-timed), at most 150 s;
  # optim-bench.{json,log} in $RES, its last line echoed
  (cd scripts/device && timeout 150 python3 optim_bench.py "$RES/optim-bench.json" > "$RES/optim-bench.log" 2>&1)
  echo "$(date +%T) optim bench: $(tail -1 "$RES/optim-bench.log")"
}

suite_per_file() {  # the whole GPU suite on the current GPUs, one pytest per file with GPU tests, each at most
  # ${1:-170} s, logs $RES/gpu-test_*.log; one line per file
  local f name rc
  for f in $(grep -l "mark.gpu" tests/test_*.py); do
    name=$(basename "$f" .py)
    env -u PYTHONPYCACHEPREFIX timeout "${1:-170}" python3 -m pytest -m gpu -q -p no:cacheprovider "$f" \
      > "$RES/gpu-$name.log" 2>&1; rc=$?
    echo "$(date +%T) $f: exit $rc | $(tail -1 "$RES/gpu-$name.log")"
  done
}

flex_profile() {  # flex_profile CACHE: a profiled bench (3 steps) on fresh caches CACHE, prof.{txt,json,log} in
  # $RES, then flex_layers.py on its Chrome trace (each FlexAttention call in layer order); the trace deleted
  env $(caches "$1" fresh) python3 -m speedrun.cli bench --preset proxy212 --steps 3 --repeats 1 --warmup 2 \
    --profile "$RES/prof.txt" --json "$RES/prof.json" > "$RES/prof.log" 2>&1
  echo "bench: exit $? | $(grep -E 'ms/step|GPU clock|rror' "$RES/prof.log" | tr '\n' ' ')"
  python3 scripts/device/flex_layers.py "$RES/prof.txt.trace.json.gz"
}

# full_arms ARM...: proxy212 runs one after the other on the `strict` compiler cache, each named full-ARM-N
# (N the next free number), with the extra `speedrun train` arguments ${FULL_ARGS[ARM]} (the caller declares
# the associative array FULL_ARGS; an arm it does not name runs the defaults); then one summary line per run
full_arms() {
  local arm n
  clocks_log clocks-full.csv
  for arm in "$@"; do
    n=1; while [ -e "/tmp/runs/full-$arm-$n" ]; do n=$((n + 1)); done
    echo "${FULL_ARGS[$arm]:-}" > /tmp/full-extra
    TRAIN_EXTRA_FILE=/tmp/full-extra train 0 "full-$arm-$n" strict
  done
  summaries
}
