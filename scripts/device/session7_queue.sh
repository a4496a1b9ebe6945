#!/usr/bin/env bash
# Issue 4, seventh session (one H200): the head's memory-bound passes and where the step goes now.
#   micro        scripts/device/head_bench.py: CE kernel grids (one program per row against a persistent
#                grid) and the e5m2 transpose, at the record's shape
#   bench NAME   speedrun bench of proxy212 (3 x 10 steps, random tokens) with a kernel profile, its own
#                empty compiler caches; the generated Triton kernels kept in $RES/kernels-NAME.tar.gz.
#                Extra `speedrun bench` arguments from $BENCH_EXTRA, extra environment from $BENCH_ENV
#   first        micro, bench base, bench cdt (Inductor's coordinate-descent tuning of its own kernels,
#                TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1: how much the generated kernels' launch
#                parameters leave on the table, and what the tuning costs in compile time)
#   second       head_bench.py's transpose and backward parts, the GPU tests of test_transpose.py and
#                test_head.py, then A/B benches without profile: the previous commit (.old/src, from `git
#                archive HEAD src | tar -x -C .old`) and this tree. (The session's call also benched a variant
#                with the copy on a side stream, since removed: no gain; docs/benchmarks.md)
#   wait S [D]   print progress until $RES/D.done exists (default all) or S seconds passed; tar to $OUT
# Python's bytecode is kept between starts (PYTHONPYCACHEPREFIX), as docs/performance.md advises.
# Launch: setsid nohup bash scripts/device/session7_queue.sh first > /tmp/q.log 2>&1 &
set -u
source scripts/device/common.sh
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache

micro() {
  echo "$(date +%T) micro"
  (cd scripts/device && python3 head_bench.py "$RES/head-bench.json") > "$RES/head-bench.log" 2>&1
  echo "$(date +%T) micro: exit $? | $(grep -E '^best|rror' "$RES/head-bench.log" | tr '\n' ' ')"
}

bench() {  # bench NAME
  echo "$(date +%T) bench $1 ${BENCH_ENV:-} ${BENCH_EXTRA:-}"
  env $(caches "bench-$1" fresh) ${BENCH_ENV:-} python3 -m speedrun.cli bench --preset proxy212 --steps 10 \
    --repeats 3 ${BENCH_EXTRA:-} --profile "$RES/profile-$1.txt" --json "$RES/bench-$1.json" > "$RES/bench-$1.log" 2>&1
  echo "$(date +%T) bench $1: exit $? | $(grep -E 'ms/step|compile|graphs|rror' "$RES/bench-$1.log" | tr '\n' ' ')"
  (cd "$C/bench-$1/inductor" && grep -rl --include='*.py' '@triton.jit' . | tar czf "$RES/kernels-$1.tar.gz" -T -) 2>/dev/null
}

ab() {  # ab NAME SRC: speedrun bench (no profile) of the sources under SRC, its own empty caches
  echo "$(date +%T) ab $1 $2"
  env $(caches "ab-$1" fresh) PYTHONPATH="$PWD/$2" python3 -m speedrun.cli bench --preset proxy212 --steps 10 \
    --repeats 3 --json "$RES/ab-$1.json" > "$RES/ab-$1.log" 2>&1
  echo "$(date +%T) ab $1: exit $? | $(grep -E 'ms/step|peak mem|graphs|rror' "$RES/ab-$1.log" | tr '\n' ' ')"
}

case "${1:-}" in
  second)  # backward micro-bench, GPU tests of the head and the transpose, A/B benches (old tree in .old/src)
    rm -f "$RES"/*.done
    ( echo "$(date +%T) micro backward"
      (cd scripts/device && python3 head_bench.py "$RES/head-bench-2.json" transpose,backward) > "$RES/head-bench-2.log" 2>&1
      echo "$(date +%T) micro: exit $? | $(grep -E 'serial|overlapped|rror' "$RES/head-bench-2.log" | tr '\n' ' ')"
      python3 -m pytest -m gpu -q tests/test_transpose.py tests/test_head.py > "$RES/gpu-tests.log" 2>&1
      echo "$(date +%T) GPU tests: $(tail -1 "$RES/gpu-tests.log")"
      touch "$RES/micro.done"
      ab old .old/src
      ab serial src
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  micro) rm -f "$RES"/*.done; ( micro; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  bench) rm -f "$RES"/*.done; ( bench "$2"; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  first)
    rm -f "$RES"/*.done
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$RES/gpus.csv"
    ( micro; touch "$RES/micro.done"
      bench base; touch "$RES/base.done"
      BENCH_ENV=TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 bench cdt
      touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  wait)
    follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/q.log"
    exit $? ;;
  *) echo "usage: $0 micro | bench NAME | first | second | wait SECONDS [DONE-NAME]" >&2; exit 2 ;;
esac
