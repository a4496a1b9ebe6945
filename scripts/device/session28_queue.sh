#!/usr/bin/env bash
# Issue 4, twenty-eighth session: Inductor options not measured before, A/B on one compiler cache.
#   ab      rounds of `speedrun bench --preset proxy212` on one shared cache: the default, then
#           combo_kernels=true (independent small kernels launched as one), then max_autotune_gemm=true
#           (Triton templates benchmarked against cuBLAS for each product at compile time); the first
#           round's compile times in the logs ("set-up / first step / warm-up") [all.done, q.log]
#   flex    a profiled bench (3 steps) on fresh caches: which layer runs which FlexAttention kernel and for
#           how long (flex_layers.py on the Chrome trace), and the generated template kernels' sources
#           copied to $OUT/kernels [all.done, q-flex.log]
#   ab2     the λ pairs 16-byte aligned (this commit) against the plain slices (a copy of src/ with
#           `aligned_pairs` undone by sed), two rounds on their own caches; then how many custom-op outputs
#           each arm's generated code assumes unaligned [all.done, q.log]
#   full2   restore the kept shards; two proxy212 runs on the aligned arm's caches [full.done, q-full.log]
#   verify  for the next session: the GPU test of the generated code's alignment, then a profiled bench and
#           flex_layers.py (every layer's FlexAttention forward should now be one kernel) [all.done, q.log]
#   full    the default pair of proxy212 runs (common.sh's full_pair) [full.done, q-full.log]
#   wait S [D [LOG]]  follow until $RES/D.done or S seconds; tar results into $OUT
# Carry [".proxy"] (shards 1-3 and val): `ab` reads random tokens and keeps the shards for `full`.
set -u
source scripts/device/common.sh

ab_queue() {
  bytecode_on
  clocks_log clocks.csv
  local r
  for r in ${AB_ROUNDS:-1 2 3}; do
    AB_CACHE=ab28 ab_shared "default$r"
    AB_CACHE=ab28 ab_shared "combo$r" --set train.inductor_options=combo_kernels=true
    AB_CACHE=ab28 ab_shared "mag$r" --set train.inductor_options=max_autotune_gemm=true
  done
  grep -H "set-up / first step" "$RES"/ab-*.log
}

flex_queue() {
  bytecode_on
  local inductor=$C/flex/inductor
  flex_profile flex
  mkdir -p "$OUT/kernels"
  grep -rl --include='*.py' -e 'triton_tem_fused.*flex_attention' "$inductor" | while read -r f; do
    [ "$(stat -c %s "$f")" -lt 4000000 ] && cp "$f" "$OUT/kernels/$(basename "$f")"; done
  ls -la "$OUT/kernels" | head -30
  rm -f "$RES/prof.txt.trace.json.gz"
  [ -n "${NO_LAYOUT:-}" ] || (cd scripts/device && python3 flex_layout_bench.py ../../.proxy) 2>&1 | grep -v Warning
}

ab2_queue() {
  bytecode_on
  clocks_log clocks.csv
  rm -rf /tmp/old-src && cp -r src /tmp/old-src
  sed -i 's/^    return F.pad(v.view(-1, 2), (0, 2))$/    return v.view(-1, 2)/' /tmp/old-src/speedrun/model.py
  grep -q '^    return v.view(-1, 2)$' /tmp/old-src/speedrun/model.py || { echo "the old arm was not made"; return 1; }
  local r
  for r in ${AB_ROUNDS:-1 2}; do
    AB_CACHE=ab28new ab_shared "aligned$r"
    PYTHONPATH=/tmp/old-src AB_CACHE=ab28old ab_shared "unaligned$r"
  done
  for arm in ab28new ab28old; do
    echo "$arm: $(grep -rh --include='*.py' 'is assumed to be not aligned' "$C/$arm/inductor" | wc -l) outputs assumed unaligned"
  done
}

case "${1:-}" in
  ab) check_start; ( ab_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  flex) check_start; ( flex_queue; touch "$RES/all.done" ) > "$RES/q-flex.log" 2>&1 ;;
  ab2) check_start; ( ab2_queue; touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full2) restore_proxy; bytecode_on
    ( train 0 full-a ab28new; train 0 full-b ab28new; summaries; touch "$RES/full.done" ) > "$RES/q-full.log" 2>&1 ;;
  verify) check_start; ( gpu_tests aligned 600 tests/test_attn_inputs.py -k aligned; NO_LAYOUT=1 flex_queue
    touch "$RES/all.done" ) > "$RES/q.log" 2>&1 ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 ab | flex | ab2 | full2 | verify | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
