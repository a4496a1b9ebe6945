"""Newton–Schulz orthogonalisation for Muon.

Muon replaces each update matrix G = U S Vᵀ by (roughly) U Vᵀ, computed with
five steps of the quintic iteration of the record

    X ← G / (‖G‖_F + 1e-7);  repeat: A = X Xᵀ,  B = b·A + c·A²,  X ← a·X + B·X

with (a, b, c) = (3.4445, −4.7750, 2.0315), on the wide orientation (a tall
matrix is transposed first so that A is the small Gram matrix). The
coefficients push every singular value into roughly [0.7, 1.2] rather than
exactly to 1; the record found that good enough and much cheaper.

Why three implementations:

* ``reference``: float32, plain ops. The ground truth the tests compare to.
* ``torch``: bfloat16 batched matmuls. Runs everywhere (CPU, any GPU) and is
  what the optimiser uses when Triton is absent.
* ``triton``: the record's trick. A = X Xᵀ and B = b·A + c·A·A are both
  symmetric, so a Triton kernel computes only the upper-triangular output
  tiles and writes each one twice (as itself and mirrored), halving the two
  symmetric matmuls. The last product B·X is not symmetric and stays a
  cuBLAS ``baddbmm``. Matrices smaller than ``_TRITON_MIN_ROWS`` rows go
  to the torch path, where a kernel launch would cost more than it saves.

Every implementation accepts (..., m, n) and orthogonalises each trailing
matrix separately. Triton is imported lazily-guarded: without it (CPU CI)
the module still imports and ``impl="auto"`` picks the torch path.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton is optional: CPU machines and CI run without it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None
    tl = None

NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7
IMPLS = ("auto", "triton", "torch", "reference")
_TRITON_MIN_ROWS = 64  # below this (after orienting wide) the torch path is faster


def triton_available() -> bool:
    """True when Triton imported and a CUDA device exists."""
    return triton is not None and torch.cuda.is_available()


def _as_batch(G: Tensor) -> tuple[Tensor, bool]:
    """View G as (batch, rows, cols) with rows <= cols; return it and whether we transposed."""
    if G.ndim < 2:
        raise ValueError(f"newton_schulz needs a matrix or a batch of matrices, got shape {tuple(G.shape)}")
    X = G.reshape(-1, G.shape[-2], G.shape[-1])
    transposed = X.shape[-2] > X.shape[-1]
    if transposed:
        X = X.mT
    return X, transposed


def _restore(X: Tensor, transposed: bool, shape: torch.Size) -> Tensor:
    if transposed:
        X = X.mT
    return X.reshape(shape)


def _normalise(X: Tensor) -> Tensor:
    return X / (X.norm(dim=(-2, -1), keepdim=True) + NS_EPS)


def newton_schulz_reference(G: Tensor, steps: int = 5) -> Tensor:
    """Float32 reference: the plain math, per matrix, returned in float32."""
    a, b, c = NS_COEFFS
    X, transposed = _as_batch(G.float())
    X = _normalise(X)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    return _restore(X, transposed, G.shape)


def _ns_torch(G: Tensor, steps: int) -> Tensor:
    """bfloat16 batched torch ops (fused multiply-adds via baddbmm)."""
    a, b, c = NS_COEFFS
    X, transposed = _as_batch(G.bfloat16())
    X = _normalise(X)
    for _ in range(steps):
        A = X @ X.mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        X = torch.baddbmm(X, B, X, beta=a)
    return _restore(X, transposed, G.shape)


def _ns_triton(G: Tensor, steps: int) -> Tensor:
    """bfloat16 with the symmetric products in Triton (upper tiles only, mirrored)."""
    a, b, c = NS_COEFFS
    X, transposed = _as_batch(G.bfloat16())
    X = _normalise(X).contiguous()
    batch, rows, _ = X.shape
    A = torch.empty(batch, rows, rows, dtype=X.dtype, device=X.device)
    B = torch.empty_like(A)
    for _ in range(steps):
        sym_matmul(X, out=A)  # A = X Xᵀ
        sym_matmul(A, out=B, alpha=c, beta=b, add=A)  # B = c·A Aᵀ + b·A = c·A² + b·A
        X = torch.baddbmm(X, B, X, beta=a)
    return _restore(X, transposed, G.shape)


def pick_impl(G: Tensor, impl: str = "auto") -> str:
    """The implementation `newton_schulz` runs for this input ("triton" | "torch" | "reference")."""
    if impl not in IMPLS:
        raise ValueError(f"newton_schulz impl must be one of {IMPLS}, got {impl!r}")
    if impl != "auto":
        return impl
    small = min(G.shape[-2], G.shape[-1]) < _TRITON_MIN_ROWS
    if G.is_cuda and triton is not None and not small:
        return "triton"
    return "torch"


def newton_schulz(G: Tensor, steps: int = 5, impl: str = "auto") -> Tensor:
    """Orthogonalise each trailing matrix of G (shape (..., m, n)).

    impl: "auto" (Triton on CUDA when importable and the matrix is not tiny,
    else torch bf16), "triton", "torch" or "reference" (float32). The fast
    paths return bfloat16, the reference float32.
    """
    chosen = pick_impl(G, impl)
    if chosen == "reference":
        return newton_schulz_reference(G, steps)
    if chosen == "triton":
        if not (triton is not None and G.is_cuda):
            raise RuntimeError("newton_schulz impl='triton' needs Triton and a CUDA tensor")
        return _ns_triton(G, steps)
    return _ns_torch(G, steps)


# ---------------------------------------------------------------------------
# Triton kernel: C = alpha · X Xᵀ (+ beta · Y), upper tiles computed, mirrored.
# ---------------------------------------------------------------------------

def _sym_config(rows: int) -> dict:
    """Tile sizes: big tiles for the record's 768-row matrices, smaller ones otherwise."""
    if rows >= 256:
        return dict(BLOCK=128, BLOCK_K=64, num_warps=8, num_stages=3)
    return dict(BLOCK=64, BLOCK_K=64, num_warps=4, num_stages=3)


