#!/usr/bin/env bash
# The 2026 record's measurements on one GPU, in the order given, on one compiler cache for the whole call
# (empty first, so the first item's start is the cold start):
#   161:SEED   a whole proxy161 run from .proxy161 with that seed; 161:SEED:bf16 with the MLP in bf16
#              (fp8.mlp=false), 161:SEED:fp8 with it in FP8 (fp8.mlp=true), whatever the preset's default;
#              161:SEED:split with the first stage's piece sets one to a micro-step, the spec's layout
#              (train.merge_tokens=0; the preset joins them two to a micro-step)
#   322        one proxy322 run from .proxy322 (322:bf16 / 322:fp8 with the MLP in bf16 / FP8); .proxy322 holds
#              the training shards alone, the val shard comes from the .proxy161 an earlier call of the
#              same lease left on the machine (with it the tree passes the 64 MiB a call carries)
#   bench      `speedrun bench --preset record --data .proxy161`: ms a step in each stage, then one pair of
#              each stage under the profiler (the documents bound raised as proxy161's: the proxy's
#              documents are shorter than FineWeb's)
#   bench:K    the same for stage K alone (one stage's compile, a profile small enough to bring back);
#              bench:K:bf16 / bench:K:fp8 with the MLP in bf16 / FP8 (fp8.mlp=false / true), bench:K:split with
#              piece sets one to a micro-step as 161:SEED:split, bench:K:mergeN (or 161:SEED:mergeN) with
#              train.merge_tokens=N; bench...@old the same of the older tree
#              in .old/src (`git archive COMMIT src | tar -x -C .old`, carried) on its own compiler cache
#   ce         the loss kernel's forms and tiles at stage 2's micro-batch (scripts/bench/record_ce_bench.py)
#   tests      the record's GPU tests (attention, FP8, the fused loss, Adam's and NorMuon's kernels, three whole steps), the banks' views, their printed shares
#   bisect     record_kernel_bisect.py --all: the first steps eagerly with each kernel put back on its
#              reference in turn, which keeps the loss finite (a NaN run's first call)
# KEEP_CACHE=1 keeps the cache an earlier call on the same (still held) machine left.
# e.g. `record_runs.sh 161:0 161:1 bench`. Carry .proxy161 or .proxy322 (scripts/bench/record_carry_sets.py
# makes them). LIMIT (seconds, default 560) bounds the whole call: an item that would start too late is
# skipped, and the one running at the limit is stopped, so the results are always packed before the
# device call ends. Results: /tmp/runs/RUN (summary.json, metrics.jsonl, config.json), $RES/*.log, then
# $OUT/results.tar.gz.
set -u
source scripts/bench/common.sh
LIMIT=${LIMIT:-560}
unpack() { [ -d "$1" ] && (cd "$1" && for f in *.xz; do [ -f "${f%.xz}" ] || xz -dk "$f" & done; wait); }
left() { echo $((LIMIT - SECONDS)); }
run() {  # run RUN DATA ARGS...: speedrun train into /tmp/runs/RUN on the call's cache
  local name=$1 data=$2; shift 2
  echo "$(date +%T) start $name $* ($(left) s left)"
  env $(caches record) timeout "$(left)" python3 -m speedrun.train --data-dir "$data" --no-progress --overwrite \
    --out "/tmp/runs/$name" "$@" > "$RES/$name.log" 2>&1
  echo "$(date +%T) end $name: exit $? | $(grep -E 'cold start|precompile|final val|rror' "$RES/$name.log" | tr '\n' ' ')"
}
variant() {  # variant SPEC: SPEC less a trailing :bf16, :fp8, :split or :mergeN into $spec, its --set into $sets,
  # -bf16/-fp8/-split/-mergeN into $form
  spec=$1 sets=() form=""
  case $1 in *:bf16) spec=${1%:bf16} sets=(--set fp8.mlp=false) form=-bf16 ;;
             *:fp8) spec=${1%:fp8} sets=(--set fp8.mlp=true) form=-fp8 ;;
             *:split) spec=${1%:split} sets=(--set train.merge_tokens=0) form=-split ;;
             *:merge*) spec=${1%:merge*} sets=(--set "train.merge_tokens=${1##*:merge}") form=-merge${1##*:merge} ;; esac
}
item() {
  local spec sets form
  case $1 in
    161:*) variant "${1#161:}"; unpack .proxy161
           run "proxy161-seed$spec$form" .proxy161 --preset proxy161 --seed "$spec" "${sets[@]}" ;;
    322*) local val=fineweb_val_000000.bin.xz; variant "$1"
          [ -f .proxy322/$val ] || cp .proxy161/$val .proxy322/ 2>/dev/null \
            || { echo "322: no val shard: neither .proxy322/$val nor .proxy161/$val (carry .proxy161 in an earlier call)"; return; }
          unpack .proxy322; run "proxy322$form" .proxy322 --preset proxy322 "${sets[@]}" ;;
    bench|bench:*) local tag=record only=() src=src cache=record base=${1%@old}
           [ "$base" != "$1" ] && { src=.old/src; cache=record-old; tag=old; }
           variant "${base#bench}"; tag=$tag$form
           [ -n "$spec" ] && { tag=$tag-stage${spec#:}; only=(--stages "${spec#:}"); }
           unpack .proxy161; env $(caches $cache) PYTHONPATH="$PWD/$src" timeout "$(left)" python3 -m speedrun.cli.__main__ \
             bench --preset record --pairs 5 --data .proxy161 --set docs.max_docs_mult=4 "${only[@]}" "${sets[@]}" \
             --json "$RES/bench-$tag.json" --profile "$RES/profile-$tag.txt" > "$RES/bench-$tag.log" 2>&1
           echo "$tag:"; grep -v '^\s*$' "$RES/bench-$tag.log" | tail -12 ;;
    ce) (cd scripts/bench && timeout "$(left)" python3 record_ce_bench.py "$RES/record-ce-bench.json") \
          > "$RES/record-ce-bench.log" 2>&1; grep -E "floor|form" "$RES/record-ce-bench.log" | cut -c1-150 ;;
    tests) timeout "$(left)" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_record_attention_gpu.py \
             tests/test_record_fp8_gpu.py tests/test_record_ce_gpu.py tests/test_record_adam.py tests/test_record_mlp.py tests/test_record_dc.py tests/test_record_head_loss.py tests/test_record_steps_gpu.py tests/test_normuon.py tests/test_bank_views.py -s > "$RES/gpu-tests.log" 2>&1; tail -3 "$RES/gpu-tests.log" ;;
    bisect) unpack .proxy161; timeout "$(left)" python3 scripts/bench/record_kernel_bisect.py --all "$RES/kernel-bisect.json" --data .proxy161 \
              --steps 3 --timeout 55 > "$RES/kernel-bisect.log" 2>&1; tail -10 "$RES/kernel-bisect.log" ;;
    *) echo "usage: $0 161:SEED[:bf16|:fp8|:split|:mergeN] | 322[:bf16|:fp8] | bench | bench:K[:bf16|:fp8|:split|:mergeN][@old] | ce | tests | bisect ..."; exit 2 ;;
  esac
}
gpus_csv
bytecode_on
[ "${KEEP_CACHE:-0}" = 1 ] || rm -rf "$C/record"
for it in "$@"; do
  if [ "$(left)" -lt 60 ]; then echo "skipped $it: $(left) s left"; continue; fi
  item "$it"
done
summaries
collect
