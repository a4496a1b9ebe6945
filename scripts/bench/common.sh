# Sourced by the scripts of scripts/bench: environment, proxy corpus, compiler caches, results.
# Each script runs one measurement in the foreground and ends by packing its results into $OUT (the
# device machine's folder that comes back; /tmp/speedrun-out elsewhere). A held device machine goes back
# after 30 s idle, and a fresh one starts with empty caches: run a whole measurement in one call.
# NVLink multicast stays off (shared hosts); Python output unbuffered.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
RES=/tmp/speedrun-results
OUT=${OUT:-/tmp/speedrun-out}
mkdir -p "$RES" "$OUT"

# The proxy corpus (../shared/proxy: four training shards and the validation shard, xz) in .proxy. The tree
# and all five shards pass the 64 MiB one device call may carry: carry some shards in one call, keep them
# on the machine (stage_proxy), carry the rest in the next and bring the kept ones back (restore_proxy).
unpack_proxy() {
  (cd .proxy && for f in *.xz; do [ -f "${f%.xz}" ] || xz -dk "$f" & done; wait)
}
stage_proxy() { mkdir -p /tmp/proxy-keep && cp -n .proxy/*.xz /tmp/proxy-keep/ && ls -la /tmp/proxy-keep; }
restore_proxy() { mkdir -p .proxy && cp -n /tmp/proxy-keep/*.xz .proxy/ 2>/dev/null; unpack_proxy && ls .proxy; }

collect() {  # tar the small files of every run under /tmp/runs and the results into $OUT; checkpoints,
  # weights and files being written (.tmp-step_*/, *.tmp) stay out: a tar that catches one mid-write can
  # run past the call's limit
  (cd /tmp && tar czf "$OUT/results.tar.gz" --exclude='*.safetensors' --exclude='*.tmp' --exclude='.tmp-*' \
    --exclude='checkpoints' --exclude='*.trace.json.gz' runs speedrun-results 2>/dev/null)
}

gpus_csv() {  # the GPUs, driver and maximum SM clock into $RES/${1:-gpus}.csv
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$RES/${1:-gpus}.csv" 2>&1
}

clocks_log() {  # clocks_log FILE: SM and memory clocks, power and temperature every 500 ms into $RES/FILE,
  # until the script exits (never `wait` without process ids while it runs: it does not end)
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
    -lms 500 > "$RES/$1" 2>&1 &
  CLOCKS_PID=$!
  trap 'kill "$CLOCKS_PID" 2>/dev/null' EXIT
}

bytecode_on() { unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache; }

# Local compiler caches, one folder each (/tmp/compile-caches/NAME); the portable cache off
C=/tmp/compile-caches
caches() {  # caches NAME [fresh]: the environment of those caches (emptied first with `fresh`)
  [ "${2:-}" = fresh ] && rm -rf "$C/$1"
  mkdir -p "$C/$1/inductor" "$C/$1/triton"
  echo "TORCHINDUCTOR_CACHE_DIR=$C/$1/inductor TRITON_CACHE_DIR=$C/$1/triton SPEEDRUN_COMPILE_CACHE=off"
}

ARGS=(--preset proxy212 --data-dir .proxy --overwrite --no-progress)
train() {  # train GPU RUN CACHE [fresh] [ARGS...]: proxy212 into /tmp/runs/RUN, log $RES/RUN.log
  local gpu=$1 run=$2 cache=$3 fresh="" shards
  shift 3
  [ "${1:-}" = fresh ] && { fresh=fresh; shift; }
  shards=$(ls .proxy/fineweb_train_*.bin 2>/dev/null | wc -l)
  if [ "$shards" -lt 4 ]; then  # with fewer shards the data wraps early and the loss is not proxy-212's
    echo "[gpu$gpu] $(date +%T) not starting $run: $shards of the proxy's 4 training shards in .proxy"
    return 1
  fi
  echo "[gpu$gpu] $(date +%T) start $run (caches $cache $fresh) $*"
  env $(caches "$cache" $fresh) CUDA_VISIBLE_DEVICES=$gpu python3 -m speedrun.train "${ARGS[@]}" "$@" \
    --out "/tmp/runs/$run" > "$RES/$run.log" 2>&1; local rc=$?
  echo "[gpu$gpu] $(date +%T) end $run: exit $rc | $(grep -E 'cold start' "$RES/$run.log" | head -1) | $(grep -E 'GPU clock|final val_loss|rror' "$RES/$run.log" | tail -3 | tr '\n' ' ')"
}

