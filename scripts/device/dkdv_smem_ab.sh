#!/usr/bin/env bash
# Issue 4, forty-fourth session: the training step with dK/dV's lse, delta and ids through shared memory
# (attn_gluon DKDV_SMEM) against without, before the model had an option for it: the launchers' default
# (CONFIG's DKDV_SMEM, which the model's backward inherits) is flipped in this machine's copy of the tree
# between benches. Rounds def/smem, smem/def, ... on one shared compiler cache until DEADLINE seconds;
# JSON and logs in $RES/ab-{def,smem}N.*, the log in $RES/q.log, then the results into $OUT.
set -u
source scripts/device/common.sh
deadline=$(( $(date +%s) + ${1:-300} ))
flip() { sed -i "s/\"DKDV_SMEM\": [01]}/\"DKDV_SMEM\": $1}/" src/speedrun/attn_gluon.py; grep -c "\"DKDV_SMEM\": $1}" src/speedrun/attn_gluon.py; }
arm() { if [ "$1" = smem ]; then flip 1; else flip 0; fi; ab_shared "$1$2"; }
( measure_start
  r=1
  for order in "def smem" "smem def" "def smem" "smem def"; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "$(date +%T) budget spent"; break; }
    for a in $order; do arm "$a" "$r"; done
    r=$((r + 1))
  done
  flip 0 ) > "$RES/q.log" 2>&1
cat "$RES/q.log"; collect
