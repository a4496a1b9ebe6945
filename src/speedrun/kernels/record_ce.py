"""The 2026 record's training head loss as one Triton kernel: the multi-token and prefix
cross-entropy of the soft-capped logits, its gradient written in the forward.

The model's loss (`record_loss.record_training_loss`) is the reference: one float32 log-softmax over
the (n, V) soft-capped logits, each term a gather from it. Compiled, it keeps float32 (n, V) tensors
alive between the forward and the backward and makes them again in the backward: several hundred KB a
token, at the record's 49,152-token micro-batch tens of GiB, and as many sweeps of memory. This
kernel reads the bf16 logits twice per row and writes the bf16 gradient once:

    ẑ = c·σ((z + a)/d) ≤ c,  so  lse = c + log Σ_j exp(ẑ_j − c)  needs no running maximum;
    loss_t = Σ_k w_k·[t + k < n]·(lse − ẑ[x_{t+k+1}]) + π·[T′(x_{t+1}) exists]·(lse − ẑ[T′(x_{t+1})]);
    ∂loss_t/∂z_j = (S_t·softmax(ẑ)_j − Σ (weights of the targets equal to j))·(c/d)·σ(1 − σ),

with S_t the sum of row t's weights. That is the exact gradient of the loss it reports, as autograd
gives the reference's (the record's own kernel uses Σ_k w_k on the last K − 1 rows too; the spec's
"Unresolved" notes it). One program per row; the targets (at most `MAX_TERMS` MTP terms and the
prefix) are loaded once as scalars. The backward multiplies the saved gradient by each row's
upstream gradient in place: nothing else holds it (`softcap_ce`'s reasoning, which this follows).

`fused_training_loss` is `RecordKernels.loss` on a GPU (`record_attention.pick`); the CPU tests run
the kernel through Triton's interpreter against the reference, and a GPU test holds it there too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from speedrun.kernels.choice import built_once
from speedrun.model.record_parts import SOFTCAP

MAX_TERMS = 4  # MTP terms the kernel takes (the record has at most 3)
BLOCK_V = 2048

triton = tl = None  # set by built_once on first use
_mtp_ce_kernel = _term = _term_loss = None


@built_once
def _build(interpreted: bool):
    """Define the kernel once (`built_once`); its helpers are module globals, as the interpreter needs."""
    global _mtp_ce_kernel, _term, _term_loss

    @triton.jit
    def _term(TN, W, row, n, k: tl.constexpr, K: tl.constexpr):
        """(target, weight) of MTP term k for `row`: weight 0 past the batch or past K."""
        if k < K:
            valid = row + k < n
            t = tl.load(TN + row + k, mask=valid, other=0).to(tl.int64)
            w = tl.load(W + k) * valid.to(tl.float32)
        else:
            t = row * 0
            w = tl.load(W) * 0.0
        return t, w

    @triton.jit
    def _term_loss(z_row, t, w, lse, cap, shift, inv_div):
        """w·(lse − ẑ[t])."""
        return w * (lse - cap / (1.0 + tl.exp(-(tl.load(z_row + t).to(tl.float32) + shift) * inv_div)))

    @triton.jit
    def _mtp_ce_kernel(Z, TN, PRE, W, PI, LOSS, GRAD, n, stride_z, stride_g, cap, shift, inv_div,
                       V: tl.constexpr, K: tl.constexpr, HAS_PREFIX: tl.constexpr, WRITE_GRAD: tl.constexpr,
                       BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)  # int64: n x V passes 2^31 at the record's shapes
        z_row = Z + row * stride_z
        cols = tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK,), tl.float32)
        for v0 in range(0, V, BLOCK):
            idx = v0 + cols
            ok = idx < V
            zf = tl.load(z_row + idx, mask=ok, other=0.0).to(tl.float32)
            s = cap / (1.0 + tl.exp(-(zf + shift) * inv_div))
            acc += tl.where(ok, tl.exp(s - cap), 0.0)
        lse = cap + tl.log(tl.sum(acc, axis=0))

        t0, w0 = _term(TN, W, row, n, 0, K)
        t1, w1 = _term(TN, W, row, n, 1, K)
        t2, w2 = _term(TN, W, row, n, 2, K)
        t3, w3 = _term(TN, W, row, n, 3, K)
        if HAS_PREFIX:
            pre = tl.load(PRE + tl.load(TN + row))
            tp = tl.where(pre >= 0, pre, 0).to(tl.int64)
            wp = tl.load(PI) * (pre >= 0).to(tl.float32)
        else:
            tp, wp = t0, w0 * 0.0
        loss = (_term_loss(z_row, t0, w0, lse, cap, shift, inv_div) + _term_loss(z_row, t1, w1, lse, cap, shift, inv_div)
                + _term_loss(z_row, t2, w2, lse, cap, shift, inv_div) + _term_loss(z_row, t3, w3, lse, cap, shift, inv_div)
                + _term_loss(z_row, tp, wp, lse, cap, shift, inv_div))
        tl.store(LOSS + row, loss)

        if WRITE_GRAD:
            total = w0 + w1 + w2 + w3 + wp
            g_row = GRAD + row * stride_g
            for v0 in range(0, V, BLOCK):
                idx = v0 + cols
                ok = idx < V
                zf = tl.load(z_row + idx, mask=ok, other=0.0).to(tl.float32)
                sig = 1.0 / (1.0 + tl.exp(-(zf + shift) * inv_div))
                p = tl.exp(cap * sig - lse)
                hit = (tl.where(idx == t0, w0, 0.0) + tl.where(idx == t1, w1, 0.0) + tl.where(idx == t2, w2, 0.0)
                       + tl.where(idx == t3, w3, 0.0) + tl.where(idx == tp, wp, 0.0))
                g = (total * p - hit) * (cap * inv_div) * sig * (1.0 - sig)
                tl.store(g_row + idx, g.to(GRAD.dtype.element_ty), mask=ok)

    return _mtp_ce_kernel


def launch(z: Tensor, targets_next: Tensor, weights: Tensor, prefix_weight: Tensor, prefix: Tensor,
           has_prefix: bool, want_grad: bool) -> tuple[Tensor, Tensor]:
    """Per-row losses (n,) float32 and d loss_t / d z (n, V) in z's dtype ((0,) without want_grad)."""
    kernel = _build()
    if weights.numel() > MAX_TERMS:
        raise ValueError(f"record_ce: at most {MAX_TERMS} MTP weights, got {weights.numel()}")
    if z.stride(-1) != 1:
        z = z.contiguous()
    n, V = z.shape
    cap, shift, divisor = SOFTCAP
    losses = torch.empty(n, dtype=torch.float32, device=z.device)
    grad = torch.empty((n, V) if want_grad else (0,), dtype=z.dtype, device=z.device)
    if n:
        kernel[(n,)](z, targets_next.contiguous(), prefix, weights.contiguous(), prefix_weight, losses, grad, n,
                     z.stride(0), grad.stride(0) if want_grad else 0, cap, shift, 1.0 / divisor,
                     V=V, K=weights.numel(), HAS_PREFIX=has_prefix, WRITE_GRAD=want_grad, BLOCK=BLOCK_V,
                     num_warps=8)
    return losses, grad


