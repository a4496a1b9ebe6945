"""Transposed copies of one-byte matrices (the head's e5m2 gradient), with a Triton tile kernel.

On Hopper both operands of an FP8 matrix product must have the reduced
dimension contiguous. grad_w = g^T x reduces over tokens, and the CE kernel
writes the e5m2 gradient g (tokens x vocabulary) with the vocabulary
contiguous, so the head's backward needs g^T as its own (vocabulary x
tokens) copy: 2.47 GB read and written per 49,152-token micro-step. On a
Hopper GPU the record's head gets g^T from the CE's gradient pass itself
(`ce_grad_gluon`); this copy serves the other GPUs and soft-cap forms.

Measured on an H200 at that size (scripts/device/head_bench.py at c3a2675,
docs/performance.md): eager `g.T.contiguous()` 15.7 ms; Inductor's kernel for
the same expression, which the compiled backward used, 1.97 ms; this kernel
(64 x 128 tiles, 8 warps) 1.27 ms, about 3.9 TB/s of reads and writes. The
tile is loaded with its rows' 128 bytes contiguous, transposed in registers
and shared memory by Triton (`tl.trans`), and stored with 64-byte runs.

`transpose_copy(a, impl)` returns `a.T.contiguous()`; "torch" is that
expression (the reference), "triton" the kernel (CUDA, or a CPU under
TRITON_INTERPRET=1), "auto" as `kernel_choice` says. Bytes are copied, never
converted, so the two are bit-equal (tested).
"""

from __future__ import annotations

import torch
from torch import Tensor

from speedrun.kernels.choice import TRITON_FOUND, built_once, pick_impl

KERNEL_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 8}

triton = tl = None  # set by built_once on first use
_transpose_kernel = None


@built_once
def _build_kernel(interpreted: bool):
    """Define the kernel (once, `built_once`); interpreted: TRITON_INTERPRET=1 now."""
    global _transpose_kernel  # module globals: the interpreter re-executes the source with them

    @triton.jit
    def _transpose_kernel(X, Y, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """Y (N, M) = X (M, N)^T for one (BLOCK_M x BLOCK_N) tile of X; int64 offsets (M x N > 2^31)."""
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ok = (rm[:, None] < M) & (rn[None, :] < N)
        x = tl.load(X + rm[:, None].to(tl.int64) * N + rn[None, :], mask=ok)
        tl.store(Y + rn[:, None].to(tl.int64) * M + rm[None, :], tl.trans(x), mask=tl.trans(ok))

    return _transpose_kernel


def transpose_copy(a: Tensor, impl: str = "auto") -> Tensor:
    """a.T.contiguous() for a 2-D tensor of one-byte elements (float8, int8, uint8)."""
    if a.dim() != 2 or a.element_size() != 1:
        raise ValueError(f"transpose_copy takes a 2-D tensor of one-byte elements, got {tuple(a.shape)} {a.dtype}")
    if pick_impl(a, impl) == "torch":
        return a.T.contiguous()
    if not TRITON_FOUND:
        raise RuntimeError("transpose_copy impl='triton' needs Triton installed")
    kernel = _build_kernel()
    x = a.contiguous().view(torch.uint8)
    M, N = x.shape
    y = torch.empty((N, M), dtype=torch.uint8, device=x.device)
    if x.numel():
        cfg = KERNEL_CONFIG
        grid = (triton.cdiv(M, cfg["BLOCK_M"]), triton.cdiv(N, cfg["BLOCK_N"]))
        kernel[grid](x, y, M, N, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], num_warps=cfg["num_warps"])
    return y.view(a.dtype)
