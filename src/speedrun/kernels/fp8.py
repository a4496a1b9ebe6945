"""The FP8 language-model head, as a custom op.

Forward: x / x_s and w / w_s cast to float8_e4m3fn, `torch._scaled_mm` with
fast accumulation, bfloat16 out. Backward: grad / grad_s cast to
float8_e5m2; grad_x in bfloat16, grad_w in float32. The scales are the
record's static ones. A `torch.library.custom_op` is opaque to
`torch.compile`, which keeps the FP8 matmuls whole instead of decomposing
them.

Where FP8 matrix products are not available (CPU, GPUs before compute
capability 8.9) `head_matmul` falls back to a bfloat16 (or input-dtype)
product; `fp8_supported` says which path a device takes so the run can
report it.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

W_SCALE = 2.0**-9
GRAD_SCALE = 1.0 / 448


def fp8_supported(device: torch.device) -> bool:
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def _scale(t: Tensor, s: float) -> Tensor:
    """A 0-d float32 scale on t's device, filled there (no host-to-device copy)."""
    return torch.full((), s, dtype=torch.float32, device=t.device)


def quantize(x: Tensor, w: Tensor, x_s: float, w_s: float) -> tuple[Tensor, Tensor]:
    """The product's FP8 operands: x / x_s and w / w_s in float8_e4m3fn."""
    return quantize_input(x, x_s), w.div(w_s).to(torch.float8_e4m3fn)


def quantize_input(x: Tensor, x_s: float) -> Tensor:
    return x.div(x_s).to(torch.float8_e4m3fn)


def quantize_weight(w: Tensor, w_s: float) -> tuple[Tensor, Tensor]:
    """w / w_s in float8_e4m3fn, as `quantize` makes it, and its transposed copy (K, M), the layout
    grad_x's product reads: both depend on the weight alone, so a trainer may make them once a step
    (once a step, by the trainer) and hand them to the fused head (`head.fp8_softcap_ce`'s w_q, w_qt)."""
    w_f8 = w.div(w_s).to(torch.float8_e4m3fn)
    return w_f8, w_f8.T.contiguous()


def _forward_impl(x: Tensor, w: Tensor, x_s: float, w_s: float) -> tuple[Tensor, Tensor, Tensor]:
    x_f8, w_f8 = quantize(x, w, x_s, w_s)
    return _product(x_f8, w_f8, x, x_s, w_s), x_f8, w_f8


def _forward_quantized_w(x: Tensor, w_f8: Tensor, x_s: float, w_s: float) -> tuple[Tensor, Tensor]:
    """`_forward_impl` with the weight already quantised: z and x's FP8 operand."""
    x_f8 = quantize_input(x, x_s)
    return _product(x_f8, w_f8, x, x_s, w_s), x_f8


def _product(x_f8: Tensor, w_f8: Tensor, x: Tensor, x_s: float, w_s: float) -> Tensor:
    return torch._scaled_mm(
        x_f8, w_f8.T, out_dtype=torch.bfloat16,
        scale_a=_scale(x, x_s), scale_b=_scale(x, w_s), use_fast_accum=True,
    )


def _backward_impl(
    g: Tensor, x_f8: Tensor, w_f8: Tensor, x_s: float, w_s: float, grad_s: float
) -> tuple[Tensor, Tensor]:
    """grad_x, grad_w of the FP8 product for upstream gradient g."""
    g_f8 = g.div(grad_s).to(torch.float8_e5m2)
    grad_x = torch._scaled_mm(
        g_f8, w_f8.T.contiguous().T, out_dtype=torch.bfloat16,
        scale_a=_scale(g, grad_s), scale_b=_scale(g, w_s), use_fast_accum=False,
    )
    grad_w = torch._scaled_mm(
        x_f8.T.contiguous(), g_f8.T.contiguous().T, out_dtype=torch.float32,
        scale_a=_scale(g, x_s), scale_b=_scale(g, grad_s), use_fast_accum=False,
    ).T
    return grad_x, grad_w


def grad_x_prequantized(g_f8: Tensor, upstream: Tensor, w_f8: Tensor, w_s: float, grad_s: float,
                        w_f8_t: Tensor | None = None) -> Tensor:
    """grad_x of the FP8 product for the upstream gradient g_f8 * grad_s * upstream, where g_f8 (N, M)
    is already e5m2 and `upstream` a 0-d tensor, folded into the product's scale (the fused head:
    `head.fp8_softcap_ce`); w_f8_t: w_f8's transposed copy where the caller has it."""
    w_t = w_f8.T.contiguous() if w_f8_t is None else w_f8_t
    return torch._scaled_mm(
        g_f8, w_t.T, out_dtype=torch.bfloat16,
        scale_a=upstream.float() * grad_s, scale_b=_scale(g_f8, w_s), use_fast_accum=False,
    )


