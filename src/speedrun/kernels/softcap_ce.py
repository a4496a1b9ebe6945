"""Soft-capped cross-entropy for the training head, with a fused Triton kernel.

The training loss is

    s = softcap(z);  loss = sum_i (logsumexp_j s_ij - s_i,t_i)

over the (tokens x vocabulary) head output z, with softcap(z) = c*sigmoid(z/7.5)
("sigmoid", the record, c = 30), c*tanh(z/c) ("tanh") or z ("none", or c = 0).
Padded vocabulary columns are ordinary columns: they take part in the softmax.

Two implementations of `softcap_cross_entropy`:

* ``torch``: `F.cross_entropy(softcap(z.float()), t, reduction="sum")`, the
  exact calls `GPT.forward` made before this module existed (the ground truth;
  bit-identical to them). Under `torch.compile`, Inductor turns it into one
  forward reduction kernel and one backward kernel, each sweeping the logits.
* ``triton``: one kernel launch computes each row's loss *and* the gradient
  d loss_i / d z_ij = (softmax(s_i)_j - [j = t_i]) * ds/dz_ij, written in z's
  dtype (bfloat16 in training). One program per row makes two passes over
  it: first the float32 sum of 2^(s log2 e - m), with m = c log2 e (c is a
  known upper bound of s, so no max is needed) for the capped forms, a
  running max for "none" or caps too large for that shift; then the
  gradient. The backward only multiplies that saved gradient by the upstream
  gradient, in place (see `_backward`). It is a `torch.library.custom_op`, so
  `torch.compile(fullgraph=True)` keeps it whole; `register_fake` gives its
  output shapes and strides.

Why exp2 and the sigmoid's cost: per element and pass the record's form takes
three operations of the GPU's special-function unit (two exponentials and a
reciprocal), and at (49152, 50304) that unit, not memory, bounds the kernel
(~4.0 ms against 2.25 ms for one read of z and one write of the e5m2
gradient, on an H200). Working in base 2 saves the products by log2 e.

The lean kernel keeps the precision and removes work. The precise
kernel's SASS (compiled offline for sm_90) has ~40 instructions per element
over both passes, 6 of them special-function: at 16 such results per clock
and SM against 128 issued instructions, the two limits are equal (0.375 and
0.32 clocks per element), so neither a polynomial exponential nor a Newton
reciprocal alone could gain (both were measured: slower, and 4%). The lean
kernel first cuts the other instructions (no masks outside the last block, no
per-element target compare: the target's gradient is written once after a
barrier, constants folded into one exponent shift, s(1 - s) as one FMA), then
shares one reciprocal between two elements (1/((1+a)(1+b)) gives both
sigmoids; exponents clamped at 2^63 so the product stays finite), then moves
a share of the softmax exponentials to a polynomial on the FMA units, which
now have room (`LEAN_CONFIG["POLY"]`). Measured on an H200 (2026-12-01,
03a3753): 4,021 -> 3,289 us a call at (49152, 50304) with the e5m2
gradient, the same loss error against float64 (4.1e-7) and e5m2 bytes as
close to float64's; the polynomial's share mattered little (+-60 us), so the
kernel is no longer bound by one unit. So the record's form runs the lean kernel
wherever it applies (`lean_applies`: the sigmoid form with 0 < c <= 80, its static
shift); the other forms and caps run the precise kernel, which the lean one is also
held to in the GPU tests (`_launch(..., lean=False)`). The choice follows from the
form and the cap alone: no caller makes it.

`impl` chooses between the reference and the kernels as `kernel_choice` says ("auto":
the kernels for CUDA tensors when Triton is installed); they are built on first use.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from speedrun.kernels.choice import IMPLS, TRITON_FOUND, built_once, pick_impl  # noqa: F401 (its interface)
from speedrun.kernels import ce_grad_gluon
from speedrun.kernels import transpose

FORMS = ("sigmoid", "tanh", "none")
SIGMOID_TEMPERATURE = 7.5  # the record's 30*sigmoid(z/7.5)
IGNORE_INDEX = -100  # F.cross_entropy's default: such rows add 0 to the loss and get a zero gradient

# Kernel launch parameters. BLOCK_V: vocabulary columns per inner-loop step
# (a power of two); 50304 = 24.6 x 2048. Measured on an H200 at (49152, 50304)
# bfloat16 (scripts/bench/ce_bench.py, docs/performance.md): 4 warps 4.67 ms a
# call with the gradient, 8 warps 4.82, 16 warps 5.46; BLOCK_V 1024 / 4096 slower.
# The two kernels' sigmoid of the sigmoid form:
#   precise  1 / (1 + 2^(-u log2 e)), Triton's float32 exp2 and division, as Inductor compiles the
#            reference's torch.sigmoid: three special-function-unit (SFU) operations per element and
#            pass with the softmax's exp2, and the SFU bounds the kernel (docs/performance.md)
#   lean     the record's form with the same precision in fewer instructions (`_softcap_ce_lean_kernel`):
#            one reciprocal for two elements, the exponential of half the softmax's elements by a
#            degree-5 polynomial on the FMA units (relative error 1.9e-7, the special-function unit's
#            own ~2^-22), no per-element masks or target compare
KERNEL_CONFIG = {"BLOCK_V": 2048, "num_warps": 4}
# The lean kernel: which softmax exponentials of each block's second half take the polynomial (0: none, 1: the
# row-sum pass, 2: both passes), the block and the warps. On CUDA the reciprocal is the hardware's
# approximate one (1 ulp). Swept on an H200 (2026-12-01, 03a3753; 12 launches, with
# the e5m2 gradient, 4,021 us for the precise kernel): POLY 1, 4,096 columns, 8 warps 3,289 us; the others
# 3,345-3,500 us (POLY 0: 3,345-3,488, POLY 2: 3,416-3,500).
LEAN_CONFIG = {"POLY": 1, "BLOCK_V": 4096, "num_warps": 8}


# --------------------------------------------------------------------------- reference


def softcap(z: Tensor, cap: float, form: str) -> Tensor:
    """float32 soft-capped logits: the same operations as `GPT.softcap`."""
    z = z.float()
    if not cap or form == "none":
        return z
    if form == "sigmoid":
        return cap * torch.sigmoid(z / SIGMOID_TEMPERATURE)
    return cap * torch.tanh(z / cap)


def reference_cross_entropy(z: Tensor, targets: Tensor, cap: float, form: str) -> Tensor:
    """What the model computed before this module: summed cross-entropy of the soft-capped logits."""
    return F.cross_entropy(softcap(z, cap, form), targets, reduction="sum")


# --------------------------------------------------------------------------- dispatch


def check(form: str, impl: str) -> None:
    if form not in FORMS:
        raise ValueError(f"softcap form must be one of {FORMS}, got {form!r}")
    if impl not in IMPLS:
        raise ValueError(f"cross-entropy impl must be one of {IMPLS}, got {impl!r}")


def softcap_cross_entropy(z: Tensor, targets: Tensor, cap: float, form: str, impl: str = "torch") -> Tensor:
    """sum_i CE(softcap(z_i), t_i) as a float32 scalar, differentiable with respect to z.

    z: (N, V) logits (bfloat16 or float32); targets: (N,) int64 class ids
    (IGNORE_INDEX rows are skipped, as `F.cross_entropy` does); cap = 0 or
    form = "none" means no soft-cap. impl: "torch" (the reference), "triton"
    (the fused kernel, lean or precise as `lean_applies` says; CUDA, or a CPU
    under TRITON_INTERPRET=1), "auto".
    """
    check(form, impl)
    if pick_impl(z, impl) == "torch":
        return reference_cross_entropy(z, targets, cap, form)
    if not TRITON_FOUND:
        raise RuntimeError("softcap_cross_entropy impl='triton' needs Triton installed")
    form = "none" if not cap else form
    z, targets = z.reshape(-1, z.shape[-1]), targets.reshape(-1)
    want_grad = torch.is_grad_enabled() and z.requires_grad
    losses, _ = torch.ops.speedrun.softcap_ce(z, targets, float(cap), form, want_grad)
    return losses.sum()


# --------------------------------------------------------------------------- Triton kernel

triton = tl = None  # set by built_once on first use
_softcap_jit = _softcap_ce_kernel = None
_rcp = _exp2_poly = _exp2 = _sigmoid_pair = _row_sum_pass = _row_loss = _softcap_ce_lean_kernel = None
_ce_rows_kernel = _ce_target_kernel = None
_P1 = _P2 = _P3 = _P4 = _P5 = None  # EXP2_POLY as Triton constexprs, set with the kernels
_FORM_CODE = {"none": 0, "sigmoid": 1, "tanh": 2}


@built_once
def _build_kernel(interpreted: bool):
    """Define the kernels (once, `built_once`); interpreted: TRITON_INTERPRET=1 now."""
    global _softcap_jit, _softcap_ce_kernel  # module globals: the interpreter re-executes the source with them

    @triton.jit
    def _softcap_jit(zf, cap2, inv_scale, ds_scale, FORM: tl.constexpr):
        """(s * log2(e), ds/dz) for float32 z: the soft-capped logit in base-2 units (the kernel takes
        exp2 of it), cap2 = c * log2(e); inv_scale = 1/7.5 (sigmoid) or 1/c (tanh), ds_scale = c/7.5
        (sigmoid). Exponents are clamped at 2^126 so that 1 + e stays finite; the clamped sigmoid (below
        1e-38) and tanh remainder round to the same s."""
        if FORM == 1:  # c * sigmoid(z / 7.5)
            sig = 1.0 / (1.0 + tl.exp2(tl.minimum(zf * (-1.4426950408889634 * inv_scale), 126.0)))
            s2 = cap2 * sig
            ds = ds_scale * sig * (1.0 - sig)
        elif FORM == 2:  # c * tanh(z / c); tanh(x) = 1 - r, r = 2 / (exp(2x) + 1), saturates cleanly to +-1
            r = 2.0 / (tl.exp2(tl.minimum(zf * (2.8853900817779268 * inv_scale), 126.0)) + 1.0)
            s2 = cap2 * (1.0 - r)
            ds = r * (2.0 - r)  # 1 - tanh^2 without cancellation near +-1
        else:
            s2 = zf * 1.4426950408889634
            ds = tl.full(zf.shape, 1.0, tl.float32)
        return s2, ds

    @triton.jit
    def _softcap_ce_kernel(
        Z, T, LOSS, GRAD, stride_z, stride_g, cap, inv_scale, grad_mul,
        V: tl.constexpr, FORM: tl.constexpr, STATIC_MAX: tl.constexpr, IGNORE: tl.constexpr,
        WRITE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)  # int64: N x V exceeds 2^31 in training
        z_row = Z + row * stride_z
        cols = tl.arange(0, BLOCK_V)
        t = tl.load(T + row).to(tl.int32)
        cap2 = cap * 1.4426950408889634  # log2(e)
        ds_scale = cap * inv_scale

        # pass 1: per-lane sums of 2^(s2 - m2), all in base-2 units (s2 = s * log2 e). STATIC_MAX: s <= cap
        # is known, so m2 = cap2 and the loop has no cross-lane work; otherwise m2 is a running max,
        # rescaled once per block.
        acc = tl.zeros((BLOCK_V,), tl.float32)
        if STATIC_MAX:
            m2 = cap2
            for v0 in range(0, V, BLOCK_V):
                idx = v0 + cols
                ok = idx < V
                zf = tl.load(z_row + idx, mask=ok, other=0.0).to(tl.float32)
                s2, _ = _softcap_jit(zf, cap2, inv_scale, ds_scale, FORM)
                acc += tl.where(ok, tl.exp2(s2 - m2), 0.0)
        else:
            m2 = tl.max(tl.full((BLOCK_V,), float("-inf"), tl.float32), axis=0)
            for v0 in range(0, V, BLOCK_V):
                idx = v0 + cols
                ok = idx < V
                zf = tl.load(z_row + idx, mask=ok, other=0.0).to(tl.float32)
                s2, _ = _softcap_jit(zf, cap2, inv_scale, ds_scale, FORM)
                s2 = tl.where(ok, s2, float("-inf"))
                m_new = tl.maximum(m2, tl.max(s2, axis=0))
                acc = acc * tl.exp2(m2 - m_new) + tl.exp2(s2 - m_new)
                m2 = m_new
        lse2 = m2 + tl.log2(tl.sum(acc, axis=0))

        ignored = t == IGNORE
        t_safe = tl.where(ignored, 0, t)
        z_t = tl.load(z_row + t_safe, mask=(t_safe >= 0) & (t_safe < V), other=0.0).to(tl.float32)  # bad ids: undefined
        s_t1, _ = _softcap_jit(tl.full((1,), 1.0, tl.float32) * z_t, cap2, inv_scale, ds_scale, FORM)
        s_t2 = tl.sum(s_t1, axis=0)
        tl.store(LOSS + row, tl.where(ignored, 0.0, (lse2 - s_t2) * 0.6931471805599453))  # ln(2)

        # pass 2: gradient (softmax - onehot) * ds/dz, times grad_mul (exactly 1.0 unless the gradient
        # is stored as FP8 for the head's backward: then 1 / its scale), stored in GRAD's dtype
        if WRITE_GRAD:
            g_row = GRAD + row * stride_g
            keep = tl.where(ignored, 0.0, 1.0)
            for v0 in range(0, V, BLOCK_V):
                idx = v0 + cols
                ok = idx < V
                zf = tl.load(z_row + idx, mask=ok, other=0.0).to(tl.float32)
                s2, ds = _softcap_jit(zf, cap2, inv_scale, ds_scale, FORM)
                p = tl.exp2(s2 - lse2)
                g = (p - tl.where(idx == t, 1.0, 0.0)) * ds * keep
                tl.store(g_row + idx, (g * grad_mul).to(GRAD.dtype.element_ty), mask=ok)

    _define_lean_kernel()
    return _softcap_ce_kernel


# 2^f on [-1/2, 1/2], degree 5 (f^1..f^5; f^0 is 1): relative error 9.1e-8 in exact arithmetic, 1.9e-7
# by float32 Horner steps (least-squares fit for relative error, Lawson-weighted toward minimax)
EXP2_POLY = (0.6931470036506653, 0.24022242426872253, 0.05550733581185341, 0.009671512991189957,
             0.001326472614891827)


def _define_lean_kernel():
    """The "lean" kernel (the record's sigmoid form, static shift); bound as module globals like the others."""
    global _rcp, _exp2_poly, _exp2, _sigmoid_pair, _row_sum_pass, _row_loss, _softcap_ce_lean_kernel, _ce_rows_kernel
    global _ce_target_kernel, _P1, _P2, _P3, _P4, _P5
    _P1, _P2, _P3, _P4, _P5 = (tl.constexpr(c) for c in EXP2_POLY)  # kernels read constexpr globals only

    @triton.jit
    def _rcp(x, FAST: tl.constexpr):
        """1 / x: the hardware's approximate reciprocal (1 ulp; 0 for inf) on CUDA, a division elsewhere."""
        if FAST:
            return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                             is_pure=True, pack=1)
        else:
            return 1.0 / x

    @triton.jit
    def _exp2_poly(x):
        """2^x for x in [-125, 125] on the FMA units: x = j + f with j = round(x) (by the 1.5 * 2^23 shift,
        which leaves j in the low bits of t), 2^f by the polynomial, j added to the exponent bits."""
        t = x + 12582912.0
        f = x - (t - 12582912.0)
        p = f * _P5 + _P4
        p = p * f + _P3
        p = p * f + _P2
        p = p * f + _P1
        p = p * f + 1.0
        bits = p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _exp2(x, POLY: tl.constexpr):
        if POLY:
            return _exp2_poly(x)
        else:
            return tl.exp2(x)

    @triton.jit
    def _sigmoid_pair(za, zb, k, FAST: tl.constexpr):
        """sigmoid of two float32 tensors with one reciprocal: 1/((1+ea)(1+eb)) times the other factor;
        ea = 2^(z k) clamped at 2^63 so that the product stays finite (a sigmoid below 1e-19 either way)."""
        da = 1.0 + tl.exp2(tl.minimum(za * k, 63.0))
        db = 1.0 + tl.exp2(tl.minimum(zb * k, 63.0))
        r = _rcp(da * db, FAST)
        return db * r, da * r

    @triton.jit
    def _row_sum_pass(z_row, cols, k, cap2, V: tl.constexpr, BLOCK_V: tl.constexpr, POLY: tl.constexpr,
                      FAST: tl.constexpr):
        """The lean kernel's pass 1: log2 of the row's sum of 2^(s2 - cap2), plus cap2 (s <= cap, so no
        running max); each block of BLOCK_V columns as two halves (a, b) sharing reciprocals."""
        HALF: tl.constexpr = BLOCK_V // 2
        V_FULL: tl.constexpr = (V // BLOCK_V) * BLOCK_V
        acc_a = tl.zeros((HALF,), tl.float32)
        acc_b = tl.zeros((HALF,), tl.float32)
        for v0 in range(0, V_FULL, BLOCK_V):
            sa, sb = _sigmoid_pair(tl.load(z_row + v0 + cols).to(tl.float32),
                                   tl.load(z_row + v0 + HALF + cols).to(tl.float32), k, FAST)
            acc_a += tl.exp2(cap2 * sa - cap2)
            acc_b += _exp2(cap2 * sb - cap2, POLY >= 1)
        for v0 in range(V_FULL, V, BLOCK_V):  # the partial last block, at most once
            ia, ib = v0 + cols, v0 + HALF + cols
            sa, sb = _sigmoid_pair(tl.load(z_row + ia, mask=ia < V, other=0.0).to(tl.float32),
                                   tl.load(z_row + ib, mask=ib < V, other=0.0).to(tl.float32), k, FAST)
            acc_a += tl.where(ia < V, tl.exp2(cap2 * sa - cap2), 0.0)
            acc_b += tl.where(ib < V, tl.exp2(cap2 * sb - cap2), 0.0)
        return cap2 + tl.log2(tl.sum(acc_a, axis=0) + tl.sum(acc_b, axis=0))

    @triton.jit
    def _row_loss(T, LOSS, RS, row, z_row, rs_cols, cap2, k, V: tl.constexpr, IGNORE: tl.constexpr,
                  BLOCK_V: tl.constexpr, POLY: tl.constexpr, FAST: tl.constexpr, ROWSUMS: tl.constexpr,
                  RS_BLOCK: tl.constexpr):
        """One row's log2-sum-exp (pass 1: sum of 2^(s2 - cap2), s <= cap so no running max; or the sum of
        its rs_cols partial sums at RS with ROWSUMS) and loss, stored at LOSS; (target or 0, ignored,
        lse2, the target's sigmoid)."""
        t = tl.load(T + row).to(tl.int32)
        if ROWSUMS:
            rs = tl.arange(0, RS_BLOCK)
            lse2 = cap2 + tl.log2(tl.sum(tl.load(RS + row * rs_cols + rs, mask=rs < rs_cols, other=0.0), axis=0))
        else:
            lse2 = _row_sum_pass(z_row, tl.arange(0, BLOCK_V // 2), k, cap2, V, BLOCK_V, POLY, FAST)
        ignored = t == IGNORE
        t_safe = tl.where(ignored, 0, t)
        z_t = tl.load(z_row + t_safe, mask=(t_safe >= 0) & (t_safe < V), other=0.0).to(tl.float32)
        s_t = 1.0 / (1.0 + tl.exp2(tl.minimum(z_t * k, 126.0)))  # the target's sigmoid, one element
        tl.store(LOSS + row, tl.where(ignored, 0.0, (lse2 - cap2 * s_t) * 0.6931471805599453))  # ln(2)
        return t_safe, ignored, lse2, s_t

    @triton.jit
    def _softcap_ce_lean_kernel(Z, T, LOSS, GRAD, RS, stride_z, stride_g, cap, inv_scale, grad_mul, rs_cols,
                                V: tl.constexpr, IGNORE: tl.constexpr, WRITE_GRAD: tl.constexpr,
                                BLOCK_V: tl.constexpr, POLY: tl.constexpr, FAST: tl.constexpr,
                                ROWSUMS: tl.constexpr, RS_BLOCK: tl.constexpr):
        """`_softcap_ce_kernel`'s function for c * sigmoid(z / 7.5) with the shift m = c (STATIC_MAX), each
        block of BLOCK_V columns as two halves (a, b) that share reciprocals. Columns below V_FULL are
        read unmasked; the last partial block is masked. ROWSUMS: pass 1's sum is the sum of the row's
        rs_cols partial sums at RS (the FP8 head's Gluon epilogue wrote them), and z is read once."""
        HALF: tl.constexpr = BLOCK_V // 2
        V_FULL: tl.constexpr = (V // BLOCK_V) * BLOCK_V
        row = tl.program_id(0).to(tl.int64)
        z_row = Z + row * stride_z
        cols = tl.arange(0, HALF)
        cap2 = cap * 1.4426950408889634  # everything in base-2 units: s2 = s * log2(e)
        k = -1.4426950408889634 * inv_scale
        t_safe, ignored, lse2, s_t = _row_loss(T, LOSS, RS, row, z_row, rs_cols, cap2, k, V, IGNORE, BLOCK_V, POLY,
                                               FAST, ROWSUMS, RS_BLOCK)

        # pass 2: g = softmax * ds/dz * grad_mul with ds/dz = (c / 7.5) s (1 - s): the constant folded into
        # the exponent (2^(s2 - lse2 + log2 C)); the target's -ds/dz * grad_mul is written after a barrier
        if WRITE_GRAD:
            g_row = GRAD + row * stride_g
            C = cap * inv_scale * grad_mul
            if ignored:
                for v0 in range(0, V, HALF):
                    tl.store(g_row + v0 + cols, tl.zeros((HALF,), tl.float32).to(GRAD.dtype.element_ty),
                             mask=v0 + cols < V)
            else:
                shift = lse2 - tl.log2(C)
                for v0 in range(0, V_FULL, BLOCK_V):
                    sa, sb = _sigmoid_pair(tl.load(z_row + v0 + cols).to(tl.float32),
                                           tl.load(z_row + v0 + HALF + cols).to(tl.float32), k, FAST)
                    ga = tl.exp2(cap2 * sa - shift) * tl.fma(-sa, sa, sa)
                    gb = _exp2(cap2 * sb - shift, POLY >= 2) * tl.fma(-sb, sb, sb)
                    tl.store(g_row + v0 + cols, ga.to(GRAD.dtype.element_ty))
                    tl.store(g_row + v0 + HALF + cols, gb.to(GRAD.dtype.element_ty))
                for v0 in range(V_FULL, V, BLOCK_V):
                    ia, ib = v0 + cols, v0 + HALF + cols
                    sa, sb = _sigmoid_pair(tl.load(z_row + ia, mask=ia < V, other=0.0).to(tl.float32),
                                           tl.load(z_row + ib, mask=ib < V, other=0.0).to(tl.float32), k, FAST)
                    ga = tl.exp2(cap2 * sa - shift) * tl.fma(-sa, sa, sa)
                    gb = tl.exp2(cap2 * sb - shift) * tl.fma(-sb, sb, sb)
                    tl.store(g_row + ia, ga.to(GRAD.dtype.element_ty), mask=ia < V)
                    tl.store(g_row + ib, gb.to(GRAD.dtype.element_ty), mask=ib < V)
                tl.debug_barrier()  # the loop's store of the target column lands before this one
                g_t = (tl.exp2(cap2 * s_t - shift) - C) * tl.fma(-s_t, s_t, s_t)
                tl.store(g_row + t_safe, g_t.to(GRAD.dtype.element_ty), mask=(t_safe >= 0) & (t_safe < V))

    @triton.jit
    def _ce_rows_kernel(Z, T, LOSS, SHIFT, RS, stride_z, cap, inv_scale, grad_mul, rs_cols, V: tl.constexpr,
                        IGNORE: tl.constexpr, BLOCK_V: tl.constexpr, POLY: tl.constexpr, FAST: tl.constexpr,
                        ROWSUMS: tl.constexpr, RS_BLOCK: tl.constexpr):
        """Per row, as the lean kernel: the loss, and the gradient pass's exponent shift lse2 - log2 C into
        SHIFT (+inf for an ignored row, whose gradient is then 0)."""
        row = tl.program_id(0).to(tl.int64)
        cap2 = cap * 1.4426950408889634
        k = -1.4426950408889634 * inv_scale
        _, ignored, lse2, _ = _row_loss(T, LOSS, RS, row, Z + row * stride_z, rs_cols, cap2, k, V, IGNORE, BLOCK_V,
                                        POLY, FAST, ROWSUMS, RS_BLOCK)
        C = cap * inv_scale * grad_mul
        tl.store(SHIFT + row, tl.where(ignored, float("inf"), lse2 - tl.log2(C)))

    @triton.jit
    def _ce_target_kernel(Z, T, SHIFT, GRAD, GRAD_T, N, stride_z, cap, inv_scale, grad_mul, V: tl.constexpr,
                          IGNORE: tl.constexpr, BLOCK: tl.constexpr):
        """Each row's target column in both layouts, as the lean kernel writes it after its barrier:
        (2^(s2_t - shift) - C) s_t (1 - s_t), s_t the target's sigmoid by a division; ignored rows untouched
        (the gradient pass wrote their zeros). GRAD (N, V) and GRAD_T (V, N) of the gradient's dtype."""
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        rok = rows < N
        t = tl.load(T + rows, mask=rok, other=IGNORE).to(tl.int32)
        ok = rok & (t != IGNORE) & (t >= 0) & (t < V)
        t_safe = tl.where(ok, t, 0)
        rows64 = rows.to(tl.int64)
        z_t = tl.load(Z + rows64 * stride_z + t_safe, mask=ok, other=0.0).to(tl.float32)
        k = -1.4426950408889634 * inv_scale
        s_t = 1.0 / (1.0 + tl.exp2(tl.minimum(z_t * k, 126.0)))
        C = cap * inv_scale * grad_mul
        shift = tl.load(SHIFT + rows, mask=ok, other=0.0)
        cap2 = cap * 1.4426950408889634
        g_t = ((tl.exp2(cap2 * s_t - shift) - C) * tl.fma(-s_t, s_t, s_t)).to(GRAD.dtype.element_ty)
        tl.store(GRAD + rows64 * V + t_safe, g_t, mask=ok)
        tl.store(GRAD_T + t_safe.to(tl.int64) * N + rows, g_t, mask=ok)


def lean_applies(form: str, cap: float, grad_mul: float = 1.0) -> bool:
    """Does `launch` run the lean kernel: the record's sigmoid form with its static shift (0 < cap <= 80) and a
    positive gradient factor (its gradient pass takes the factor's log2)? Elsewhere the precise kernel runs."""
    return form == "sigmoid" and 0 < cap <= 80 and grad_mul > 0


def launch(z: Tensor, targets: Tensor, cap: float, form: str, want_grad: bool,
           grad_dtype: torch.dtype | None = None, grad_mul: float = 1.0,
           rowsums: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-row losses (N,) float32 and dL_i/dz * grad_mul in `grad_dtype` (z's dtype by default;
    the fused FP8 head asks for float8_e5m2 and 1 / the gradient's scale); (0,) without want_grad.
    The lean kernel where `lean_applies`, else the precise one. rowsums: (N, tiles) float32 partial
    sums of the lean kernel's first pass (`head_gluon.launch` writes them with z), which then only
    reads them; the lean kernel only."""
    return _launch(z, targets, cap, form, want_grad, grad_dtype, grad_mul, rowsums, lean_applies(form, cap, grad_mul))


def _launch(z: Tensor, targets: Tensor, cap: float, form: str, want_grad: bool, grad_dtype: torch.dtype | None,
            grad_mul: float, rowsums: Tensor | None, lean: bool) -> tuple[Tensor, Tensor]:
    """`launch` with the kernel named: lean (only where it applies) or precise, which the GPU tests and
    `ce_math_bench.py` hold the lean kernel to at the record's form."""
    _build_kernel()
    if lean and not lean_applies(form, cap, grad_mul):
        raise ValueError(f"softcap_ce: the lean kernel needs the sigmoid form, 0 < cap <= 80 and grad_mul > 0, "
                         f"got {form!r}, {cap}, {grad_mul}")
    if rowsums is not None and not (lean and rowsums.dim() == 2 and rowsums.shape[0] == z.shape[0]
                                    and rowsums.dtype == torch.float32 and rowsums.is_contiguous()):
        raise ValueError("softcap_ce rowsums need the lean kernel (the sigmoid form, 0 < cap <= 80) "
                         "and a contiguous float32 (N, tiles) tensor")
    if z.stride(-1) != 1:
        z = z.contiguous()
    targets = targets.contiguous()
    N, V = z.shape
    losses = torch.empty(N, dtype=torch.float32, device=z.device)
    grad = torch.empty((N, V) if want_grad else (0,), dtype=grad_dtype or z.dtype, device=z.device)
    if N and lean:
        _run_lean(z, targets, losses, grad, cap, want_grad, grad_mul, rowsums)
    elif N:
        _run_precise(z, targets, losses, grad, cap, form, want_grad, grad_mul)
    return losses, grad


def _run_lean(z: Tensor, targets: Tensor, losses: Tensor, grad: Tensor, cap: float, want_grad: bool,
              grad_mul: float, rowsums: Tensor | None) -> None:
    N, V = z.shape
    rs_cols = rowsums.shape[1] if rowsums is not None else 0
    _softcap_ce_lean_kernel[(N,)](z, targets, losses, grad, losses if rowsums is None else rowsums, z.stride(0),
                                  V if want_grad else 0, float(cap), 1.0 / SIGMOID_TEMPERATURE, float(grad_mul),
                                  rs_cols, V=V, IGNORE=IGNORE_INDEX, WRITE_GRAD=want_grad,
                                  BLOCK_V=LEAN_CONFIG["BLOCK_V"], POLY=LEAN_CONFIG["POLY"],
                                  FAST=z.device.type == "cuda", ROWSUMS=rowsums is not None,
                                  RS_BLOCK=max(16, _next_pow2(rs_cols)), num_warps=LEAN_CONFIG["num_warps"])


def _run_precise(z: Tensor, targets: Tensor, losses: Tensor, grad: Tensor, cap: float, form: str, want_grad: bool,
                 grad_mul: float) -> None:
    N, V = z.shape
    inv_scale = 1.0 / SIGMOID_TEMPERATURE if form == "sigmoid" else 1.0 / cap if form == "tanh" else 1.0
    # a fixed shift m = cap is safe while exp(min s - cap) stays a normal float32: s > 0 (sigmoid), s > -cap (tanh)
    static_max = (form == "sigmoid" and 0 < cap <= 80) or (form == "tanh" and 0 < cap <= 40)
    _softcap_ce_kernel[(N,)](z, targets, losses, grad, z.stride(0), V if want_grad else 0, float(cap), inv_scale,
                             float(grad_mul), V=V, FORM=_FORM_CODE[form], STATIC_MAX=static_max, IGNORE=IGNORE_INDEX,
                             WRITE_GRAD=want_grad, BLOCK_V=KERNEL_CONFIG["BLOCK_V"],
                             num_warps=KERNEL_CONFIG["num_warps"])


def launch_transposed(z: Tensor, targets: Tensor, cap: float, grad_dtype: torch.dtype, grad_mul: float,
                      rowsums: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row losses, dL_i/dz * grad_mul (N, V) in grad_dtype, and the same gradient transposed (V, N),
    which the FP8 head's grad_w product needs. Where `ce_grad_gluon.applies` (a Hopper GPU, an e5m2 gradient,
    N % 4 == 0: the head's case), `_both_layouts`; elsewhere the lean kernel and the transposed copy. A
    Triton tile kernel that wrote both layouts on the other GPUs measured no gain over that pair (3,096
    against 3,100 us a 49,152-token call on an H200, 5cf7652, 2026-12-01) and is gone. The record's
    sigmoid form only (0 < cap <= 80); rowsums as `launch`'s."""
    if not lean_applies("sigmoid", cap, grad_mul):
        raise ValueError(f"softcap_ce.launch_transposed: needs 0 < cap <= 80 and grad_mul > 0, got {cap}, {grad_mul}")
    if ce_grad_gluon.applies(z, grad_dtype):
        return _both_layouts(z, targets, cap, grad_dtype, grad_mul, rowsums)
    losses, grad = launch(z, targets, cap, "sigmoid", True, grad_dtype, grad_mul, rowsums)
    return losses, grad, transpose.transpose_copy(grad) if grad.element_size() == 1 else grad.T.contiguous()


def _both_layouts(z: Tensor, targets: Tensor, cap: float, grad_dtype: torch.dtype, grad_mul: float,
                  rowsums: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """The lean kernel's two passes as three kernels on a Hopper GPU: the row kernel (losses and each row's
    exponent shift), `ce_grad_gluon`'s gradient pass storing both layouts (so no transposed copy reads the
    gradient again; the lean kernel's pairs, its bytes exactly), then the target columns."""
    _build_kernel()
    if z.stride(-1) != 1:
        z = z.contiguous()
    targets = targets.contiguous()
    N, V = z.shape
    losses = torch.empty(N, dtype=torch.float32, device=z.device)
    grad = torch.empty((N, V), dtype=grad_dtype, device=z.device)
    grad_t = torch.empty((V, N), dtype=grad_dtype, device=z.device)
    if not N:
        return losses, grad, grad_t
    shift = torch.empty(N, dtype=torch.float32, device=z.device)
    rs_cols = rowsums.shape[1] if rowsums is not None else 0
    if rowsums is not None and tuple(rowsums.shape) != (N, rs_cols):
        raise ValueError(f"softcap_ce.launch_transposed: rowsums must be ({N}, tiles), got {tuple(rowsums.shape)}")
    inv_scale = 1.0 / SIGMOID_TEMPERATURE
    _ce_rows_kernel[(N,)](z, targets, losses, shift, losses if rowsums is None else rowsums, z.stride(0), float(cap),
                          inv_scale, float(grad_mul), rs_cols, V=V, IGNORE=IGNORE_INDEX,
                          BLOCK_V=LEAN_CONFIG["BLOCK_V"], POLY=LEAN_CONFIG["POLY"], FAST=True,
                          ROWSUMS=rowsums is not None, RS_BLOCK=max(16, _next_pow2(rs_cols)),
                          num_warps=LEAN_CONFIG["num_warps"])
    ce_grad_gluon.launch(z, shift, grad, grad_t, cap, inv_scale, LEAN_CONFIG["BLOCK_V"] // 2)
    _ce_target_kernel[(triton.cdiv(N, 256),)](z, targets, shift, grad, grad_t, N, z.stride(0), float(cap),
                                              inv_scale, float(grad_mul), V=V, IGNORE=IGNORE_INDEX, BLOCK=256)
    return losses, grad, grad_t


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@torch.library.custom_op("speedrun::softcap_ce", mutates_args=())
def softcap_ce(z: Tensor, targets: Tensor, cap: float, form: str, want_grad: bool) -> tuple[Tensor, Tensor]:
    """Per-row losses (N,) float32 and d loss_i / d z (N, V) in z's dtype ((0,) when not want_grad)."""
    return launch(z, targets, cap, form, want_grad)


@softcap_ce.register_fake
def _(z, targets, cap, form, want_grad):
    losses = z.new_empty((z.shape[0],), dtype=torch.float32)
    grad = z.new_empty((z.shape[0], z.shape[1]) if want_grad else (0,))  # contiguous, z's dtype, as the op
    return losses, grad


def _setup_context(ctx, inputs, output):
    _, grad = output
    ctx.mark_non_differentiable(grad)
    ctx.save_for_backward(grad)
    ctx.want_grad = inputs[4]
    ctx.consumed = False


def _backward(ctx, g_losses, _g_grad):
    """d total / d z = saved gradient x upstream gradient of each row's loss.

    In place: the saved gradient is an internal output of the op; the public
    function returns only `losses.sum()`, so nothing but this context holds
    it, and it is dead after this backward. Scaling it with `mul_` allocates no
    second (N, V) buffer. Under `torch.compile`, AOTAutograd functionalises the
    `mul_` and Inductor may reuse the saved ("donated") buffer for the result.
    A second backward through the same graph (retain_graph=True) would scale it
    twice, so it is refused.
    """
    if not ctx.want_grad:
        raise RuntimeError("softcap_ce: the forward ran without a gradient (no grad mode or z did not require grad)")
    if ctx.consumed:
        raise RuntimeError("softcap_ce: backward can run once per forward (the gradient is scaled in place)")
    ctx.consumed = True
    (grad,) = ctx.saved_tensors
    return grad.mul_(g_losses.unsqueeze(1)), None, None, None, None


softcap_ce.register_autograd(_backward, setup_context=_setup_context)
