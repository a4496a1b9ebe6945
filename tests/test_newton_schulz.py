"""Newton–Schulz: the bf16 fast path against the float32 reference, and the orthogonality it reaches.

Tolerances (measured on CPU, torch bf16): relative Frobenius error of the
bf16 path vs the float32 reference is 1.1–1.6 % on random Gaussian inputs,
so 3 % is asserted. The quintic does not converge to exactly 1: singular
values of the output land in about [0.68, 1.20] for inputs whose singular
values are not tiny, so [0.5, 1.5] is asserted for well-conditioned inputs;
square Gaussian matrices have a few near-zero singular values that five
steps cannot lift, so there only most (≥ 95 %) must land in range.
"""

import pytest
import torch

from speedrun.optim.newton_schulz import newton_schulz, newton_schulz_reference, pick_impl

FAST_TOL = 3e-2
SHAPES = [(6, 12), (12, 6), (64, 64), (96, 384), (384, 96), (2, 3, 32, 48), (3, 256, 256)]  # record sizes: the GPU test below


def rel_err(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def svdvals(x):
    return torch.linalg.svdvals(x.float().reshape(-1, *x.shape[-2:]))


def conditioned(m, n, lo=0.1, seed=0):
    """A random m×n matrix whose singular values are uniform in [lo, 1]."""
    g = torch.Generator().manual_seed(seed)
    k = min(m, n)
    U, _ = torch.linalg.qr(torch.randn(m, k, generator=g))
    V, _ = torch.linalg.qr(torch.randn(n, k, generator=g))
    s = lo + (1 - lo) * torch.rand(k, generator=g)
    return U @ torch.diag(s) @ V.T


@pytest.mark.parametrize("shape", SHAPES)
def test_fast_path_matches_reference(shape):
    G = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    fast = newton_schulz(G, impl="torch")
    ref = newton_schulz_reference(G)
    assert fast.shape == G.shape and fast.dtype == torch.bfloat16
    assert ref.dtype == torch.float32
    assert rel_err(fast, ref) < FAST_TOL


def test_auto_is_torch_on_cpu():
    G = torch.randn(64, 64)
    assert pick_impl(G) == "torch"
    assert torch.equal(newton_schulz(G), newton_schulz(G, impl="torch"))


def test_bad_impl_refused():
    with pytest.raises(ValueError):
        newton_schulz(torch.randn(4, 4), impl="cuda")


def test_reference_is_per_matrix():
    G = torch.randn(3, 16, 40)
    batched = newton_schulz_reference(G)
    for i in range(3):
        torch.testing.assert_close(batched[i], newton_schulz_reference(G[i]), rtol=1e-5, atol=1e-6)


def test_reference_math_by_hand():
    """One step of the formula, written out, for a tall matrix (worked on its transpose)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    G = torch.randn(10, 4, dtype=torch.float64)
    X = G.T / (G.norm() + 1e-7)
    A = X @ X.T
    X = a * X + (b * A + c * A @ A) @ X
    torch.testing.assert_close(newton_schulz_reference(G, steps=1), X.T.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("m,n", [(64, 64), (128, 128), (48, 192), (192, 48)])
@pytest.mark.parametrize("impl", ["torch", "reference"])
def test_singular_values_in_band(m, n, impl):
    sv = svdvals(newton_schulz(conditioned(m, n), impl=impl))
    assert sv.min() > 0.5 and sv.max() < 1.5


@pytest.mark.parametrize("shape", [(128, 128), (4, 64, 64), (64, 256)])
def test_gaussian_mostly_in_band(shape):
    sv = svdvals(newton_schulz(torch.randn(shape, generator=torch.Generator().manual_seed(2))))
    assert sv.max() < 1.5
    assert ((sv > 0.5) & (sv < 1.5)).float().mean() >= 0.95


def test_zero_matrix_stays_zero():
    assert newton_schulz(torch.zeros(8, 16)).abs().max() == 0


# --------------------------------------------------------------------------- GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("shape", [(768, 768), (768, 3072), (3072, 768), (22, 768, 768), (4, 768, 768),
                                   (6, 12), (100, 300), (2, 200, 200), (130, 130)])
def test_triton_matches_reference(shape):
    pytest.importorskip("triton")
    G = torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    ref = newton_schulz_reference(G)
    fast = newton_schulz(G, impl="auto")
    assert fast.dtype == torch.bfloat16
    assert rel_err(fast, ref) < FAST_TOL
    if min(shape[-2:]) >= 64:
        assert pick_impl(G) == "triton"
        assert rel_err(newton_schulz(G, impl="triton"), newton_schulz(G, impl="torch")) < FAST_TOL


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("rows,inner", [(768, 768), (768, 3072), (200, 70), (64, 64)])
def test_sym_matmul_kernel(rows, inner):
    pytest.importorskip("triton")
    from speedrun.optim.newton_schulz import sym_matmul
    X = torch.randn(3, rows, inner, device="cuda", dtype=torch.bfloat16) / inner**0.5
    out = torch.empty(3, rows, rows, device="cuda", dtype=torch.bfloat16)
    ref = (X.float() @ X.float().mT)
    torch.testing.assert_close(sym_matmul(X, out=out).float(), ref, rtol=2e-2, atol=2e-2)
    A = ref.bfloat16()
    ref2 = 2.0315 * A.float() @ A.float() - 4.775 * A.float()
    got = sym_matmul(A, out=torch.empty_like(A), alpha=2.0315, beta=-4.775, add=A).float()
    assert rel_err(got, ref2) < 1e-2


@pytest.mark.gpu
@gpu
def test_triton_under_torch_compile():
    pytest.importorskip("triton")
    G = torch.randn(4, 768, 768, device="cuda")
    compiled = torch.compile(lambda x: newton_schulz(x, impl="triton"), fullgraph=True)
    assert rel_err(compiled(G), newton_schulz_reference(G)) < FAST_TOL
