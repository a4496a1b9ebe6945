"""Where the Gluon attention's launch spends the host's time (150-450 µs of Python a call on the H200
machines, against 40-300 µs of GPU time: docs/performance.md, "The attention's own kernels").

usage: PYTHONPATH=src python3 scripts/bench/attn_gluon_host_time.py OUT.txt [CALLS]

On 8,192 random tokens (6 heads of 128, window 6, the 64-token block mask), after a warm-up:
- µs a call of `launch_forward` and `launch_backward` with the GPU kept ahead (no sync in the loop);
- the same calls' parts timed alone: the input checks and views, the TMA descriptors (`_descriptors`), the
  output allocations, and the forward kernel's `kernel[grid](...)` with prebuilt descriptors (Triton's
  launcher: argument binding, specialisation key, descriptor encoding, the driver's launch);
- cProfile of CALLS forward and backward launches, the 30 functions with the most own time.
Writes everything to OUT.txt as well as stdout.
"""

import cProfile
import io
import math
import pstats
import sys
import time

import torch

from speedrun.kernels import attn_gluon as A
from speedrun.model.attention import block_structure, flex_block_mask

T, H, D, SCALE = 8192, 6, 128, 0.12


def per_call_us(fn, calls: int) -> float:
    """Host µs a call of fn over `calls` calls, the GPU not waited for inside the loop."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return host


def main(out: str, calls: int = 200) -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    docs = torch.cumsum((torch.rand(T, device=dev, generator=g) < 0.002).long(), 0)
    q, k, v, do = (torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16, generator=g).transpose(1, 2)
                   for _ in range(4))
    lists = A.block_lists(flex_block_mask(block_structure(docs, 128), torch.tensor(6, device=dev, dtype=torch.int32),
                                          128))
    o, lse = A.launch_forward(q, k, v, docs, lists, SCALE)
    kernel = A._build()["fwd"]
    descs, head_rows, head_cols = A._descriptors([(q, "q"), (k, "k"), (v, "v"), (o, "out")])
    kv_num, kv_idx, fkv_num, fkv_idx = lists[:4]

    def bare_forward():
        kernel[(T // A.BLOCK, H)](*descs, lse, docs, kv_num, kv_idx, fkv_num, fkv_idx, T, kv_idx.shape[1], head_rows,
                                  head_cols, SCALE * math.log2(math.e), STAGES=2, num_warps=4)

    parts = {
        "launch_forward": lambda: A.launch_forward(q, k, v, docs, lists, SCALE),
        "launch_backward": lambda: A.launch_backward(do, q, k, v, o, lse, docs, lists, SCALE),
        "check_inputs + 4 rows views": lambda: (A.check_inputs(q, k, v, docs),
                                                [A._rows_view(x, "x") for x in (q, k, v, o)]),
        "_descriptors (4)": lambda: A._descriptors([(q, "q"), (k, "k"), (v, "v"), (o, "out")]),
        "_descriptors (8)": lambda: A._descriptors([(x, "x") for x in (q, k, v, do, o, o, o, o)]),
        "outputs (_like_q + lse)": lambda: (A._like_q(q), torch.empty(1, H, T, device=dev)),
        "forward kernel[grid](...) alone": bare_forward,
    }
    lines = []
    for name, fn in parts.items():
        fn()
        lines.append(f"{name:34s} {per_call_us(fn, calls):8.1f} us a call (host)")
    for name in ("launch_forward", "launch_backward"):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            parts[name]()
        prof.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
        lines += [f"--- cProfile of {calls} x {name}, by own time", buf.getvalue()]
    text = "\n".join(lines)
    print(text)
    with open(out, "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200)
