"""The warp-specialised Gluon ReLU² backward product (relu2_gluon.py) and where relu2_mlp uses it.

Gluon has no CPU interpreter, so on the CPU the kernel is compiled for sm_90 with Triton's own ptxas
(no GPU needed) and checked for spills and shared memory; the GPU tests hold its output to the
plain-Triton kernel's and to the epilogue math on cuBLAS's product, bit for bit.
"""

import pytest
import torch

from speedrun.kernels import relu2_mlp as R


def _gluon():
    pytest.importorskip("triton")
    from speedrun.kernels import relu2_gluon as G
    if not G.available():
        pytest.skip("Triton's Gluon (Hopper) does not import here")
    return G


def test_compiles_for_hopper_without_spills():
    """The kernel compiles for sm_90 with no local memory (spills) and fits the H200's 227 KB of shared
    memory per block; 12 warps (two consumer warpgroups and the epilogue's)."""
    G = _gluon()
    kernel = G.compile_offline()
    usage = G.resource_usage(kernel.asm["cubin"])
    assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0, usage
    assert kernel.metadata.shared <= 227 * 1024, kernel.metadata.shared
    assert kernel.metadata.num_warps == 12
    assert "wgmma.mma_async" in kernel.asm["ptx"] and "setmaxnreg" in kernel.asm["ptx"]


def test_backward_runs_it_where_it_compiles(monkeypatch):
    """relu2_mlp's backward: the Gluon kernel where `use_gluon` says, the Triton kernel where it is not
    used (not a capability-9.0 GPU) or cannot be compiled (try_launch False); the forward never."""
    from speedrun.kernels import relu2_gluon as G
    assert not R.use_gluon(torch.device("cpu"))  # the interpreter's kernel stays on the CPU
    triton = []
    monkeypatch.setattr(R, "backward_product", lambda *args: triton.append(args))
    monkeypatch.setattr(R, "use_gluon", lambda device: True)
    t = torch.zeros(1)
    for compiles in (True, False):
        monkeypatch.setattr(G, "try_launch", lambda *args, ok=compiles: ok)
        R._backward_g_h(t, t, t, t)
    assert len(triton) == 1
    monkeypatch.setattr(R, "use_gluon", lambda device: False)
    monkeypatch.setattr(G, "try_launch", lambda *args: pytest.fail("the Gluon kernel where not used"))
    R._backward_g_h(t, t, t, t)
    assert len(triton) == 2


def test_a_kernel_that_cannot_compile_falls_back_once(monkeypatch):
    """try_launch: a compile failure (another Triton's Gluon) warns once, is remembered, returns False."""
    from speedrun.kernels import relu2_gluon as G
    calls = []

    def broken(*args, **kwargs):
        calls.append(args)
        raise TypeError("warp_specialize() got an unexpected keyword argument")

    monkeypatch.setattr(G, "launch", broken)
    monkeypatch.setattr(G, "_FAILED", [])
    args = (torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1))
    with pytest.warns(RuntimeWarning, match="using the Triton kernel"):
        assert G.try_launch(*args) is False
    assert G.try_launch(*args) is False and len(calls) == 1  # not retried
    assert G._FAILED[0].startswith("TypeError")


def _epilogue_reference(p, h=None):
    """relu2_mlp._epilogue's math from the bfloat16 product p: a, or g (with h)."""
    pf = p.float()
    if h is None:
        return (pf.clamp_min(0.0) ** 2).bfloat16()
    hf = h.float()
    return torch.where(hf > 0, pf * (2.0 * hf), 0.0).bfloat16()


@pytest.mark.gpu
@pytest.mark.parametrize("M,K,N", [(49152, 768, 3072), (1000, 200, 392), (77, 64, 264), (20000, 256, 1000)])
def test_gpu_matches_triton_kernel_and_epilogue_math(cuda, M, K, N):
    """At the record's shape and ragged ones (the last with several tiles per program and a ragged last
    tile): g from the saved a equals the Triton kernel's and the epilogue math applied to cuBLAS's
    product (the same 64-wide k-steps in the same order), and the Triton forward's a the math applied
    to cuBLAS's h, bit for bit."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernel's wgmma needs compute capability 9.0")
    G = _gluon()
    g = torch.Generator("cuda").manual_seed(M)
    x, gy = (torch.randn(M, K, generator=g, device="cuda").bfloat16() for _ in range(2))
    w1 = (torch.randn(N, K, generator=g, device="cuda") / K**0.5).bfloat16()
    w2 = (torch.randn(K, N, generator=g, device="cuda") / K**0.5).bfloat16()
    a = torch.full((M, N), 7.0, dtype=torch.bfloat16, device="cuda")
    R.forward_product(x, w1, a)
    gluon, triton = (torch.full_like(a, 7.0) for _ in range(2))
    G.launch(gy, w2, a, gluon)
    R.backward_product(gy, w2, a, triton)
    torch.cuda.synchronize()
    h_ref = x @ w1.T
    g_ref = _epilogue_reference(gy @ w2, h_ref)
    for got, ref, what in ((a, _epilogue_reference(h_ref), "a"), (gluon, triton, "g against Triton's"),
                           (gluon, g_ref, "g")):
        assert torch.equal(got, ref), (what, (got != ref).float().mean().item())