def sym_matmul(X: Tensor, out: Tensor, alpha: float = 1.0, beta: float = 0.0, add: Tensor | None = None,
               config: dict | None = None) -> Tensor:
    """out = alpha · X Xᵀ + beta · add for a batch X (B, m, k); `add` (B, m, m) must be symmetric.

    Only the upper-triangular output tiles are computed; each is stored at
    (i, j) and mirrored to (j, i). Triton + CUDA only.
    """
    if triton is None:
        raise RuntimeError("sym_matmul needs Triton")
    batch, rows, inner = X.shape
    cfg = config or _sym_config(rows)
    tiles = triton.cdiv(rows, cfg["BLOCK"])
    Y = out if add is None else add
    _sym_kernel[(tiles, tiles, batch)](
        X, out, Y, rows, inner,
        X.stride(0), X.stride(1), X.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        Y.stride(0), Y.stride(1), Y.stride(2),
        alpha, beta,
        ADD=add is not None,
        BLOCK=cfg["BLOCK"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out


if triton is not None:

    @triton.jit
    def _sym_kernel(
        X, C, Y, M, K,
        sxb, sxm, sxk, scb, scm, scn, syb, sym, syn,
        alpha, beta,
        ADD: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        if pid_m > pid_n:  # lower tiles are written by their mirror
            return
        bid = tl.program_id(2).to(tl.int64)
        offs_m = pid_m * BLOCK + tl.arange(0, BLOCK)
        offs_n = pid_n * BLOCK + tl.arange(0, BLOCK)
        offs_k = tl.arange(0, BLOCK_K)
        x = X + bid * sxb
        a_ptrs = x + offs_m[:, None] * sxm + offs_k[None, :] * sxk  # (BLOCK, BLOCK_K) rows m
        b_ptrs = x + offs_n[None, :] * sxm + offs_k[:, None] * sxk  # (BLOCK_K, BLOCK) rows n, transposed
        acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = offs_k + k0 < K
            a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=(offs_n[None, :] < M) & k_ok[:, None], other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * sxk
            b_ptrs += BLOCK_K * sxk
        acc = acc * alpha
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < M)
        if ADD:
            y = tl.load(Y + bid * syb + offs_m[:, None] * sym + offs_n[None, :] * syn, mask=mask, other=0.0)
            acc += beta * y.to(tl.float32)
        tile = acc.to(C.dtype.element_ty)
        c = C + bid * scb
        tl.store(c + offs_m[:, None] * scm + offs_n[None, :] * scn, tile, mask=mask)
        if pid_m < pid_n:  # mirror: C[n, m] = C[m, n]
            tl.store(c + offs_n[None, :] * scm + offs_m[:, None] * scn, tile, mask=mask)
