# Sourced by the device scripts: environment, proxy corpus, results folder.
# NVLink multicast stays off (shared hosts); Python output unbuffered.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
RES=/tmp/speedrun-results
mkdir -p "$RES"
unpack_proxy() {
  (cd .proxy && for f in *.xz; do [ -f "${f%.xz}" ] || xz -dk "$f" & done; wait)
}
collect() {  # tar the small files of every run under /tmp/runs into $OUT
  (cd /tmp && tar czf "$OUT/results.tar.gz" --exclude='*.safetensors' --exclude='checkpoints' runs speedrun-results 2>/dev/null)
}
follow() {  # follow SECONDS "DONE FILES" "LOG FILES": wait until every done file exists or SECONDS pass,
  # print the logs and each run's last metrics line; succeeds when all are done
  local end=$(( $(date +%s) + $1 )) f all
  all() { for f in $2; do [ -e "$f" ] || return 1; done; }
  while [ "$(date +%s)" -lt "$end" ] && ! all "$@"; do sleep 5; done
  cat $3 2>/dev/null
  for f in /tmp/runs/*/metrics.jsonl; do [ -f "$f" ] && echo "$f: $(tail -1 "$f" | cut -c1-160)"; done
  all "$@"
}
