#!/usr/bin/env bash
# The GPU tests (pytest -m gpu), one pytest per file so that one file's compiled state does not reach the
# next and a hang costs one file.
#   suite        every test file with GPU tests                      (the whole suite: about 9 minutes)
#   files F...   those files only
# usage: bash scripts/bench/gpu_tests.sh suite | files tests/test_attn_gluon.py ...
# Each file at most PER_FILE seconds (default 240). Results: $RES/gpu-test_*.log, one line a file, then
# $OUT/results.tar.gz. The 2-GPU optimiser test skips unless two GPUs are visible.
set -u
source scripts/bench/common.sh
case "${1:-}" in
  suite) files=$(grep -l "mark.gpu" tests/test_*.py) ;;
  files) shift; files="$*" ;;
  *) echo "usage: $0 suite | files FILE..." >&2; exit 2 ;;
esac
gpus_csv
for f in $files; do
  name=$(basename "$f" .py)
  env -u PYTHONPYCACHEPREFIX timeout "${PER_FILE:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider "$f" \
    > "$RES/gpu-$name.log" 2>&1
  echo "$(date +%T) $f: exit $? | $(tail -1 "$RES/gpu-$name.log")"
done
collect
