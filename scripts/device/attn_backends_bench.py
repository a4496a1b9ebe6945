"""FlexAttention (the model's block-window mask) against torch's varlen_attn (FlashAttention, token window).

usage: (cd scripts/device && python3 attn_backends_bench.py DATA_DIR OUT_JSON)

Issue 4 names `torch.nn.attention.varlen.varlen_attn` (torch >= 2.10, FlashAttention's variable-length
kernels with a sliding `window_size`) as an alternative to FlexAttention for the document-masked
windows. They do not compute the same function: the record's window is counted in 128-token key
blocks (`attention.py`), varlen_attn's in tokens, so a query sees between (W-1)*128+1 and W*128 keys
of its document under the block rule and exactly min(W*128, its position in the document) under
(W*128 - 1, 0). The timing compares the two kernels at the same shapes and about the same work.

Documents: the first 49,152 tokens of the validation shard (DATA_DIR/fineweb_val_000000.bin), one
sequence of 6 heads x 128 dims, bfloat16. Windows as flex_sweep.py: long 3, 7, 14 blocks and their
halves; the per-step estimate weighs them as the record's layers do (3 long, 8 short, 8 micro-steps).
Forward and forward + backward, CUDA events, median of 20 after 3 warm-ups.
"""

import json
import sys
import time
from pathlib import Path

import torch

from cuda_timing import median_us
from speedrun.attention import block_structure, document_ids, flex_attention, flex_block_mask
from speedrun.config import AttentionConfig, parse_flex_options
from speedrun.shards import read_shard

T, H, D, BLOCK = 49152, 6, 128, 128
WINDOWS = (3, 7, 14)
SCALE = 0.12


def main(data_dir, out):
    dev = torch.device("cuda")
    tokens = torch.from_numpy(read_shard(Path(data_dir) / "fineweb_val_000000.bin")[:T].astype("int64")).to(dev)
    docs = document_ids(tokens)
    starts = torch.nonzero(torch.diff(docs, prepend=docs[:1] - 1)).flatten()
    cu = torch.cat((starts, torch.tensor([T], device=dev))).to(torch.int32)
    max_len = int((cu[1:] - cu[:-1]).max())
    s = block_structure(docs, BLOCK)
    opts = parse_flex_options(AttentionConfig().flex_options)
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3))
    dout = torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16, generator=g)
    result = {"documents": int(cu.numel() - 1), "max_doc_len": max_len, "flex_options": opts, "rows": {}}
    from torch.nn.attention.varlen import varlen_attn

    def flex(wb):
        mask = flex_block_mask(s, torch.tensor(wb, dtype=torch.int32, device=dev), BLOCK)
        return lambda: flex_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, SCALE,
                                      opts).transpose(1, 2)

    def varlen(wb):
        return lambda: varlen_attn(q[0], k[0], v[0], cu, cu, max_len, max_len, scale=SCALE,
                                   window_size=(wb * BLOCK - 1, 0))[None]

    for name, make in (("flex", flex), ("varlen", varlen)):
        row = {}
        try:
            t0 = time.time()
            for w in WINDOWS:
                for wb in (w, max(w // 2, 1)):
                    fwd = make(wb)
                    both = lambda: torch.autograd.grad(fwd(), (q, k, v), dout)
                    both()
                    with torch.no_grad():
                        row[f"fwd_us_w{wb}"] = median_us(fwd)
                    row[f"fwd_bwd_us_w{wb}"] = median_us(both)
            row["seconds"] = time.time() - t0
            per = lambda key: sum(3 * row[f"{key}_w{w}"] + 8 * row[f"{key}_w{max(w // 2, 1)}"] for w in WINDOWS) / 3
            row["step_ms_fwd"] = 8 * per("fwd_us") / 1000
            row["step_ms_fwd_bwd"] = 8 * per("fwd_bwd_us") / 1000
        except Exception as e:  # record and go on
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        result["rows"][name] = row
        print(name, {k: (round(x, 1) if isinstance(x, float) else x) for k, x in row.items()}, flush=True)
        Path(out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
