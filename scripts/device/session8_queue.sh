#!/usr/bin/env bash
# Issue 4, eighth session (one H200): the three cheap levers left after session 7, measured alone first.
#   micro        ce_math_bench.py (the CE kernel's sigmoid variants), qk_forms_bench.py (formulations of
#                QK-norm + rotary, compiled), attn_backends_bench.py (FlexAttention against varlen_attn;
#                needs .proxy/fineweb_val_000000.bin.xz carried)
#   ab NAME SRC  speedrun bench of proxy212 (3 x 10 steps, random tokens, no profile) of the sources
#                under SRC (src, or .old/src from `git archive HEAD src | tar -x -C .old`), own empty
#                caches; extra `speedrun bench` arguments from $BENCH_EXTRA
#   gputests     the GPU tests (pytest -m gpu)
#   second       the GPU tests of the CE kernel, the head and the transpose, then two benches on this
#                machine: this tree, and this tree with model.ce_math=tanh_approx. (The session's first
#                version of this step also ran a sweep of the CE kernel writing the transposed gradient
#                itself, and benched the session's start from .old/src; see docs/benchmarks.md)
#   full         two proxy212 runs (needs the whole .proxy carried): this tree, and with tanh_approx,
#                on the compiler caches of the matching benches
#   wait S [D [LOG]]  print LOG (default q.log; `full` writes q-full.log) until $RES/D.done exists
#                (default all) or S seconds passed; tar to $OUT
# Python's bytecode is kept between starts (PYTHONPYCACHEPREFIX), as docs/performance.md advises.
# Launch: setsid nohup bash scripts/device/session8_queue.sh micro > /tmp/q.log 2>&1 &
set -u
source scripts/device/common.sh
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache

micro_one() {  # micro_one NAME ARGS...: one micro-benchmark script of scripts/device, its log in $RES
  local name=$1; shift
  echo "$(date +%T) $name"
  (cd scripts/device && python3 "$@") > "$RES/$name.log" 2>&1
  echo "$(date +%T) $name: exit $? | $(tail -4 "$RES/$name.log" | cut -c1-400 | tr '\n' ' ')"
}

ab() {  # ab NAME SRC
  echo "$(date +%T) ab $1 $2 ${BENCH_EXTRA:-}"
  env $(caches "ab-$1" fresh) PYTHONPATH="$PWD/$2" python3 -m speedrun.cli bench --preset proxy212 --steps 10 \
    --repeats 3 ${BENCH_EXTRA:-} --json "$RES/ab-$1.json" > "$RES/ab-$1.log" 2>&1
  echo "$(date +%T) ab $1: exit $? | $(grep -E 'ms/step|peak mem|graphs|rror' "$RES/ab-$1.log" | tr '\n' ' ')"
}

case "${1:-}" in
  micro)
    rm -f "$RES"/*.done
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$RES/gpus.csv"
    (cd .proxy && xz -dkf fineweb_val_000000.bin.xz)
    ( micro_one ce-math ce_math_bench.py "$RES/ce-math.json"; touch "$RES/ce.done"
      micro_one qk-forms qk_forms_bench.py "$RES/qk-forms.json" cuda; touch "$RES/qk.done"
      micro_one attn-backends attn_backends_bench.py "$PWD/.proxy" "$RES/attn-backends.json"
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  ab) rm -f "$RES"/*.done; ( ab "$2" "$3"; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  gputests)
    rm -f "$RES"/*.done
    ( python3 -m pytest -m gpu -q tests > "$RES/gpu-tests.log" 2>&1
      echo "$(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests.log")"; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  second)
    rm -f "$RES"/*.done
    unpack_proxy
    ( python3 -m pytest -m gpu -q tests/test_softcap_ce.py tests/test_head.py tests/test_transpose.py > "$RES/gpu-tests.log" 2>&1
      echo "$(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests.log")"
      ab new src
      BENCH_EXTRA="--set model.ce_math=tanh_approx" ab approx src
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full)
    rm -f "$RES"/*.done
    unpack_proxy
    ( train 0 full-h ab-new
      echo "--set model.ce_math=tanh_approx" > /tmp/approx.args
      TRAIN_EXTRA_FILE=/tmp/approx.args train 0 full-h-approx ab-approx
      summaries
      touch "$RES/all.done" ) > "$RES/q-full.log" 2>&1 ;;
  wait)
    follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"
    exit $? ;;
  *) echo "usage: $0 micro | ab NAME SRC | gputests | second | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
