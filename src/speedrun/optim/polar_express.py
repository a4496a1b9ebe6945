"""Polar Express: the orthogonaliser of the 2026-07 record's NorMuon.

Spec: record-2026-07.md, "Optimisation / NorMuon + Polar Express". Like
Newton–Schulz (newton_schulz.py), it maps an update G = U S Vᵀ towards U Vᵀ
with odd matrix polynomials, but each of the five iterations has its own
(a, b, c), chosen (minimax, safety 0.02, cushion 2) so that five bfloat16
iterations bring every singular value much closer to 1 than one fixed
quintic does:

    X = G / (‖G‖_F·1.02 + 1e-6)                           (bfloat16)
    rows ≤ cols:  A = X Xᵀ,  X ← a·X + (b·A + c·A²)·X
    rows > cols:  A = Xᵀ X,  X ← a·X + X·(b·A + c·A²)

Why it is built this way:

* The whole recurrence runs in bfloat16, as in the record: the iteration is
  self-correcting, so bfloat16 rounding costs little and halves the traffic.
  Each product accumulates in float32 inside the matmul and is rounded once
  (`baddbmm` computes b·A + c·A·A and a·X + B·X as single fused operations).
* The side that is multiplied is chosen by orientation instead of
  transposing a tall matrix: A is then always the small Gram matrix, and the
  tall case (the MLP's 3072 × 768) never materialises a transposed copy.
* The dividing factor 1.02 (> 1) keeps the spectral norm strictly below 1
  after bfloat16 rounding; ‖G‖_F ≥ ‖G‖₂ makes that a bound. The + 1e-6 keeps
  a zero matrix (a bank's padding) at zero instead of NaN.
* Plain PyTorch, batched over every leading dimension: the same code serves
  CPU tests and a GPU run; faster kernels (the symmetric products) can
  replace the matmuls later without changing the math.
"""

from __future__ import annotations

import torch
from torch import Tensor

# (a, b, c) of each of the five iterations, as the spec lists them.
POLAR_EXPRESS_COEFFS: tuple[tuple[float, float, float], ...] = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
NORM_SAFETY = 1.02  # ‖G‖_F is multiplied by 1 + 0.02 (safety factor)
NORM_EPS = 1e-6


def normalise(G: Tensor, safety: float = NORM_SAFETY, eps: float = NORM_EPS) -> Tensor:
    """G / (‖G‖_F·safety + eps) per trailing matrix, in bfloat16 (the norm rounded to bfloat16 too)."""
    X = G.to(torch.bfloat16)
    return X / (X.norm(dim=(-2, -1), keepdim=True) * safety + eps)


def _iterate(X: Tensor, coeffs: tuple[tuple[float, float, float], ...]) -> Tensor:
    """The iterations on a (batch, rows, cols) bfloat16 stack; the Gram side follows the orientation."""
    tall = X.shape[-2] > X.shape[-1]
    for a, b, c in coeffs:
        A = X.mT @ X if tall else X @ X.mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)  # b·A + c·A²
        X = torch.baddbmm(X, X, B, beta=a) if tall else torch.baddbmm(X, B, X, beta=a)
    return X


def polar_express(G: Tensor, coeffs: tuple[tuple[float, float, float], ...] = POLAR_EXPRESS_COEFFS,
                  safety: float = NORM_SAFETY, eps: float = NORM_EPS) -> Tensor:
    """Orthogonalise each trailing matrix of G (shape (..., rows, cols)); returns bfloat16, G's shape.

    Any input dtype is accepted; it is cast to bfloat16 before the norm, as
    the record does with its float32 Nesterov update.
    """
    if G.ndim < 2:
        raise ValueError(f"polar_express needs a matrix or a stack of matrices, got shape {tuple(G.shape)}")
    X = normalise(G, safety, eps).reshape(-1, G.shape[-2], G.shape[-1])
    return _iterate(X, coeffs).reshape(G.shape)
