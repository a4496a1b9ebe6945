#!/usr/bin/env bash
# Issue 4, seventeenth session (nvidia-h200-x2: two H200s of one host).
#   ab2     GPU 0: the head bench (head_fwd_gluon_bench.py, its launch_transposed rows) while GPU 1 runs the
#           head's, both Gluon kernels' and the CE kernel's GPU tests; then four rounds of A/B benches
#           (3 x 10 steps), model.ce_transposed false against true, both GPUs at once and swapped each
#           round (rounds 1-2 compile into empty caches, 3-4 reuse them); then the choice for `full2`
#           ($RES/full.args: the --set that won on both GPUs, else nothing) [all.done]
#   stage   keep the carried proxy shards in /tmp/proxy-keep (the tree and all four shards exceed one
#           call's carry)
#   full2   restore the kept shards; two proxy212 runs at once (GPU 0 and GPU 1, each with empty compiler
#           caches) with $RES/full.args [full.done]; then the 1-GPU bench on both GPUs at once and the
#           2-GPU bench (torchrun) twice, then `bench --comm`, on the same arguments [all.done]
#   consumers  (after the first two calls) the head kernel's row sums on its consumer warpgroups
#           (model.head_rowsums=consumers): GPU 0 the head bench (its RS_MODE 2 rows) while GPU 1 runs the GPU
#           tests as in ab2; two rounds of A/B benches (epilogue against consumers, swapped between the
#           GPUs); the choice for fullonly [all.done]
#   split   as consumers, for model.head_rowsums=split (written after the consumers mode lost in the kernel
#           bench; ran as split1 with three slices on the epilogue warps and one on the consumers; `split`
#           is two and two since, the fastest kernel, its step not yet measured: split1 is the next session's
#           first run)
#   split1  split's measurements on a one-GPU machine: the head bench, the Gluon head's GPU tests, then
#           A/B/A/B benches of epilogue against split on one shared compiler cache
#   fullonly  restore the kept shards; two proxy212 runs at once with $RES/full.args (GPU 0 and GPU 1, on
#           the A/B benches' compiler caches of the candidate) [all.done]
#   wait S [D [LOG]]  print LOG (default q.log) until $RES/D.done exists (default all) or S seconds
#           passed; tar the results into $OUT
# Carry [".proxy"] without shard 4 for ab2 and stage, then [".proxy"] with shard 4 alone for full2.
# Launch: (setsid nohup bash scripts/device/session17_queue.sh ab2 > /tmp/q-launch.log 2>&1 &)
set -u
source scripts/device/common.sh

# The A/B arms: A the default's way, B the candidate's (ab2: the CE's transposed gradient; consumers: the
# head kernel's row sums on its consumer warpgroups)
A=copy B=transposed
A_ARGS="--set model.ce_transposed=false" B_ARGS="--set model.ce_transposed=true"
if [ "${1:-}" = consumers ]; then
  A=epilogue B=consumers
  A_ARGS="--set model.head_rowsums=epilogue" B_ARGS="--set model.head_rowsums=consumers"
elif [ "${1:-}" = split ] || [ "${1:-}" = split1 ] || [ "${1:-}" = fullonly ]; then
  A=epilogue B=split
  A_ARGS="--set model.head_rowsums=epilogue" B_ARGS="--set model.head_rowsums=split"
fi

round() {  # round N GPU-FOR-A [fresh]: arm A on one GPU, arm B on the other, at once
  local a=$2 b=$(( 1 - $2 ))
  ab_on "$a" "$A$1-gpu$a" "ab-$A" ${3:-} -- $A_ARGS &
  ab_on "$b" "$B$1-gpu$b" "ab-$B" ${3:-} -- $B_ARGS &
  wait
}

choose() {  # $RES/full.args: B's arguments when B's median was lower on both GPUs, else nothing
  python3 - "$RES" "$A" "$B" "$B_ARGS" <<'PY'
import glob, json, os, statistics, sys
res, a, b, b_args = sys.argv[1:]
ms = {}
for p in glob.glob(os.path.join(res, "ab-*-gpu*.json")):
    arm, gpu = os.path.basename(p)[3:-5].split("-gpu")
    ms.setdefault((arm.rstrip("0123456789"), gpu), []).append(json.load(open(p))["ms_per_step"])
wins = []
for gpu in ("0", "1"):
    ta, tb = ms.get((a, gpu)), ms.get((b, gpu))
    if ta and tb:
        print(f"gpu{gpu}: {a} {sorted(ta)} {b} {sorted(tb)} -> {statistics.median(tb) - statistics.median(ta):+.2f} ms")
        wins.append(statistics.median(tb) < statistics.median(ta))
args = b_args if len(wins) == 2 and all(wins) else ""
open(os.path.join(res, "full.args"), "w").write(args + "\n")
print("full.args:", args or "(the default)")
PY
}

