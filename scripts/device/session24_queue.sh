#!/usr/bin/env bash
# Issue 4, twenty-fourth session (one H200): train.head_once as the default on a fresh machine: its strict
# cold start, the whole GPU suite (first GPU run of kernel_choice.built_once), then a full pair.
#   check   keep the carried shards (stage_proxy); the strict cold start of the default as the machine's first
#           Python process; the clock log; the whole GPU suite, one pytest per file; log q-check.log [all.done]
#   full    restore the kept shards; two proxy212 runs of the default on the strict caches [full.done]
#   wait S [D [LOG]]  as session18_queue.sh's
# Carry [".proxy"] without shard 4 for check, then [".proxy"] with shard 4 alone for full, at once after.
set -u
source scripts/device/common.sh

check_queue() {
  verify_prelude
  suite_per_file 170
}

case "${1:-}" in
  check) check_start; logged q-check.log check_queue ;;
  full) full_pair ;;
  wait) follow_and_collect "${2:-560}" "$RES/${3:-all}.done" "$RES/${4:-q.log}"; exit $? ;;
  *) echo "usage: $0 check | full | wait SECONDS [DONE-NAME [LOG]]" >&2; exit 2 ;;
esac
