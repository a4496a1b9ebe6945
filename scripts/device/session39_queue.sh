#!/usr/bin/env bash
# Issue 4, for the thirty-ninth session: the attention forward as a Gluon kernel of its own (attn_gluon.py).
#   attn [STAGES]  its GPU tests [gpu-tests-attn.log]; then scripts/device/attn_gluon_bench.py on the
#                  proxy's first training shard: agreement with FlexAttention's forward, time and energy a
#                  call at each window [attn-gluon.json, attn-gluon.log] [all.done, q.log]
#   ab ROUNDS [ARM...]  `speedrun bench` of proxy212 on the proxy shards carried, the arms in turns (AB_ARGS:
#              def, flex, gluon, overlap, graphs (train.cudagraphs), qreg / noqreg (attention.gluon_q_regs on
#              / off; on by default since the forty-first session), dqreg / nodqreg (attention.gluon_dq_q_regs
#              on / off; on since the forty-third), i32 (attention.gluon_docs_i32 on), smem / nosmem
#              (attention.gluon_dkdv_smem on / off; on since the forty-fourth);
#              default
#              def and gluon: in the thirty-ninth session `def` was FlexAttention, since then `auto` picks
#              gluon on Hopper), ROUNDS rounds, each arm on its own compiler cache
#              [ab-ARM-N.json/.log] [ab.done, q-ab.log]
#   suite      the whole GPU suite, one pytest per file [gpu-test_*.log] [all.done, q.log]
#   files F... (fortieth session) those test files' GPU tests, one pytest per file, then the attn bench as
#              `attn` runs it [gpu-test_*.log, attn-gluon.*] [all.done, q.log]
#   host       (fortieth) scripts/device/attn_gluon_host.py: where the Gluon launch's host time goes
#              [attn-host.txt] [all.done, q.log]; needs no data
#   fullab ARM...  proxy212 runs one after the other, ARM def or one of FULL_ARGS (session38_queue.sh's fullab)
#                  [full.done, q-full.log]; a call carrying shards 3-4 after one that kept the others
#   bwd [ARM,...]  (forty-third session) the attention GPU tests, then scripts/device/attn_bwd_bench.py (DQ_Q_REG,
#              int32 document ids, DKDV_SMEM against the defaults, from CUDA graphs, 3 rounds in turns; only
#              the arms named, with the plain ones, when given)
#              [gpu-tests-attn.log, attn-bwd.json, attn-bwd.log] [all.done, q.log]
#   wait S [D [LOG]]  follow until $RES/D.done or S seconds; tar results into $OUT
# Carry [".proxy"]: shards 1-2 and val first (1-3 and val until the forty-first session; the tree has grown
# past what fits beside them), shards 3 and 4 in the call that runs `fullab` (common.sh, stage_proxy).
set -u
source scripts/device/common.sh

declare -A FULL_ARGS=([gluon]="--set attention.backend=gluon" [flex]="--set attention.backend=flex"
                      [overlap]="--set attention.backend=gluon --set attention.gluon_overlap=true"
                      [graphs]="--set train.cudagraphs=true"
                      [qreg]="--set attention.backend=gluon --set attention.gluon_q_regs=true"
                      [noqreg]="--set attention.backend=gluon --set attention.gluon_q_regs=false")

attn_queue() {
  gpu_tests attn 300 tests/test_attn_gluon.py
  grep -E "Error|assert|passed|failed" "$RES/gpu-tests-attn.log" | head -30
  measure_start
  PYTHONPATH=src timeout 280 python3 scripts/device/attn_gluon_bench.py .proxy "$RES/attn-gluon.json" 1.5 "${1:-2}" \
    > "$RES/attn-gluon.log" 2>&1
  echo "$(date +%T) attn bench: exit $?"
  tail -60 "$RES/attn-gluon.log"
}

