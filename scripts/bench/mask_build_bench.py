"""The block masks of one micro-step (AttentionMasks: the block structure and the long and short
FlexAttention masks at 64-token blocks), compiled on the GPU as the model compiles them; checked
against the same code run eagerly and timed (CUDA events, median of 20; launch gaps included, which
the training step hides). Run it with PYTHONPATH naming the sources to time (e.g. an older tree).
usage: (cd scripts/bench && python3 mask_build_bench.py DATA_DIR OUT_JSON)"""
import json
import sys
import time
from pathlib import Path

import torch

from cuda_timing import median_us
from speedrun.model import attention
from speedrun.data.shards import read_shard

FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
          "full_q_num_blocks", "full_q_indices")


def build(tokens, long_blocks, short_blocks):
    m = attention.AttentionMasks(attention.document_ids(tokens), long_blocks, short_blocks, 128, "flex")
    return [getattr(bm, f) for bm in (m.long, m.short) for f in FIELDS]


def used(fields):
    """Each list cut to its count (what FlexAttention reads)."""
    out = []
    for i in range(0, len(fields), 2):
        num, idx = fields[i][0, 0], fields[i + 1][0, 0]
        out.append([row[:n].tolist() for row, n in zip(idx, num.tolist())])
    return out


def main(data_dir, out):
    dev = torch.device("cuda")
    files = sorted(Path(data_dir).glob("fineweb_train_*.bin"))
    tokens = torch.from_numpy(read_shard(files[0])[:49152].astype("int64")).to(dev)
    long_b, short_b = (torch.tensor(w, device=dev, dtype=torch.int32) for w in (13, 6))
    c = torch.compile(build, fullgraph=True, dynamic=False)
    try:
        t0 = time.time()
        got = c(tokens, long_b, short_b)
        torch.cuda.synchronize()
        row = {"source": attention.__file__, "compile_s": round(time.time() - t0, 2),
               "equal_to_eager": used(got) == used(build(tokens, long_b, short_b)),
               "us": median_us(lambda: c(tokens, long_b, short_b))}
    except Exception as e:
        row = {"source": attention.__file__, "error": f"{type(e).__name__}: {' | '.join(str(e).splitlines()[:4])[:600]}"}
    print(row, flush=True)
    Path(out).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
