#!/usr/bin/env bash
# Eight GPUs of one host (nvidia-h200-x8), in stages that fit two calls:
#   proxy    proxy-212 with the record's math on 8 GPUs (one micro-step per rank)  (~3 min)
#   scaling  speedrun bench on 1, 2, 4 and 8 GPUs; on 8 also --comm and --profile  (~5 min)
#   full     the full-length record schedule (1695 steps) timed on random tokens on
#            8 GPUs: `bench --steps 1695 --repeats 1` times step j at progress
#            (j + 1/2)/1695, i.e. every window of the real schedule once       (~4 min)
# usage: bash scripts/bench/eight_gpu.sh STAGE...   (e.g. "proxy scaling", then "full")
# Results: /tmp/speedrun-results/x8/ (and $OUT/results.tar.gz). Needs .proxy for `proxy`.
set -u
source scripts/bench/common.sh
X="$RES/x8"; mkdir -p "$X"
NGPU=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$X/gpus.csv"
nvidia-smi topo -m > "$X/topology.txt" 2>&1
tr8() { torchrun --standalone --nproc_per_node="$1" "${@:2}"; }

proxy() {
  unpack_proxy
  tr8 "$NGPU" -m speedrun.train --preset proxy212 --data-dir .proxy --out /tmp/runs/proxy212-8gpu \
    --overwrite --no-progress > "$X/proxy212-8gpu.log" 2>&1
  grep -E "cold start|val_loss|rror" "$X/proxy212-8gpu.log" | grep -v "^W1"
}

scaling() {
  for n in 1 2 4 8; do
    [ "$n" -le "$NGPU" ] || continue
    extra=(); [ "$n" -eq 8 ] && extra=(--comm --profile "$X/bench-8gpu-profile.txt")
    tr8 "$n" -m speedrun.cli bench --preset proxy212 --steps 10 --repeats 3 "${extra[@]}" \
      --json "$X/bench-${n}gpu.json" > "$X/bench-${n}gpu.log" 2>&1
    echo "[$n GPU] $(grep -E 'ms/step \(median\)|rror' "$X/bench-${n}gpu.log" | head -2 | tr '\n' ' ')"
  done
  python3 - "$X" <<'PY'
import json, sys, pathlib
X = pathlib.Path(sys.argv[1])
runs = {n: json.loads((X / f"bench-{n}gpu.json").read_text()) for n in (1, 2, 4, 8) if (X / f"bench-{n}gpu.json").exists()}
base = runs.get(1, {}).get("ms_per_step")
for n, r in runs.items():
    eff = base / (n * r["ms_per_step"]) if base else float("nan")
    print(f"{n} GPU(s): {r['ms_per_step']:.1f} ms/step, {r['tokens_per_s']:,.0f} tokens/s, scaling efficiency {eff:.3f}")
PY
}

full() {
  tr8 "$NGPU" -m speedrun.cli bench --preset record_2025_08 --steps 1695 --repeats 1 --no-sync-check \
    --json "$X/record-full-schedule.json" > "$X/record-full-schedule.log" 2>&1
  grep -E "ms/step|first step|rror" "$X/record-full-schedule.log"
  python3 -c "import json; r = json.load(open('$X/record-full-schedule.json')); print(f\"1695 steps: {r['ms_per_step'] * 1695 / 1000:.1f} s of training\")"
}

for s in "$@"; do echo "=== $s"; $s; done
collect