strict_cold() {  # GPU 0: 20 proxy212 steps, empty compiler caches, no bytecode written (the device image's
  # own setting); run it as the machine's first Python process for the strict cold start
  echo "[gpu0] $(date +%T) strict cold start"
  env -u PYTHONPYCACHEPREFIX PYTHONDONTWRITEBYTECODE=1 $(caches strict fresh) CUDA_VISIBLE_DEVICES=0 \
    python3 -m speedrun.train "${ARGS[@]}" --steps 20 --out /tmp/runs/strict-cold > "$RES/strict-cold.log" 2>&1
  echo "[gpu0] $(date +%T) strict: exit $? | $(grep -E 'cold start' "$RES/strict-cold.log" | head -2 | tr '\n' ' ')"
}

bench_on() {  # bench_on GPU NAME CACHE [fresh] -- ARGS...: `speedrun bench --preset proxy212 --steps 10
  # --repeats 3` on GPU with the caches CACHE, extra arguments appended; JSON and log in $RES/ab-NAME.*
  local gpu=$1 name=$2 cache=$3 fresh=""
  shift 3
  [ "${1:-}" = fresh ] && { fresh=fresh; shift; }
  [ "${1:-}" = -- ] && shift
  echo "$(date +%T) [gpu$gpu] bench $name (caches $cache $fresh) $*"
  env $(caches "$cache" $fresh) CUDA_VISIBLE_DEVICES=$gpu python3 -m speedrun.cli bench --preset proxy212 \
    --steps 10 --repeats 3 "$@" --json "$RES/ab-$name.json" > "$RES/ab-$name.log" 2>&1
  echo "$(date +%T) [gpu$gpu] bench $name: exit $? | $(grep -E 'ms/step|peak mem|graphs|GPU clock|energy|rror' "$RES/ab-$name.log" | tr '\n' ' ')"
}

gpu_tests() {  # gpu_tests NAME SECONDS FILES...: those files' GPU tests in one pytest (no bytecode prefix), at
  # most SECONDS, into $RES/gpu-tests-NAME.log; one line with the exit status and pytest's summary
  local name=$1 secs=$2; shift 2
  env -u PYTHONPYCACHEPREFIX timeout "$secs" python3 -m pytest -m gpu -q -p no:cacheprovider "$@" \
    > "$RES/gpu-tests-$name.log" 2>&1
  echo "$(date +%T) GPU tests ($name): exit $? | $(tail -1 "$RES/gpu-tests-$name.log")"
}

summaries() {  # one line per run folder under /tmp/runs: the summary's headline figures and its phases
  python3 - <<'PY'
import json, glob, os
for p in sorted(glob.glob("/tmp/runs/*/summary.json")):
    s = json.load(open(p))
    print(os.path.basename(os.path.dirname(p)), {k: s.get(k) for k in (
        "final_val_loss", "ms_per_step", "peak_memory_bytes", "cold_start_s", "graphs_compiled_in_timed_run",
        "energy_j_per_step", "sm_mcycles_per_step", "world_size")},
        "SM MHz", (s.get("gpu_clocks") or {}).get("sm_clock_mhz_median"))
    print("   phases", s.get("cold_start_phases_s"))
PY
}

# Named configurations for A/B benches and full runs: `speedrun bench` / `train` arguments by arm name
declare -A ARM_ARGS=(
  [def]=""
  [flex]="--set attention.backend=flex"
  [gluon]="--set attention.backend=gluon"
  [reference]="--set train.kernels=reference"
)
arm_args() {  # arm_args ARM: the arm's arguments; an unknown arm stops the script
  [ -n "${ARM_ARGS[$1]+x}" ] || { echo "unknown arm '$1' (known: ${!ARM_ARGS[*]}; add it to ARM_ARGS)" >&2; exit 2; }
  echo "${ARM_ARGS[$1]}"
}
