"""grad_w of the FP8 head without the transposed e5m2 copy: Triton kernels against copy + cuBLAS.

usage: python3 scripts/device/head_gradw_bench.py OUT_JSON

The head's backward now makes g^T (vocabulary x tokens, 2.47 GB at the record's size) so that cuBLAS's
FP8 product for grad_w = g^T x has the tokens contiguous in both operands (Hopper's FP8 wgmma reads
only K-major operands from shared memory): 1.28 ms for the copy + ~2.5 ms for the product per
micro-step. Here a Triton kernel reads g as the CE kernel wrote it (tokens x vocabulary) and lets
Triton transpose each 8-bit tile on its way to shared memory. Variants: output tile (BV vocabulary x
BD model columns), token step BT, warps, stages, and the accumulation (PRECISE 1: a fresh wgmma chain
per token step added to the float32 accumulator, as cuBLAS without fast accumulation promotes; 0: one
chain). Each is timed (CUDA events, median of 10) and compared with the reference's float32 result.
"""

import itertools
import json
import sys

import torch
import triton
import triton.language as tl
from cuda_timing import median_us
from triton.tools.tensor_descriptor import TensorDescriptor

from speedrun import fp8, head, transpose

N, V, D = 49152, 50304, 768


@triton.jit
def gw_kernel(g_desc, xt_desc, out_ptr, scale_ptr, T, V, D,
              BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, PRECISE: tl.constexpr):
    pid = tl.program_id(0)
    num_d = tl.cdiv(D, BLOCK_D)
    off_v = (pid // num_d) * BLOCK_V
    off_d = (pid % num_d) * BLOCK_D
    acc = tl.zeros((BLOCK_V, BLOCK_D), tl.float32)
    for t in range(0, T, BLOCK_T):
        g = g_desc.load([t, off_v])
        xt = xt_desc.load([off_d, t])
        if PRECISE:
            acc += tl.dot(g.T, xt.T)
        else:
            acc = tl.dot(g.T, xt.T, acc)
    acc = acc * tl.load(scale_ptr)
    rv = off_v + tl.arange(0, BLOCK_V)
    rd = off_d + tl.arange(0, BLOCK_D)
    # grad_w stored (D, V) row-major, as the op returns it (a transposed view of (V, D))
    tl.store(out_ptr + rd[None, :].to(tl.int64) * V + rv[:, None], acc, mask=(rv[:, None] < V) & (rd[None, :] < D))


def launch(g, xt, out, scale, bv, bd, bt, precise, warps, stages):
    g_desc = TensorDescriptor.from_tensor(g, [bt, bv])
    xt_desc = TensorDescriptor.from_tensor(xt, [bd, bt])
    grid = (triton.cdiv(V, bv) * triton.cdiv(D, bd),)
    gw_kernel[grid](g_desc, xt_desc, out, scale, N, V, D, BLOCK_V=bv, BLOCK_D=bd, BLOCK_T=bt, PRECISE=precise,
                    num_warps=warps, num_stages=stages)


def main(path):
    torch.manual_seed(0)
    g = (torch.randn(N, V, device="cuda") * 0.05).to(torch.float8_e5m2)
    x = torch.randn(N, D, device="cuda", dtype=torch.bfloat16)
    x_s = head.x_scale(D)
    x_f8 = x.div(x_s).to(torch.float8_e4m3fn)
    up = torch.tensor(1.0, device="cuda")
    grad_s = fp8.GRAD_SCALE

    def ref():
        gt = transpose.transpose_copy(g)
        return fp8.grad_w_prequantized(gt, up, x_f8, x_s, grad_s)

    want = ref()
    rows = [{"name": "copy+cublas", "us": median_us(ref, reps=10)},
            {"name": "copy", "us": median_us(lambda: transpose.transpose_copy(g), reps=10)}]
    gt = transpose.transpose_copy(g)
    rows.append({"name": "cublas", "us": median_us(lambda: fp8.grad_w_prequantized(gt, up, x_f8, x_s, grad_s), reps=10)})
    del gt
    print(rows, flush=True)
    xt = x_f8.T.contiguous()
    scale = torch.full((), x_s * grad_s, device="cuda")
    out = torch.empty(D, V, device="cuda", dtype=torch.float32)
    scale_ref = want.abs().max().item()
    for bv, bd, bt, precise, warps, stages in [
            (128, 128, 128, 1, 8, 3), (128, 128, 128, 1, 8, 4), (128, 128, 64, 1, 8, 5),
            (128, 128, 64, 1, 4, 5), (128, 256, 128, 0, 8, 3), (128, 256, 128, 0, 8, 4),
            (128, 256, 64, 0, 8, 5), (64, 128, 128, 1, 4, 4)]:
        row = {"BV": bv, "BD": bd, "BT": bt, "precise": precise, "warps": warps, "stages": stages}
        try:
            fn = lambda: launch(g, xt, out, scale, bv, bd, bt, precise, warps, stages)
            fn()
            torch.cuda.synchronize()
            row["rel_err"] = ((out.T - want).abs().max().item()) / scale_ref
            row["us"] = median_us(fn, reps=10)
        except Exception as e:  # noqa: BLE001 - a variant that does not compile or fit is reported
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        print(row, flush=True)
        rows.append(row)
    json.dump(rows, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
