"""The training head and its loss: FP8 product and soft-capped cross-entropy in one op.

`GPT.head_loss` computes sum_i CE(softcap(x_i W^T), t_i). Done as two ops
(`fp8.head_matmul`, then `softcap_ce.softcap_cross_entropy`) the
(tokens x vocabulary) tensors are swept five times per micro-step: the FP8
product writes z; the fused CE kernel reads it and writes dL/dz; its backward
reads that, multiplies by the upstream gradient and writes it again; the FP8
backward reads it once more to cast it to e5m2. At the record's 49,152 x
50,304 bfloat16 that is about 5 GB a sweep.

`fp8_softcap_ce` is one custom op for the whole head when FP8 and the Triton
kernel are both in use. Its forward runs the FP8 product and the CE kernel
(z never leaves the op), and the CE kernel writes dL/dz already divided by
the gradient's scale and cast to e5m2: the backward's FP8 operand, one byte
an element, so no bfloat16 gradient is written or read again. The op returns
the *summed* loss, so its upstream gradient is one scalar g, and
(dL/dz * g) / grad_s in e5m2 becomes (dL/dz / grad_s) in e5m2 with g folded
into the FP8 products' scale. The backward then only runs the two products
(grad_w's from the transposed gradient: see below for who writes it). Same
equations as the two-op path (a test holds them together); the roundings
differ: one e5m2 rounding of the float32 gradient instead of bfloat16
roundings of dL/dz * g before it.

`head_loss` picks the path: the fused op when `use_fp8` and the CE kernel
resolves to "triton"; otherwise the two ops (each with its own reference).
Inside the fused op the forward product is `head_gluon`'s on a capability-9.0
GPU (`use_gluon`): the same z as cuBLAS's, and the lean CE kernel's row sums
with it, so that the CE kernel makes one pass over z, not two (599.4 -> 595.0 /
595.9 ms a step in full runs on one H200, 2c51899, 2026-12-01). Elsewhere, or
where the Gluon kernel does not compile, it is cuBLAS's (`torch._scaled_mm`),
which stays the reference the Gluon kernel is held to in the tests. Where the
lean CE kernel applies (the record's sigmoid form) the forward also hands over
the transposed e5m2 gradient (`softcap_ce.launch_transposed`: on Hopper GPUs
written by the CE's gradient pass itself, `ce_grad_gluon`; elsewhere the
transposed copy); for the other forms the backward makes the copy
(`transpose.transpose_copy`).

The weight's FP8 operands (w / w_s in e4m3 and its transposed copy for grad_x)
depend on the weight alone; `quantize_weight` makes them apart, and the op
takes them as w_q, w_qt instead of making them in each micro-step
(once a step, by the trainer).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from speedrun.kernels import fp8

from speedrun.kernels import head_gluon

from speedrun.kernels import softcap_ce

from speedrun.kernels import transpose


def fused_available(use_fp8: bool, x: Tensor, ce_impl: str) -> bool:
    """Does `head_loss` take the fused FP8 + CE op for these settings?"""
    return use_fp8 and softcap_ce.pick_impl(x, ce_impl) == "triton" and softcap_ce.TRITON_FOUND


def x_scale(dim: int) -> float:
    """x is RMS-normed: |x_i| <= sqrt(dim), so x / (sqrt(dim) / 448) fits e4m3, as in fp8.head_matmul."""
    return math.sqrt(dim) / 448


def head_loss(x: Tensor, w: Tensor, targets: Tensor, cap: float, form: str, ce_impl: str, use_fp8: bool,
              w_q: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """sum over tokens of CE(softcap(x @ w^T), targets), a float32 scalar; x (..., K), w (M, K);
    w_q: `quantize_weight(w)`, made by the caller (once a step, by the trainer), which the fused op
    then uses instead of quantising w itself; the two-op path quantises as always."""
    if not fused_available(use_fp8, x, ce_impl):
        z = fp8.head_matmul(x, w, use_fp8)
        return softcap_ce.softcap_cross_entropy(z, targets, cap, form, ce_impl)
    softcap_ce.check(form, ce_impl)
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    x_s = x_scale(x.shape[-1])
    form = "none" if not cap else form
    want_grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
    w_f8, w_f8_t = (None, None) if w_q is None else w_q
    return torch.ops.speedrun.fp8_softcap_ce(
        flat, w.contiguous(), targets.reshape(-1), float(cap), form, x_s, fp8.W_SCALE, fp8.GRAD_SCALE, want_grad,
        w_f8, w_f8_t)[0]


def quantize_weight(w: Tensor) -> tuple[Tensor, Tensor]:
    """The fused op's weight operands for w, made apart from a forward (`fp8.quantize_weight` at the
    record's scale, compiled on a GPU as the op's own quantisation is)."""
    return fp8._compiled(fp8.quantize_weight, w)(w, fp8.W_SCALE)


def use_gluon(x: Tensor, w: Tensor) -> bool:
    """The Gluon forward (`head_gluon`) for these operands: a capability-9.0 GPU (its wgmma is Hopper's
    alone), shapes TMA can describe, Gluon importable."""
    if not x.is_cuda or not head_gluon.supports(x.shape[-1], w.shape[0]):
        return False
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index) == (9, 0) and head_gluon.available()


def _forward(x: Tensor, w: Tensor, cap: float, form: str, x_s: float, w_s: float, grad_mul: float,
             w_f8: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """z, the FP8 operands, and the CE kernel's row sums where the Gluon kernel wrote them (None: the
    CE kernel makes its own first pass). The Gluon product where `use_gluon`, cuBLAS's elsewhere or
    where the Gluon kernel fails. w_f8: w already quantised (`quantize_weight`), returned as the weight
    operand."""
    if use_gluon(x, w):
        out = _gluon_forward(x, w, cap, form, x_s, w_s, grad_mul, w_f8)
        if out is not None:
            return out
    return _cublas_forward(x, w, x_s, w_s, w_f8)


def _gluon_forward(x: Tensor, w: Tensor, cap: float, form: str, x_s: float, w_s: float, grad_mul: float,
                   w_f8: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None] | None:
    """`_forward` by `head_gluon`, with the row sums where the lean CE kernel will read them; None where
    the kernel cannot be compiled here (`head_gluon.try_launch`)."""
    if w_f8 is None:
        x_f8, w_f8 = fp8._compiled(fp8.quantize, x)(x, w, x_s, w_s)
    else:
        x_f8 = fp8._compiled(fp8.quantize_input, x)(x, x_s)
    z = x.new_empty((x.shape[0], w.shape[0]), dtype=torch.bfloat16)
    rowsums = None
    if softcap_ce.lean_applies(form, cap, grad_mul):
        rowsums = x.new_empty((x.shape[0], head_gluon.rowsum_tiles(w.shape[0])), dtype=torch.float32)
    scale = fp8._scale(x, x_s) * fp8._scale(x, w_s)  # float32, as cuBLAS's scale_a * scale_b
    if not head_gluon.try_launch(x_f8, w_f8, scale, z, rowsums, cap):
        return None
    return z, x_f8, w_f8, rowsums


def _cublas_forward(x: Tensor, w: Tensor, x_s: float, w_s: float, w_f8: Tensor | None
                    ) -> tuple[Tensor, Tensor, Tensor, None]:
    """`_forward` by cuBLAS's product (`torch._scaled_mm`), compiled with the quantisation; no row sums."""
    if w_f8 is not None:
        z, x_f8 = fp8._compiled(fp8._forward_quantized_w, x)(x, w_f8, x_s, w_s)
        return z, x_f8, w_f8, None
    z, x_f8, w_f8 = fp8._compiled(fp8._forward_impl, x)(x, w, x_s, w_s)
    return z, x_f8, w_f8, None