extra_args_file() {  # the runs' extra arguments: $RES/full.args (choose's), empty where none was written
  export TRAIN_EXTRA_FILE=$RES/full.args
  [ -f "$TRAIN_EXTRA_FILE" ] || echo > "$TRAIN_EXTRA_FILE"
}

gluon_tests() {  # gluon_tests GPU: the head's, both Gluon kernels' and the CE kernel's GPU tests on GPU
  ( export CUDA_VISIBLE_DEVICES=$1
    env -u PYTHONPYCACHEPREFIX timeout 420 python3 -m pytest -m gpu -q -s tests/test_head_gluon.py \
      tests/test_relu2_gluon.py tests/test_head.py tests/test_softcap_ce.py > "$RES/gpu-tests-head.log" 2>&1
    echo "$(date +%T) [gpu$1] GPU tests (head, CE): $(tail -1 "$RES/gpu-tests-head.log")" )
}

head_bench_on() {  # head_bench_on GPU NAME: head_fwd_gluon_bench.py on GPU into $RES/NAME.*
  ( export CUDA_VISIBLE_DEVICES=$1
    (cd scripts/device && timeout 300 python3 head_fwd_gluon_bench.py "$RES/$2.json") > "$RES/$2.log" 2>&1
    echo "$(date +%T) [gpu$1] head bench: exit $? | $(tail -4 "$RES/$2.log" | tr '\n' ' ')" )
}

case "${1:-}" in
  ab2)
    queue_start
    bytecode_on
    ( clocks_log clocks.csv
      disown  # the clock log's nvidia-smi runs until the machine goes: no `wait` below waits for it
      head_bench_on 0 head-transposed &
      gluon_tests 1 &
      wait
      round 1 0 fresh
      round 2 1
      round 3 0
      round 4 1
      choose
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  consumers | split)
    queue_start
    bytecode_on
    ( clocks_log clocks.csv
      disown
      head_bench_on 0 "head-$B" &
      gluon_tests 1 &
      wait
      round 1 0 fresh
      round 2 1
      choose
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  split1)  # the same on a one-GPU machine: head bench, the Gluon head's GPU tests, A/B/A/B on one shared cache
    queue_start
    bytecode_on
    ( clocks_log clocks.csv
      disown
      head_bench_on 0 head-split
      ( export CUDA_VISIBLE_DEVICES=0
        env -u PYTHONPYCACHEPREFIX timeout 200 python3 -m pytest -m gpu -q -s tests/test_head_gluon.py \
          > "$RES/gpu-tests-head.log" 2>&1
        echo "$(date +%T) GPU tests (Gluon head): $(tail -1 "$RES/gpu-tests-head.log")" )
      export CUDA_VISIBLE_DEVICES=0
      for r in 1 2; do
        AB_CACHE=ab-split ab_shared "epilogue$r" --set model.head_rowsums=epilogue
        AB_CACHE=ab-split ab_shared "split$r" --set model.head_rowsums=split
      done
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  fullonly)
    restore_proxy
    bytecode_on
    extra_args_file
    ( train 0 full-a "ab-$B" &
      train 1 full-b "ab-$B" &
      wait
      summaries
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  stage) stage_proxy ;;
  full2)
    restore_proxy
    bytecode_on
    extra_args_file
    EXTRA=$(cat "$TRAIN_EXTRA_FILE")
    ( train 0 full-a fa fresh &
      train 1 full-b fb fresh &
      wait
      summaries
      touch "$RES/full.done"
      ab_on 0 1gpu-gpu0 fa -- $EXTRA &
      ab_on 1 1gpu-gpu1 fb -- $EXTRA &
      wait
      for name in 2gpu 2gpu-b; do
        echo "$(date +%T) $name $EXTRA"
        env $(caches fa) torchrun --standalone --nproc_per_node=2 -m speedrun.cli bench --preset proxy212 \
          --steps 10 --repeats 3 $EXTRA --json "$RES/$name.json" > "$RES/$name.log" 2>&1
        echo "$(date +%T) $name: exit $? | $(grep -E 'ms/step|peak mem|graphs|rror' "$RES/$name.log" | tr '\n' ' ')"
      done
      env $(caches fa) torchrun --standalone --nproc_per_node=2 -m speedrun.cli bench --preset proxy212 \
        --steps 5 --repeats 3 --comm $EXTRA --json "$RES/comm.json" > "$RES/comm.log" 2>&1
      echo "$(date +%T) comm: exit $? | $(grep -E 'hidden|exposed|rror' "$RES/comm.log" | head -5 | tr '\n' ' ')"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 ab2 | consumers | split | split1 | stage | full2 | fullonly | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
