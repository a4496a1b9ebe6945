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
