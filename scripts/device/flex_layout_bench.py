"""FlexAttention's training forward at the record's shapes, with q, k, v laid out as the model hands them
((B, T, H, D) storage seen as (B, H, T, D)) against contiguous (B, H, T, D), and without and with autograd
(the training forward also writes the log-sum-exp).

usage: (cd scripts/device && SWEEP_T=49152 python3 flex_layout_bench.py DATA_DIR)

The twenty-eighth session's question: a profiled step has one FlexAttention forward kernel at ~270 µs a
call and another at ~530, where flex_mask_bench.py times the forward at 100-310 µs for every window.
"""

import os
import sys
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import flex_attention

from cuda_timing import median_us
from speedrun.attention import block_structure, document_ids, flex_block_mask
from speedrun.config import AttentionConfig, parse_flex_options
from speedrun.flex_tiles import use_sparse_block
from speedrun.shards import read_shard

T, H, D, BLOCK, SPARSE = int(os.environ.get("SWEEP_T", 49152)), 6, 128, 128, 64
OPTS = parse_flex_options(AttentionConfig().flex_options)


def main(data_dir: str) -> None:
    dev = torch.device("cuda")
    files = sorted(Path(data_dir).glob("fineweb_train_*.bin"))
    tokens = torch.from_numpy(read_shard(files[0])[:T].astype("int64")).to(dev)
    s = block_structure(document_ids(tokens), BLOCK)
    use_sparse_block(SPARSE, BLOCK)
    g = torch.Generator(device=dev).manual_seed(0)
    bthd = [torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3)]
    layouts = {"bthd_view": [t.transpose(1, 2) for t in bthd],
               "bhtd_contiguous": [t.transpose(1, 2).contiguous() for t in bthd]}
    fn = torch.compile(flex_attention, dynamic=False)
    for w in (3, 7, 14):
        bm = flex_block_mask(s, torch.tensor(w, dtype=torch.int32, device=dev), BLOCK, SPARSE)
        for name, (q, k, v) in layouts.items():
            for grad in (False, True):
                qq, kk, vv = (t.detach().requires_grad_(grad) for t in (q, k, v))
                call = lambda: fn(qq, kk, vv, block_mask=bm, scale=0.12, kernel_options=OPTS)  # noqa: E731
                with torch.set_grad_enabled(grad):
                    us = median_us(call)
                print(f"window {w:2d} {name:16s} grad={grad!s:5s} forward {us:7.1f} us", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