declare -A AB_ARGS=([def]="" [flex]="--set attention.backend=flex" [gluon]="--set attention.backend=gluon"
                    [overlap]="--set attention.backend=gluon --set attention.gluon_overlap=true"
                    [graphs]="--set train.cudagraphs=true"
                    [qreg]="--set attention.backend=gluon --set attention.gluon_q_regs=true"
                    [noqreg]="--set attention.backend=gluon --set attention.gluon_q_regs=false"
                    [dqreg]="--set attention.backend=gluon --set attention.gluon_dq_q_regs=true"
                    [nodqreg]="--set attention.backend=gluon --set attention.gluon_dq_q_regs=false"
                    [i32]="--set attention.backend=gluon --set attention.gluon_docs_i32=true"
                    [smem]="--set attention.backend=gluon --set attention.gluon_dkdv_smem=true"
                    [nosmem]="--set attention.backend=gluon --set attention.gluon_dkdv_smem=false")

ab_queue() {  # ab_queue ROUNDS [ARM...]: the arms (AB_ARGS; default: def and gluon) in turns, ROUNDS rounds
  measure_start
  local r arm rounds=${1:-1}
  shift
  local arms=("$@"); [ ${#arms[@]} -eq 0 ] && arms=(def gluon)
  for r in $(seq 1 "$rounds"); do
    for arm in "${arms[@]}"; do
      local extra=(${AB_ARGS[$arm]})
      echo "$(date +%T) bench $arm round $r"
      env $(caches "ab-$arm") timeout 400 python3 -m speedrun.cli bench --preset proxy212 --steps 10 --repeats 3 \
        --data .proxy "${extra[@]}" --json "$RES/ab-$arm-$r.json" > "$RES/ab-$arm-$r.log" 2>&1
      echo "$(date +%T) bench $arm: exit $? | $(grep -E 'ms/step|energy|GPU clock|compile' "$RES/ab-$arm-$r.log" | tr '\n' ' ')"
    done
  done
}

files_queue() {  # files_queue FILE...: each file's GPU tests, one pytest per file (at most 240 s each)
  local f rc
  for f in "$@"; do
    env -u PYTHONPYCACHEPREFIX timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider "$f" \
      > "$RES/gpu-$(basename "$f" .py).log" 2>&1; rc=$?
    echo "$(date +%T) $f: exit $rc | $(tail -1 "$RES/gpu-$(basename "$f" .py).log")"
  done
}

case "${1:-}" in
  files) shift; check_start; ( files_queue "$@"; measure_start
         PYTHONPATH=src timeout 280 python3 scripts/device/attn_gluon_bench.py .proxy "$RES/attn-gluon.json" 1.5 2 \
           > "$RES/attn-gluon.log" 2>&1
         echo "$(date +%T) attn bench: exit $?"; grep -E "gluon2 |qreg|flex  " "$RES/attn-gluon.log"
         touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  attn) shift; check_start; ( attn_queue "$@"; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  suite) check_start; ( suite_per_file 240; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  bwd) sel=${2:-}; check_start; ( gpu_tests attn 240 tests/test_attn_gluon.py
       grep -E "Error|assert|passed|failed" "$RES/gpu-tests-attn.log" | head -30
       measure_start
       PYTHONPATH=src timeout 330 python3 scripts/device/attn_bwd_bench.py .proxy "$RES/attn-bwd.json" 0.7 3 \
         $sel > "$RES/attn-bwd.log" 2>&1
       echo "$(date +%T) bwd bench: exit $?"; cat "$RES/attn-bwd.log"
       touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  host) queue_start; ( PYTHONPATH=src timeout 200 python3 scripts/device/attn_gluon_host.py "$RES/attn-host.txt" 200
        echo "$(date +%T) host: exit $?"; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  ab) shift; check_start; ( ab_queue "$@"; touch "$RES/ab.done" ) > "$RES/q-ab.log" 2>&1 ;;
  fullab) shift; restore_proxy; bytecode_on
          ( full_arms "$@"; touch "$RES/full.done" ) > "$RES/q-full.log" 2>&1 ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 attn [STAGES] | bwd | ab [ROUNDS [ARM...]] | suite | files FILE... | host | fullab ARM... | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
