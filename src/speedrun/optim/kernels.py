"""The optimisers' element-wise updates, each as one Triton kernel beside its PyTorch reference.

Adam's update (`adam.adam_update`) is eight eager operations per parameter: lerp, mul, addcmul, sqrt,
div, add, addcdiv (and mul for weight decay), each a pass over the parameter-sized state. Muon's
momentum (`muon.Muon`) is a lerp into the buffers, a stack of the buffers, a Nesterov lerp back into
the stacked gradients, then a cast to bfloat16 for Newton–Schulz. Memory-bound passes all: on an H200
DistAdam took 2.1 ms and Muon's glue about 2.6 ms of a step (profiled 2026-12-01, b01c7eb).

Here each is one kernel that reads every input once and writes every output once:

- `adam_step`: p, g, exp_avg, exp_avg_sq in, p, exp_avg, exp_avg_sq out (7 passes instead of ~17).
  It follows the eager operations one by one, rounding to the parameter's dtype wherever the eager
  code stores a tensor of that dtype (the bfloat16 embedding tables: the decayed p, exp_avg,
  exp_avg_sq after each of its two operations, the square root, the bias-corrected root, the
  denominator, p), with PyTorch's CUDA formulas: lerp's two branches, a division by a Python number
  as a product with its float32 reciprocal, IEEE square root and division, and fused multiply-adds
  where nvcc contracts PyTorch's expressions. So it computes what the eager update computes; in
  float32 the two agree to the last bit or nearly (the GPU test counts the differing elements).
- `momentum_step`: the stacked gradients G and the stacked buffers B in; B ← lerp(B, G, 1 − μ) and
  the Nesterov update lerp(G, B, μ) written once, in bfloat16, the dtype Newton–Schulz reads.
- `record_adam_kernel_step`: the 2026 record's Adam (`record_adam.adam_update`: float32 moments,
  the cautious lr² decay, P − u rounded once) in one pass, with Triton's own multiply-add
  contraction off so that each eager operation is one rounding here too.
- `normuon_apply_step`: the end of NorMuon's step (`normuon.normuon_update`): X scaled by the variance
  factor in bfloat16, the float32 master joined from the bfloat16 weight and its uint16 low half, the
  cautious decay and step, and the master split back, in place. Eagerly that is 21 operations and
  168 bytes an element over the banks (80.2M elements in the record); the kernel reads X, the weight
  and the low half once and writes the two halves once (10 bytes), contraction off.
  Its Nesterov momentum before Polar Express is `momentum_step` on the bank's bfloat16 gradient.

"torch" is the reference (the eager operations, the tests' ground truth), "triton" the kernels (CUDA,
or a CPU under TRITON_INTERPRET=1, whose float32 → bfloat16 conversion truncates: the kernels then
round in integer arithmetic), "auto" the kernels on CUDA tensors where Triton is installed.

Measured on an H200 (2026-12-01, 4343345): the record's DistAdam step 2,058 →
806 µs, bit-equal for the bfloat16 tables and 93.6% of the float32 head's elements equal (the rest in
the last bits); Muon's step 4,693 → 4,819 µs, no gain.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from speedrun.kernels import bf16_rounding
from speedrun.kernels.choice import IMPLS, TRITON_FOUND, built_once, pick_impl  # noqa: F401 (its interface)

BLOCK = 2048  # elements per program: 8 per thread at 8 warps
NUM_WARPS = 8
KERNEL_DTYPES = (torch.float32, torch.bfloat16)

triton = tl = None  # set by built_once on first use
_INTERPRETED = False
_rne_bf16 = _rounded = _lerp = _adam_kernel = _momentum_kernel = _record_adam_kernel = _normuon_kernel = None


@built_once
def _build_kernels(interpreted: bool):
    """Define the kernels (once, `built_once`); interpreted: TRITON_INTERPRET=1 now."""
    # module globals: the interpreter re-executes the source with them
    global _INTERPRETED, _rne_bf16, _rounded, _lerp
    global _adam_kernel, _momentum_kernel, _record_adam_kernel, _normuon_kernel
    _INTERPRETED = interpreted

    _rne_bf16 = bf16_rounding.build()  # called from the kernels below through this module's globals

    @triton.jit
    def _rounded(x, BF16: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """x as a tensor of the parameter's dtype holds it (float32 math carried on)."""
        if BF16:
            if EMULATE_RNE:
                x = _rne_bf16(x)
            else:
                x = x.to(tl.bfloat16).to(tl.float32)
        return x

    @triton.jit
    def _lerp(a, b, w, SMALL: tl.constexpr):
        """torch.lerp(a, b, w) as PyTorch's CUDA kernel computes it (w < 0.5: from a; else from b)."""
        if SMALL:
            y = tl.fma(w, b - a, a)
        else:
            y = tl.fma(-(b - a), 1.0 - w, b)
        return y

    @triton.jit
    def _adam_kernel(P, G, M, V, N, decay, w1, beta2, w2, inv_bc2, eps, neg_step,
                     BLOCK: tl.constexpr, DECAY: tl.constexpr, SMALL1: tl.constexpr, BF16: tl.constexpr,
                     EMULATE_RNE: tl.constexpr):
        """One block of adam.adam_update: p, exp_avg (M), exp_avg_sq (V) updated in place."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < N
        p = tl.load(P + offs, mask=ok, other=0.0).to(tl.float32)
        g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
        m = tl.load(M + offs, mask=ok, other=0.0).to(tl.float32)
        v = tl.load(V + offs, mask=ok, other=0.0).to(tl.float32)
        if DECAY:
            p = _rounded(p * decay, BF16, EMULATE_RNE)
        m = _rounded(_lerp(m, g, w1, SMALL1), BF16, EMULATE_RNE)
        v = _rounded(v * beta2, BF16, EMULATE_RNE)
        v = _rounded(tl.fma(w2 * g, g, v), BF16, EMULATE_RNE)
        d = _rounded(tl.sqrt_rn(v), BF16, EMULATE_RNE)
        d = _rounded(d * inv_bc2, BF16, EMULATE_RNE)
        d = _rounded(d + eps, BF16, EMULATE_RNE)
        p = _rounded(tl.fma(neg_step, tl.div_rn(m, d), p), BF16, EMULATE_RNE)
        tl.store(P + offs, p.to(P.dtype.element_ty), mask=ok)
        tl.store(M + offs, m.to(M.dtype.element_ty), mask=ok)
        tl.store(V + offs, v.to(V.dtype.element_ty), mask=ok)

    @triton.jit
    def _momentum_kernel(G, B, U, N, w_buf, w_nesterov, BLOCK: tl.constexpr, SMALL_BUF: tl.constexpr,
                         SMALL_NESTEROV: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """B ← lerp(B, G, w_buf); U ← lerp(G, B, w_nesterov) in bfloat16. B float32, G float32 or bfloat16
        (widened exactly)."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < N
        g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
        b = _lerp(tl.load(B + offs, mask=ok, other=0.0), g, w_buf, SMALL_BUF)
        u = _rounded(_lerp(g, b, w_nesterov, SMALL_NESTEROV), True, EMULATE_RNE)
        tl.store(B + offs, b, mask=ok)
        tl.store(U + offs, u.to(tl.bfloat16), mask=ok)

    @triton.jit
    def _record_adam_kernel(P, G, M, V, N, beta1, w1, beta2, w2, eps, step_size, decay, BLOCK: tl.constexpr,
                            DECAY: tl.constexpr, BF16: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """One block of record_adam.adam_update: p (its dtype), exp_avg (M), exp_avg_sq (V) (float32)."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < N
        p = tl.load(P + offs, mask=ok, other=0.0).to(tl.float32)
        g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
        m = tl.fma(w1, g, tl.load(M + offs, mask=ok, other=0.0) * beta1)
        v = tl.fma(w2, g * g, tl.load(V + offs, mask=ok, other=0.0) * beta2)
        u = tl.div_rn(m, tl.sqrt_rn(v) + eps) * step_size
        if DECAY:
            u = u + tl.where(u * p > 0, decay * p, 0.0)
        p = _rounded(p - u, BF16, EMULATE_RNE)
        tl.store(P + offs, p.to(P.dtype.element_ty), mask=ok)
        tl.store(M + offs, m, mask=ok)
        tl.store(V + offs, v, mask=ok)

    @triton.jit
    def _normuon_kernel(W, LOW, X, S, ETA, size, rows, decay, COLS: tl.constexpr, BLOCK: tl.constexpr,
                        PER_ROW: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """One block of matrix program_id(1) for normuon_update's end on a (k, rows, COLS) stack: W, LOW
        the master's halves as int16, X bfloat16, S the bfloat16 variance factor a row or a column, ETA
        float32 a matrix. Offsets are int32 inside a matrix and COLS a constant, so that the row or
        column of an element is a multiply and a shift, not a 64-bit division."""
        mat = tl.program_id(1)
        at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = at < size
        offs = mat.to(tl.int64) * size + at
        s_at = mat * rows + at // COLS if PER_ROW else mat * COLS + at % COLS
        x = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32) * tl.load(S + s_at, mask=ok, other=0.0).to(tl.float32)
        x = _rounded(x, True, EMULATE_RNE)  # X·scale in bfloat16
        high = tl.load(W + offs, mask=ok, other=0).to(tl.int32)
        low = tl.load(LOW + offs, mask=ok, other=0).to(tl.int32) & 0xFFFF
        master = (high * 65536 + low).to(tl.float32, bitcast=True)
        eta = tl.load(ETA + mat)
        keep = ((x * master) >= 0).to(tl.float32)
        master = master - master * keep * decay * eta - x * eta  # cautious_update's order, one rounding each
        bits = master.to(tl.int32, bitcast=True)
        tl.store(W + offs, (bits >> 16).to(tl.int16), mask=ok)
        tl.store(LOW + offs, (bits & 0xFFFF).to(tl.int16), mask=ok)

    return _adam_kernel, _momentum_kernel, _record_adam_kernel, _normuon_kernel


# --------------------------------------------------------------------------- Adam


def adam_reference(p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: float, lr: float,
                   betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    """The eager update, op for op like torch.optim.Adam's single-tensor code (step already counted)."""
    beta1, beta2 = betas
    if weight_decay != 0:
        p.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
    p.addcdiv_(exp_avg, denom, value=-step_size)


def _fits(*tensors: Tensor) -> bool:
    """The kernels' contract: one dtype of theirs, contiguous, equal sizes, one device."""
    first = tensors[0]
    return (first.dtype in KERNEL_DTYPES and all(
        t.dtype == first.dtype and t.is_contiguous() and t.numel() == first.numel() and t.device == first.device
        for t in tensors))


def _f32(x: float) -> float:
    """x as float32 holds it (the kernels' scalar arguments are float32)."""
    return float(np.float32(x))


def adam_step(p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: float, lr: float,
              betas: tuple[float, float], eps: float, weight_decay: float, impl: str = "auto") -> None:
    """In-place Adam(W) step: `adam_reference`'s math, fused where `impl` picks the kernel and the
    tensors fit it (else the reference)."""
    if pick_impl(p, impl) == "torch" or not _fits(p, g, exp_avg, exp_avg_sq):
        adam_reference(p, g, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay)
        return
    if not TRITON_FOUND:
        raise RuntimeError("adam_step impl='triton' needs Triton installed")
    kernel = _build_kernels()[0]
    beta1, beta2 = betas
    n = p.numel()
    if not n:
        return
    w1 = 1 - beta1
    inv_bc2 = float(np.float32(1.0) / np.float32((1 - beta2**step) ** 0.5))
    kernel[(triton.cdiv(n, BLOCK),)](
        p, g, exp_avg, exp_avg_sq, n, _f32(1 - lr * weight_decay), _f32(w1), _f32(beta2), _f32(1 - beta2),
        inv_bc2, _f32(eps), _f32(-(lr / (1 - beta1**step))), BLOCK=BLOCK, DECAY=weight_decay != 0,
        SMALL1=abs(_f32(w1)) < 0.5, BF16=p.dtype == torch.bfloat16,
        EMULATE_RNE=_INTERPRETED and p.dtype == torch.bfloat16, num_warps=NUM_WARPS)


# --------------------------------------------------------------------------- Muon's momentum


def momentum_reference(grads: Tensor, bufs: Tensor, momentum: float) -> Tensor:
    """bufs ← lerp(bufs, grads, 1 − μ); returns lerp(grads, bufs, μ) in bufs' dtype (grads unchanged,
    widened to it first)."""
    g = grads.to(bufs.dtype)
    bufs.lerp_(g, 1 - momentum)
    return g.lerp(bufs, momentum)


def momentum_fits(grads: Tensor, bufs: Tensor) -> bool:
    """The momentum kernel's contract: float32 buffers, gradients float32 or bfloat16, one shape, contiguous."""
    return (bufs.dtype == torch.float32 and grads.shape == bufs.shape and _fits(bufs)
            and _fits(grads) and grads.device == bufs.device)


def momentum_step(grads: Tensor, bufs: Tensor, momentum: float, impl: str = "auto") -> Tensor:
    """Momentum and Nesterov look-ahead on stacked tensors (Muon's, NorMuon's): `momentum_reference`
    (float32), or fused where `impl` picks the kernel and the tensors fit it (bfloat16, the dtype the
    orthogonalisers read first)."""
    if pick_impl(grads, impl) == "torch" or not momentum_fits(grads, bufs):
        return momentum_reference(grads, bufs, momentum)
    if not TRITON_FOUND:
        raise RuntimeError("momentum_step impl='triton' needs Triton installed")
    kernel = _build_kernels()[1]
    update = torch.empty(grads.shape, dtype=torch.bfloat16, device=grads.device)
    n = grads.numel()
    if n:
        w_buf, w_nesterov = _f32(1 - momentum), _f32(momentum)
        kernel[(triton.cdiv(n, BLOCK),)](grads, bufs, update, n, w_buf, w_nesterov, BLOCK=BLOCK,
                                         SMALL_BUF=abs(w_buf) < 0.5, SMALL_NESTEROV=abs(w_nesterov) < 0.5,
                                         EMULATE_RNE=_INTERPRETED, num_warps=NUM_WARPS)
    return update


# --------------------------------------------------------------------------- the 2026 record's Adam


def record_adam_fits(p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor) -> bool:
    """The record Adam kernel's contract: p and g of one kernel dtype, float32 moments, all contiguous
    and of one size on one CUDA device or under the interpreter."""
    return (_fits(p, g) and _fits(exp_avg, exp_avg_sq) and exp_avg.dtype == torch.float32
            and exp_avg.numel() == p.numel() and exp_avg.device == p.device)


def record_adam_kernel_step(p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *, beta1: float,
                            beta2: float, eps: float, step_size: float, decay: float) -> None:
    """`record_adam.adam_update`'s arithmetic in one pass (the caller counts the step and checks
    `record_adam_fits`). Each eager operation is one rounding here too, and the multiply-adds are
    PyTorch's add(alpha) and addcmul compute (β·m + (1−β)·g, and β2·v + (1−β2)·(g·g), both rounding
    once); Triton's own contraction is off, so no other product and sum fuse."""
    if not TRITON_FOUND:
        raise RuntimeError("the record Adam kernel needs Triton installed")
    kernel = _build_kernels()[2]
    n = p.numel()
    if n:
        kernel[(triton.cdiv(n, BLOCK),)](
            p, g, exp_avg, exp_avg_sq, n, _f32(beta1), _f32(1 - beta1), _f32(beta2), _f32(1 - beta2), _f32(eps),
            _f32(step_size), _f32(decay), BLOCK=BLOCK, DECAY=decay != 0, BF16=p.dtype == torch.bfloat16,
            EMULATE_RNE=_INTERPRETED and p.dtype == torch.bfloat16, num_warps=NUM_WARPS, enable_fp_fusion=False)


# --------------------------------------------------------------------------- the end of NorMuon's step


def normuon_fits(weight: Tensor, low: Tensor, X: Tensor, scale: Tensor) -> bool:
    """The NorMuon kernel's contract: a contiguous (k, rows, cols) bfloat16 weight, its uint16 low half
    and X alike, the bfloat16 factor (k, rows, 1) or (k, 1, cols), all on one device."""
    k, rows, cols = weight.shape
    return (weight.dtype == X.dtype == scale.dtype == torch.bfloat16 and low.dtype == torch.uint16
            and weight.shape == low.shape == X.shape and scale.shape in ((k, rows, 1), (k, 1, cols))
            and all(t.is_contiguous() and t.device == weight.device for t in (weight, low, X, scale)))


def normuon_apply_step(weight: Tensor, low: Tensor, X: Tensor, scale: Tensor, eta: Tensor, decay: float) -> None:
    """`normuon.normuon_update` from the orthogonalised X on, in place: the master
    join(weight, low) − η·decay·master·[x·master ≥ 0] − η·x, x = X·scale in bfloat16, η = eta[matrix]
    (float32), split back into weight and low. The caller checks `normuon_fits`."""
    if not TRITON_FOUND:
        raise RuntimeError("the NorMuon kernel needs Triton installed")
    kernel = _build_kernels()[3]
    k, rows, cols = weight.shape
    if weight.numel():
        kernel[(triton.cdiv(rows * cols, BLOCK), k)](
            weight.view(torch.int16), low.view(torch.int16), X, scale, eta.to(torch.float32).contiguous(),
            rows * cols, rows, _f32(decay), COLS=cols, BLOCK=BLOCK, PER_ROW=scale.shape == (k, rows, 1),
            EMULATE_RNE=_INTERPRETED, num_warps=NUM_WARPS, enable_fp_fusion=False)
