"""Time the head's memory-bound passes at the record's shape (one GPU): the CE kernel's grids, the e5m2 transpose.

usage: python3 scripts/device/head_bench.py OUT_JSON [PARTS]   (PARTS: comma-separated, default ce,transpose,backward)

1. The soft-capped CE kernel with the e5m2 gradient, as the fused head launches it, on (49152, 50304)
   bfloat16 logits, for `softcap_ce.KERNEL_CONFIG` variants: one program per row (programs_per_sm 0,
   the old launch) against a persistent grid of programs_per_sm x SMs programs looping over rows.
   The idea: with few programs in flight the row a program has just summed (100 KB) is still in L2
   when its gradient pass reads it again, so z comes from HBM once instead of twice. Measured
   slower in every variant (docs/benchmarks.md), so the persistent loop is not in softcap_ce.py;
   the sweep needs docs/runs/2026-11-30-h200-g/persistent-ce-grid.patch applied (without it,
   programs_per_sm is ignored and those rows repeat the per-row launch).
2. The transposed e5m2 copy grad_w's product needs (`g.T.contiguous()`), eager and compiled, against
   the tile kernel of `speedrun.transpose` at 18 tile sizes and warp counts (this session wrote that
   module from the winner; its first version lived in this script).
3. The head's backward with that copy on a side stream, beside grad_x's product, against one stream.
CUDA events, median of 20 after 3 warm-up calls; every variant's outputs are compared with the first's.
"""

import itertools
import json
import sys

import torch
from cuda_timing import median_us
from speedrun import softcap_ce as sc

N, V = 49152, 50304


def ce_rows(z, t):
    rows, ref = [], None
    for block, warps, per_sm in itertools.product((2048, 4096), (4, 8, 16), (0, 1, 2, 3, 4, 6, 8)):
        sc.KERNEL_CONFIG.update(BLOCK_V=block, num_warps=warps, programs_per_sm=per_sm)
        run = lambda: sc.launch(z, t, 30.0, "sigmoid", True, torch.float8_e5m2, 448.0)
        losses, grad = run()
        if ref is None:
            ref = (losses.clone(), grad.view(torch.uint8).clone())
        row = {"BLOCK_V": block, "num_warps": warps, "programs_per_sm": per_sm,
               "loss_equal": bool(torch.equal(losses, ref[0])),
               "grad_equal": bool(torch.equal(grad.view(torch.uint8), ref[1])),
               "train_us": median_us(run)}
        rows.append(row)
        print(row, flush=True)
        del losses, grad
    return rows


def hand_transpose(g, bm, bn, warps):
    from speedrun import transpose

    transpose.KERNEL_CONFIG.update(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
    return transpose.transpose_copy(g, "triton")


def transpose_rows(g):
    ref = g.T.contiguous().view(torch.uint8)
    compiled = torch.compile(lambda a: a.T.contiguous())
    rows = []
    cases = [("eager", lambda: g.T.contiguous()), ("compiled", lambda: compiled(g))]
    for bm, bn, warps in itertools.product((64, 128, 256), (64, 128, 256), (4, 8)):
        cases.append((f"hand {bm}x{bn} w{warps}", lambda bm=bm, bn=bn, w=warps: hand_transpose(g, bm, bn, w)))
    from speedrun import transpose

    default = dict(transpose.KERNEL_CONFIG)
    for name, fn in cases:
        row = {"name": name, "equal": bool(torch.equal(fn().view(torch.uint8), ref)), "us": median_us(fn)}
        rows.append(row)
        print(row, flush=True)
    transpose.KERNEL_CONFIG.update(default)
    return rows


def backward_rows(g8):
    """The head's backward: transposed copy, then grad_x's and grad_w's products, one stream against
    the copy on a side stream beside grad_x's product (memory-bound beside compute-bound)."""
    from speedrun import fp8
    from speedrun.transpose import transpose_copy

    gen = torch.Generator(device="cuda").manual_seed(1)
    x8 = torch.randn(N, 768, device="cuda", generator=gen).clamp(-3, 3).to(torch.float8_e4m3fn)
    w8 = (torch.randn(V, 768, device="cuda", generator=gen) * 0.05 / fp8.W_SCALE).to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    side = torch.cuda.Stream()

    def products(gt):
        gx = torch._scaled_mm(g8, w8.T.contiguous().T, out_dtype=torch.bfloat16, scale_a=one, scale_b=one)
        return gx, gt

    def grad_w(gt):
        return torch._scaled_mm(x8.T.contiguous(), gt.T, out_dtype=torch.float32, scale_a=one, scale_b=one)

    def serial():
        gt = transpose_copy(g8)
        gx, _ = products(gt)
        return gx, grad_w(gt)

    def overlapped():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            gt = transpose_copy(g8)
        gx, _ = products(None)
        torch.cuda.current_stream().wait_stream(side)
        gt.record_stream(torch.cuda.current_stream())
        return gx, grad_w(gt)

    a, b = serial(), overlapped()
    rows = [{"name": "transpose only", "us": median_us(lambda: transpose_copy(g8))},
            {"name": "grad_x product only", "us": median_us(lambda: products(None))},
            {"name": "serial", "us": median_us(serial)},
            {"name": "overlapped", "us": median_us(overlapped),
             "equal": bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))}]
    for row in rows:
        print(row, flush=True)
    return rows


def main(out: str, parts: str = "ce,transpose,backward") -> None:
    parts = parts.split(",")
    g = torch.Generator(device="cuda").manual_seed(0)
    z = (torch.randn(N, V, device="cuda", generator=g) * 4).to(torch.bfloat16)
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    result = {"device": torch.cuda.get_device_name()}
    if "ce" in parts:
        result["ce"] = ce_rows(z, t)
        result["ce_best"] = min(result["ce"], key=lambda r: r["train_us"])
        print("best CE", result["ce_best"], flush=True)
    _, grad = sc.launch(z, t, 30.0, "sigmoid", True, torch.float8_e5m2, 448.0)
    del z
    if "transpose" in parts:
        result["transpose"] = transpose_rows(grad)
    if "backward" in parts:
        result["backward"] = backward_rows(grad)
    json.dump(result, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
