"""FlexAttention's kernel options on the model's 64-token block mask.

usage: (cd scripts/bench && [SWEEP_SET=tiles|options] python3 flex_mask_bench.py DATA_DIR OUT_JSON)

The model hands FlexAttention a mask of 64-token blocks (`attention.MASK_BLOCK`): the window is
chosen among 128-token blocks, but sub-blocks no query can see are dropped and those wholly visible
run without the mask function; the tiles must divide those blocks. This bench chose the model's tiles
(`flex_tiles.FLEX_OPTIONS`; against torch's defaults on the 128-token mask, 72dcb66). It times the
record's shapes, q, k, v (1, 6, 49152, 128) bfloat16, with the documents of the first 49,152 tokens of
the first training shard, at every long window of a run (1..14 blocks; the short windows, half, are
among them). Per option set: compiled once (torch.compile of flex_attention with its kernel options),
forward and forward + backward timed per window (CUDA events, median of 20 after 3 warm-ups), outputs
and gradients compared with the first set's (the model's options). The per-step estimate weighs the
windows as a run does: each long window equally often, 3 long and 8 short layers, 8 micro-steps.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import flex_attention

from cuda_timing import median_us
from speedrun.model.attention import MASK_BLOCK, block_structure, document_ids, flex_block_mask, refined_blocks
from speedrun.kernels.flex_tiles import FLEX_OPTIONS, use_sparse_block
from speedrun.data.shards import read_shard

T, H, D, BLOCK = int(os.environ.get("SWEEP_T", 49152)), 6, 128, 128
WINDOWS = range(1, int(os.environ.get("SWEEP_WINDOWS", 14)) + 1)
MODEL = FLEX_OPTIONS


def bwd(m1, n1, m2, n2, warps, stages):
    return {"bwd_BLOCK_M1": m1, "bwd_BLOCK_N1": n1, "bwd_BLOCK_M2": m2, "bwd_BLOCK_N2": n2,
            "bwd_num_warps": warps, "bwd_num_stages": stages}


# (name, options); the first, the model's, is the reference the others are compared with. Inductor reads
# its tile heuristics once per thread (the backward compiles on autograd's device thread), so the
# fine-block heuristics are installed before the first compile (main). The backward tiles around the
# model's (32, 64, 64, 32, 4 warps, 4 stages), as swept for 72dcb66:
TILES = [
    ("s64_model", dict(MODEL)),
    ("s64_b64_w4_s3", {**MODEL, **bwd(64, 64, 64, 64, 4, 3)}),
    ("s64_b64_w8_s3", {**MODEL, **bwd(64, 64, 64, 64, 8, 3)}),
    ("s64_b64_w4_s2", {**MODEL, **bwd(64, 64, 64, 64, 4, 2)}),
    ("s64_b64_w4_s4", {**MODEL, **bwd(64, 64, 64, 64, 4, 4)}),
    ("s64_b32_w4_s3", {**MODEL, **bwd(32, 64, 64, 32, 4, 3)}),
    ("s64_fwd_w4_s2", {**MODEL, "fwd_num_stages": 2, **bwd(64, 64, 64, 64, 4, 3)}),
]
# The sweep of 2026-12-01 (`a400599`) around the model's options: the kernel flags that keep the function
# (every row sees its own token, so ROWS_GUARANTEED_SAFE holds; USE_TMA only changes how tiles are loaded)
# and neighbours of the chosen tiles.
OPTIONS = [
    ("s64_model", dict(MODEL)),
    ("s64_rows_safe", {**MODEL, "ROWS_GUARANTEED_SAFE": True}),
    ("s64_tma", {**MODEL, "USE_TMA": True}),
    ("s64_rows_safe_tma", {**MODEL, "ROWS_GUARANTEED_SAFE": True, "USE_TMA": True}),
    ("s64_b16_w4_s4", {**MODEL, **bwd(16, 64, 64, 16, 4, 4)}),
    ("s64_b32_w4_s5", {**MODEL, **bwd(32, 64, 64, 32, 4, 5)}),
    ("s64_fwd_w8_s3", {**MODEL, "fwd_num_warps": 8}),
    ("s64_fwd_w4_s4", {**MODEL, "fwd_num_stages": 4}),
]
CANDIDATES = {"tiles": TILES, "options": OPTIONS}[os.environ.get("SWEEP_SET", "tiles")]


def timed(fn) -> float:
    if not torch.cuda.is_available():  # a CPU smoke test of this script (SWEEP_T=2048 SWEEP_WINDOWS=3)
        fn()
        return 0.0
    return median_us(fn)


def tile_counts(s, w):
    p, f = refined_blocks(s, torch.tensor(w, device=s.docs.device), BLOCK, MASK_BLOCK)
    return {"partial_64x64": p.sum().item(), "full_64x64": f.sum().item()}


def main(data_dir: str, out: str) -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    files = sorted(Path(data_dir).glob("fineweb_train_*.bin"))
    tokens = torch.from_numpy(read_shard(files[0])[:T].astype("int64")).to(dev)
    s = block_structure(document_ids(tokens), BLOCK)
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(1, H, T, D, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3))
    dout = torch.randn(1, H, T, D, device=dev, dtype=torch.bfloat16, generator=g)
    results = {"tiles": {w: tile_counts(s, w) for w in WINDOWS}}
    ref = {}
    use_sparse_block(MASK_BLOCK, BLOCK)
    masks = {w: flex_block_mask(s, torch.tensor(w, dtype=torch.int32, device=dev), BLOCK) for w in WINDOWS}
    for name, opts in CANDIDATES:
        torch._dynamo.reset()
        fn = torch.compile(flex_attention, dynamic=False)
        row = {"options": opts}
        try:
            t0 = time.time()
            worst = 0.0
            for w, bm in masks.items():
                o = fn(q, k, v, block_mask=bm, scale=0.12, kernel_options=opts)
                vals = [t.detach() for t in (o, *torch.autograd.grad(o, (q, k, v), dout))]
                if not ref.get(w):
                    ref[w] = vals
                worst = max(worst, max(((a.float() - b.float()).abs().max().item() for a, b in zip(vals, ref[w]))))
            row["max_abs_diff_vs_first"] = worst
            row["compile_s"] = time.time() - t0
            for w, bm in masks.items():
                fwd = lambda: fn(q, k, v, block_mask=bm, scale=0.12, kernel_options=opts)  # noqa: E731
                both = lambda: torch.autograd.grad(fwd(), (q, k, v), dout)  # noqa: E731
                with torch.no_grad():
                    row[f"fwd_us_w{w}"] = timed(fwd)
                row[f"fwd_bwd_us_w{w}"] = timed(both)
            per = lambda key: sum(3 * row[f"{key}_w{w}"] + 8 * row[f"{key}_w{max(w // 2, 1)}"]  # noqa: E731
                                  for w in WINDOWS) / len(WINDOWS)
            row["step_ms_fwd"] = 8 * per("fwd_us") / 1000
            row["step_ms_fwd_bwd"] = 8 * per("fwd_bwd_us") / 1000
        except Exception as e:  # an option set the template refuses: record it and go on
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        results[name] = row
        print(name, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                     if k in ("compile_s", "max_abs_diff_vs_first", "step_ms_fwd", "step_ms_fwd_bwd", "error")},
              flush=True)
        Path(out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