def transposed_applies(want_grad: bool, cap: float, form: str, grad_s: float) -> bool:
    """Does the fused op's CE write the transposed gradient too (`softcap_ce.launch_transposed`)?"""
    return want_grad and softcap_ce.lean_applies(form, cap, 1.0 / grad_s)


@torch.library.custom_op("speedrun::fp8_softcap_ce", mutates_args=())
def fp8_softcap_ce(
    x: Tensor, w: Tensor, targets: Tensor, cap: float, form: str, x_s: float, w_s: float, grad_s: float,
    want_grad: bool, w_q: Tensor | None = None, w_qt: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The summed loss (0-d float32), dL/dz / grad_s (N, M) in float8_e5m2 ((0,) without want_grad),
    the FP8 operands of the product (the weight's (0,) where w_q gives it: w_q and w_qt, `quantize_weight(w)`,
    are then the backward's; w itself is not read), and the gradient transposed (M, N) where
    `transposed_applies` ((0,) elsewhere: the backward then makes its own transposed copy)."""
    z, x_f8, w_f8, rowsums = _forward(x, w, cap, form, x_s, w_s, 1.0 / grad_s, w_q)
    if transposed_applies(want_grad, cap, form, grad_s):
        losses, g_f8, g_f8_t = softcap_ce.launch_transposed(z, targets, cap, torch.float8_e5m2, 1.0 / grad_s, rowsums)
    else:
        losses, g_f8 = softcap_ce.launch(z, targets, cap, form, want_grad, torch.float8_e5m2, 1.0 / grad_s, rowsums)
        g_f8_t = g_f8.new_empty((0,))
    if w_q is not None:  # an op's output may not be its input
        w_f8 = w_q.new_empty((0,))
    return losses.sum(), g_f8, x_f8, w_f8, g_f8_t


@fp8_softcap_ce.register_fake
def _(x, w, targets, cap, form, x_s, w_s, grad_s, want_grad, w_q=None, w_qt=None):
    N, M = x.shape[0], w.shape[0]
    loss = x.new_empty((), dtype=torch.float32)
    g_f8 = x.new_empty((N, M) if want_grad else (0,), dtype=torch.float8_e5m2)
    transposed = transposed_applies(want_grad, cap, form, grad_s)
    g_f8_t = x.new_empty((M, N) if transposed else (0,), dtype=torch.float8_e5m2)
    w_f8 = w.to(torch.float8_e4m3fn) if w_q is None else w.new_empty((0,), dtype=torch.float8_e4m3fn)
    return loss, g_f8, x.to(torch.float8_e4m3fn), w_f8, g_f8_t


def _setup_context(ctx, inputs, output):
    _, g_f8, x_f8, w_f8, g_f8_t = output
    ctx.mark_non_differentiable(g_f8, x_f8, w_f8, g_f8_t)
    w_q, w_qt = inputs[9:11] if len(inputs) > 9 else (None, None)
    if w_q is not None:
        w_f8 = w_q
    ctx.save_for_backward(g_f8, x_f8, w_f8, g_f8_t, w_qt)
    ctx.scales = inputs[5:8]
    ctx.want_grad = inputs[8]


def _backward(ctx, g_loss, *_):
    if not ctx.want_grad:
        raise RuntimeError("fp8_softcap_ce: the forward ran without a gradient (no grad mode or no input required grad)")
    g_f8, x_f8, w_f8, g_f8_t, w_f8_t = ctx.saved_tensors
    grad_x, grad_w = torch.ops.speedrun.fp8_mm_backward_prequantized(g_f8, g_loss, x_f8, w_f8, *ctx.scales, g_f8_t,
                                                                     w_f8_t)
    return (grad_x, grad_w) + (None,) * 9  # targets ... w_qt


fp8_softcap_ce.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("speedrun::fp8_mm_backward_prequantized", mutates_args=())
def fp8_mm_backward_prequantized(
    g_f8: Tensor, upstream: Tensor, x_f8: Tensor, w_f8: Tensor, x_s: float, w_s: float, grad_s: float,
    g_f8_t: Tensor | None = None, w_f8_t: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The FP8 backward for the gradient g_f8 * grad_s * upstream (a 0-d tensor): grad_x's product
    from g_f8, grad_w's from its transposed copy: g_f8_t where the CE kernel wrote it, else
    `transpose.transpose_copy` (a Triton kernel on the GPU). Running the copy on a side stream beside
    grad_x's product was measured: no gain (7.05 against 7.07 ms per micro-step, docs/performance.md),
    so it runs in line."""
    if g_f8_t is None or not g_f8_t.numel():
        g_f8_t = transpose.transpose_copy(g_f8)
    grad_x = fp8._compiled(fp8.grad_x_prequantized, g_f8)(g_f8, upstream, w_f8, w_s, grad_s, w_f8_t)
    return grad_x, fp8._compiled(fp8.grad_w_prequantized, g_f8)(g_f8_t, upstream, x_f8, x_s, grad_s)


@fp8_mm_backward_prequantized.register_fake
def _(g_f8, upstream, x_f8, w_f8, *_):
    grad_x = x_f8.new_empty(x_f8.shape, dtype=torch.bfloat16)
    grad_w = w_f8.new_empty((w_f8.shape[1], w_f8.shape[0]), dtype=torch.float32).T  # same strides as the op
    return grad_x, grad_w
