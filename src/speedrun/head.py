"""The training head and its loss: FP8 product and soft-capped cross-entropy in one op.

`GPT.head_loss` computes sum_i CE(softcap(x_i W^T), t_i). Done as two ops
(`fp8.head_matmul`, then `softcap_ce.softcap_cross_entropy`) the
(tokens x vocabulary) tensors are swept five times per micro-step: the FP8
product writes z; the fused CE kernel reads it and writes dL/dz; its backward
reads that, multiplies by the upstream gradient and writes it again; the FP8
backward reads it once more to cast it to e5m2. At the record's 49,152 x
50,304 bfloat16 that is about 5 GB a sweep.

`fp8_softcap_ce` is one custom op for the whole head when FP8 and the Triton
kernel are both in use: its forward runs the FP8 product and the CE kernel
(z never leaves the op), and its backward folds the upstream gradient of each
row's loss into the e5m2 cast of the saved dL/dz inside the compiled FP8
backward, so the scaled gradient is never written. Same math as the two-op
path (a test holds them together), two fewer sweeps.

`head_loss` picks the path: the fused op when `use_fp8` and the CE kernel
resolves to "triton"; otherwise the two ops (each with its own reference).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from speedrun import fp8, softcap_ce


def fused_available(use_fp8: bool, x: Tensor, ce_impl: str) -> bool:
    """Does `head_loss` take the fused FP8 + CE op for these settings?"""
    return use_fp8 and softcap_ce.pick_impl(x, ce_impl) == "triton" and softcap_ce.TRITON_FOUND


def x_scale(dim: int) -> float:
    """x is RMS-normed: |x_i| <= sqrt(dim), so x / (sqrt(dim) / 448) fits e4m3, as in fp8.head_matmul."""
    return math.sqrt(dim) / 448


def head_loss(x: Tensor, w: Tensor, targets: Tensor, cap: float, form: str, ce_impl: str, use_fp8: bool) -> Tensor:
    """sum over tokens of CE(softcap(x @ w^T), targets), a float32 scalar; x (..., K), w (M, K)."""
    if not fused_available(use_fp8, x, ce_impl):
        z = fp8.head_matmul(x, w, use_fp8)
        return softcap_ce.softcap_cross_entropy(z, targets, cap, form, ce_impl)
    softcap_ce.check(form, ce_impl)
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    x_s = x_scale(x.shape[-1])
    form = "none" if not cap else form
    want_grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
    losses = torch.ops.speedrun.fp8_softcap_ce(
        flat, w.contiguous(), targets.reshape(-1), float(cap), form, x_s, fp8.W_SCALE, fp8.GRAD_SCALE, want_grad
    )[0]
    return losses.sum()


@torch.library.custom_op("speedrun::fp8_softcap_ce", mutates_args=())
def fp8_softcap_ce(
    x: Tensor, w: Tensor, targets: Tensor, cap: float, form: str, x_s: float, w_s: float, grad_s: float, want_grad: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row losses (N,) float32, dL_i/dz (N, M) bfloat16 ((0,) without want_grad), and the FP8 operands."""
    z, x_f8, w_f8 = fp8._compiled(fp8._forward_impl, x)(x, w, x_s, w_s)
    losses, grad = softcap_ce.launch(z, targets, cap, form, want_grad)
    return losses, grad, x_f8, w_f8


@fp8_softcap_ce.register_fake
def _(x, w, targets, cap, form, x_s, w_s, grad_s, want_grad):
    N, M = x.shape[0], w.shape[0]
    losses = x.new_empty((N,), dtype=torch.float32)
    grad = x.new_empty((N, M) if want_grad else (0,), dtype=torch.bfloat16)
    return losses, grad, x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)


def _setup_context(ctx, inputs, output):
    _, grad, x_f8, w_f8 = output
    ctx.mark_non_differentiable(grad, x_f8, w_f8)
    ctx.save_for_backward(grad, x_f8, w_f8)
    ctx.scales = inputs[5:8]
    ctx.want_grad = inputs[8]


def _backward(ctx, g_losses, *_):
    if not ctx.want_grad:
        raise RuntimeError("fp8_softcap_ce: the forward ran without a gradient (no grad mode or no input required grad)")
    grad, x_f8, w_f8 = ctx.saved_tensors
    grad_x, grad_w = torch.ops.speedrun.fp8_mm_backward_rows(grad, g_losses, x_f8, w_f8, *ctx.scales)
    return grad_x, grad_w, None, None, None, None, None, None, None


fp8_softcap_ce.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("speedrun::fp8_mm_backward_rows", mutates_args=())
def fp8_mm_backward_rows(
    g: Tensor, rows: Tensor, x_f8: Tensor, w_f8: Tensor, x_s: float, w_s: float, grad_s: float
) -> tuple[Tensor, Tensor]:
    """The FP8 backward for upstream gradient g * rows[:, None]."""
    return fp8._compiled(fp8._backward_impl, g)(g.contiguous(), x_f8, w_f8, x_s, w_s, grad_s, rows.contiguous())


@fp8_mm_backward_rows.register_fake
def _(g, rows, x_f8, w_f8, *_):
    grad_x = x_f8.new_empty(x_f8.shape, dtype=torch.bfloat16)
    grad_w = w_f8.new_empty((w_f8.shape[1], w_f8.shape[0]), dtype=torch.float32).T  # same strides as the op
    return grad_x, grad_w
