"""Which BLAS library computes the weight gradients (`model.wgrad_blas`).

A weight gradient of the record is dL/dW = gᵀ x: a 768- to 3,072-wide output summed over one
micro-step's 49,152 tokens. PyTorch's default library on CUDA, cuBLAS, runs these as split-K products:
the sum is cut into parts over the SMs and a second kernel (`splitKreduce_kernel`) adds the parts up.
cuBLASLt, which PyTorch can use instead (`torch.backends.cuda.preferred_blas_library`), picks one kernel
with no second pass for the same shapes. Timed per call on an H200 (benchmarks.md, thirty-third session,
in turns at 1,980 MHz): the attention's q-k-v weight 303.5–305.1 -> 292.9–294.7 µs, the MLP's two weights
337.5–341.9 -> 326.7–330.4 µs, but the 768 x 768 output projection 95.8–95.9 -> 125.6–126.3 µs.
The forward products and the input gradients ran the same kernels in both libraries (bit-equal).
In the step "auto" was nonetheless slower, +2.6 and +3.6 ms/step on two power-capped H200s (thirty-fourth
session): 0.7% fewer SM cycles a step, but 0.4% more energy, and at the 700 W cap the energy sets the clock.
Hence the default stays cuBLAS; the choice is kept for cards that are not power-bound.

So "auto" takes cuBLASLt for outputs of at least `AUTO_MIN_NUMEL` elements and cuBLAS below;
"cublaslt" takes it for every weight gradient; "cublas" (the default) leaves PyTorch's own choice
untouched, with no op of this module in the graph. Only the library changes: the same products summed
in another order, so gradients differ from the default's in rounding only (a few units in the last
place of bfloat16; tests hold them to it).

The library is PyTorch's process-wide preference. `mm` sets it for one product and puts the previous
one back. Inside a compiled backward, the product must run when the graph runs, not when it is traced,
so the models call it through the custom op `speedrun::mm_blas`, which Inductor keeps as a call.
The relu2 MLP's backward op already runs eagerly and calls `mm` directly. On the CPU the preference does
not apply, and the products are `torch.mm`'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

WGRAD_CHOICES = ("cublas", "cublaslt", "auto")
AUTO_MIN_NUMEL = 1 << 20  # 768 x 2,304 and 768 x 3,072 above; the 768 x 768 projection (slower on cuBLASLt) below


def library_for(choice: str, out_numel: int) -> str:
    """The library that computes a weight gradient with `out_numel` elements under `model.wgrad_blas`."""
    if choice not in WGRAD_CHOICES:
        raise ValueError(f"model.wgrad_blas={choice!r}: want one of {', '.join(WGRAD_CHOICES)}")
    if choice == "auto":
        return "cublaslt" if out_numel >= AUTO_MIN_NUMEL else "cublas"
    return choice


def mm(a: Tensor, b: Tensor, library: str) -> Tensor:
    """a @ b, with PyTorch's preferred BLAS library set to `library` ("cublas" or "cublaslt") on CUDA."""
    if not a.is_cuda:
        return a @ b
    backends = torch.backends.cuda
    before = backends.preferred_blas_library()
    if before.name.lower() == library:  # PyTorch's preference already (its setter warns, once, that it is new)
        return a @ b
    backends.preferred_blas_library(library)
    try:
        return a @ b
    finally:
        backends.preferred_blas_library(before)


@torch.library.custom_op("speedrun::mm_blas", mutates_args=())
def mm_blas(a: Tensor, b: Tensor, library: str) -> Tensor:
    """`mm` as an op the compiled graph calls at run time."""
    return mm(a, b, library)


@mm_blas.register_fake
def _(a, b, library):
    return a.new_empty((a.shape[0], b.shape[1]))


class _Linear(torch.autograd.Function):
    """F.linear without bias whose weight gradient runs on a chosen library; the rest as autograd's."""

    @staticmethod
    def forward(x: Tensor, w: Tensor, library: str) -> Tensor:
        return F.linear(x, w)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, library = inputs
        ctx.save_for_backward(x, w)
        ctx.library = library

    @staticmethod
    def backward(ctx, g: Tensor):
        x, w = ctx.saved_tensors
        gx = g @ w if ctx.needs_input_grad[0] else None
        gw = None
        if ctx.needs_input_grad[1]:
            g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
            gw = torch.ops.speedrun.mm_blas(g2.t(), x2, ctx.library)
        return gx, gw, None


def linear(x: Tensor, w: Tensor, b: Tensor | None = None, wgrad: str = "cublas") -> Tensor:
    """F.linear(x, w, b), its weight gradient on `library_for(wgrad, w.numel())`: F.linear itself where
    that is cuBLAS (PyTorch's default) or where there is a bias (the record has none). On the CPU the
    library changes nothing and the gradients are F.linear's, bit for bit."""
    if b is not None or library_for(wgrad, w.numel()) == "cublas":
        return F.linear(x, w, b)
    return _Linear.apply(x, w, library_for(wgrad, w.numel()))