@torch.library.custom_op("speedrun::record_mtp_ce", mutates_args=())
def record_mtp_ce(z: Tensor, targets_next: Tensor, weights: Tensor, prefix_weight: Tensor, prefix: Tensor,
                  has_prefix: bool, want_grad: bool) -> tuple[Tensor, Tensor]:
    """`launch` as an operator: `torch.compile(fullgraph=True)` keeps it whole."""
    return launch(z, targets_next, weights, prefix_weight, prefix, has_prefix, want_grad)


@record_mtp_ce.register_fake
def _(z, targets_next, weights, prefix_weight, prefix, has_prefix, want_grad):
    grad = z.new_empty((z.shape[0], z.shape[1]) if want_grad else (0,))
    return z.new_empty((z.shape[0],), dtype=torch.float32), grad


def _setup_context(ctx, inputs, output):
    _, grad = output
    ctx.mark_non_differentiable(grad)
    ctx.save_for_backward(grad)
    ctx.want_grad = inputs[-1]


def _backward(ctx, g_losses, _g_grad):
    """d total / d z: the saved gradient times each row's upstream gradient, in place (module docstring)."""
    if not ctx.want_grad:
        raise RuntimeError("record_mtp_ce: the forward ran without a gradient (no grad mode or z did not require grad)")
    (grad,) = ctx.saved_tensors
    return grad.mul_(g_losses.unsqueeze(1)), None, None, None, None, None, None


record_mtp_ce.register_autograd(_backward, setup_context=_setup_context)


def fused_training_loss(z: Tensor, targets_next: Tensor, mtp_weights: Sequence[float] | Tensor,
                        prefix_weight: float | Tensor, prefix: Tensor) -> Tensor:
    """`record_loss.record_training_loss` through the kernel: the same arguments, the same float32 sum."""
    dev = z.device
    w = torch.as_tensor(mtp_weights, dtype=torch.float32, device=dev)
    has_prefix = isinstance(prefix_weight, Tensor) or bool(prefix_weight)
    pi = torch.as_tensor(prefix_weight, dtype=torch.float32, device=dev).reshape(1)
    want_grad = torch.is_grad_enabled() and z.requires_grad
    losses, _ = torch.ops.speedrun.record_mtp_ce(z, targets_next.long(), w, pi, prefix.to(device=dev, dtype=torch.int64),
                                                 has_prefix, want_grad)
    return losses.sum()
