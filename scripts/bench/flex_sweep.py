"""Sweep FlexAttention kernel options on the record's attention shapes (one GPU).

usage: (cd scripts/bench && python3 flex_sweep.py DATA_DIR OUT_JSON)

q, k, v: (1, 6, 49152, 128) bfloat16; block masks from the documents of the
first 49,152 tokens of the first training shard, at long windows of 3, 7 and
14 blocks with the short window (half) beside each. Each option set is
compiled on its own (torch.compile of flex_attention with kernel_options),
timed forward and forward+backward with CUDA events (median of 20), and
checked against the default options' output (max abs difference of out and
of the three gradients). The per-step estimate weighs the windows as the
record's layers use them: 3 long and 8 short attention layers, 8 micro-steps.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import flex_attention

from cuda_timing import median_us
from speedrun.model.attention import block_structure, document_ids, flex_block_mask
from speedrun.data.shards import read_shard

T, H, D = int(os.environ.get("SWEEP_T", 49152)), 6, 128
WINDOWS = (3, 7, 14)
CANDIDATES = {
    "default": {},
    "fwd_tma": {"fwd_USE_TMA": True},
    "fwd_128x128_w8_s2": {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 128, "fwd_num_warps": 8, "fwd_num_stages": 2},
    "fwd_64x64_w4_s3": {"fwd_BLOCK_M": 64, "fwd_BLOCK_N": 64, "fwd_num_warps": 4, "fwd_num_stages": 3},
    "fwd_128x64_w4_s3": {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64, "fwd_num_warps": 4, "fwd_num_stages": 3},
    "bwd_64x64_w4_s3": {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 64,
                        "bwd_num_warps": 4, "bwd_num_stages": 3},
    "bwd_64x128_w8_s2": {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128, "bwd_BLOCK_N2": 64,
                         "bwd_num_warps": 8, "bwd_num_stages": 2},
    "bwd_32x128_w4_s3": {"bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128, "bwd_BLOCK_N2": 32,
                         "bwd_num_warps": 4, "bwd_num_stages": 3},
    "bwd_64x64_w4_s4": {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 64,
                        "bwd_num_warps": 4, "bwd_num_stages": 4},
    "rows_safe": {"ROWS_GUARANTEED_SAFE": True},
}


def timed(fn):
    if not torch.cuda.is_available():  # a CPU smoke test of this script (SWEEP_T=1024)
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    return median_us(fn)


def main(data_dir: str, out: str) -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    files = sorted(Path(data_dir).glob("fineweb_train_*.bin"))
    tokens = torch.from_numpy(read_shard(files[0])[:T].astype("int64")).to(dev)
    s = block_structure(document_ids(tokens), 128)
    masks = {}
    for w in WINDOWS:
        for wb in (w, max(w // 2, 1)):
            masks[wb] = flex_block_mask(s, torch.tensor(wb, dtype=torch.int32, device=dev), 128)
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(1, H, T, D, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3))
    dout = torch.randn(1, H, T, D, device=dev, dtype=torch.bfloat16, generator=g)
    results, ref = {}, {}
    for name, opts in CANDIDATES.items():
        torch._dynamo.reset()
        fn = torch.compile(flex_attention, dynamic=False)
        row = {"options": opts}
        try:
            t0 = time.time()
            for wb, bm in masks.items():
                o = fn(q, k, v, block_mask=bm, scale=0.12, kernel_options=dict(opts) or None)
                grads = torch.autograd.grad(o, (q, k, v), dout)
                vals = (o, *grads)
                if name == "default":
                    ref[wb] = [t.detach() for t in vals]
                row[f"max_abs_diff_w{wb}"] = max((a.float() - b.float()).abs().max().item() for a, b in zip(vals, ref[wb]))
            row["compile_s"] = time.time() - t0
            for wb, bm in masks.items():
                fwd = lambda: fn(q, k, v, block_mask=bm, scale=0.12, kernel_options=dict(opts) or None)
                both = lambda: torch.autograd.grad(fwd(), (q, k, v), dout)
                with torch.no_grad():
                    row[f"fwd_us_w{wb}"] = timed(fwd)
                row[f"fwd_bwd_us_w{wb}"] = timed(both)
            per = lambda key: sum(3 * row[f"{key}_w{w}"] + 8 * row[f"{key}_w{max(w // 2, 1)}"] for w in WINDOWS) / len(WINDOWS)
            row["step_ms_fwd"] = 8 * per("fwd_us") / 1000
            row["step_ms_fwd_bwd"] = 8 * per("fwd_bwd_us") / 1000
        except Exception as e:  # an option set the template refuses: record and go on
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        results[name] = row
        print(name, {k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items() if k != "options"}, flush=True)
        Path(out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