def grad_w_prequantized(g_f8_t: Tensor, upstream: Tensor, x_f8: Tensor, x_s: float, grad_s: float) -> Tensor:
    """grad_w of the same product from g_f8's transposed copy g_f8_t (M, N): the product needs the
    tokens contiguous (`transpose.transpose_copy` makes it)."""
    return torch._scaled_mm(
        x_f8.T.contiguous(), g_f8_t.T, out_dtype=torch.float32,
        scale_a=_scale(g_f8_t, x_s), scale_b=upstream.float() * grad_s, use_fast_accum=False,
    ).T


@functools.lru_cache(maxsize=None)
def _compile(fn):
    return torch.compile(fn, dynamic=False)


def _compiled(fn, t: Tensor):
    """fn, compiled on its own when t is on a GPU: scaling, casting and the
    transposed copies of the (tokens x vocabulary) gradient fuse into a few
    passes instead of eager PyTorch's many full-size temporaries (measured:
    25.7 ms of the backward per 49,152-token micro-step in eager). On a CPU
    (tests only: FP8 is never chosen there) fn runs eagerly."""
    return _compile(fn) if t.is_cuda else fn


@torch.library.custom_op("speedrun::fp8_mm", mutates_args=())
def fp8_mm(x: Tensor, w: Tensor, x_s: float, w_s: float, grad_s: float) -> tuple[Tensor, Tensor, Tensor]:
    """x (N, K) @ w (M, K)^T in FP8; also returns the FP8 operands for backward."""
    return _compiled(_forward_impl, x)(x, w, x_s, w_s)


@fp8_mm.register_fake
def _(x, w, x_s, w_s, grad_s):
    out = x.new_empty((x.shape[0], w.shape[0]), dtype=torch.bfloat16)
    return out, x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)


@torch.library.custom_op("speedrun::fp8_mm_backward", mutates_args=())
def fp8_mm_backward(g: Tensor, x_f8: Tensor, w_f8: Tensor, x_s: float, w_s: float, grad_s: float) -> tuple[Tensor, Tensor]:
    return _compiled(_backward_impl, g)(g.contiguous(), x_f8, w_f8, x_s, w_s, grad_s)


@fp8_mm_backward.register_fake
def _(g, x_f8, w_f8, *_):
    grad_x = x_f8.new_empty(x_f8.shape, dtype=torch.bfloat16)
    grad_w = w_f8.new_empty((w_f8.shape[1], w_f8.shape[0]), dtype=torch.float32).T  # same strides as the op
    return grad_x, grad_w


def _setup_context(ctx, inputs, output):
    x, w, x_s, w_s, grad_s = inputs
    _, x_f8, w_f8 = output
    ctx.save_for_backward(x_f8, w_f8)
    ctx.scales = (x_s, w_s, grad_s)


def _backward(ctx, grad_out, *_):
    x_f8, w_f8 = ctx.saved_tensors
    x_s, w_s, grad_s = ctx.scales
    grad_x, grad_w = torch.ops.speedrun.fp8_mm_backward(grad_out, x_f8, w_f8, x_s, w_s, grad_s)
    return grad_x, grad_w, None, None, None


fp8_mm.register_autograd(_backward, setup_context=_setup_context)


def head_matmul(x: Tensor, w: Tensor, use_fp8: bool) -> Tensor:
    """Logits of the head: x (..., K) @ w (M, K)^T.

    FP8 when `use_fp8` (training on a supporting GPU), else in x's dtype.
    x is RMS-normed, so |x_i| <= sqrt(K): x_s = sqrt(K) / 448 maps that onto
    e4m3's largest value (sqrt(768) / 448 in the record).
    """
    if use_fp8:
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        x_s = math.sqrt(x.shape[-1]) / 448
        out = torch.ops.speedrun.fp8_mm(flat, w.contiguous(), x_s, W_SCALE, GRAD_SCALE)[0]
        return out.view(*x.shape[:-1], w.shape[0])
    return torch.nn.functional.linear(x, w.type_as(x))
