"""The FP8 head against the bfloat16 product it replaces."""

import pytest
import torch

from speedrun.kernels.fp8 import fp8_supported, head_matmul


def test_cpu_falls_back_to_plain_matmul():
    assert not fp8_supported(torch.device("cpu"))
    x, w = torch.randn(5, 8), torch.randn(11, 8)
    torch.testing.assert_close(head_matmul(x, w, use_fp8=False), x @ w.T)


@pytest.mark.gpu
def test_fp8_head_close_to_bf16(cuda):
    if not fp8_supported(cuda):
        pytest.skip("GPU without FP8 matrix products")
    torch.manual_seed(0)
    N, K, M = 4096, 768, 50304
    x = torch.nn.functional.rms_norm(torch.randn(N, K, device=cuda), (K,)).bfloat16().requires_grad_()
    w = (torch.randn(M, K, device=cuda) * 0.02).requires_grad_()
    out = head_matmul(x, w, use_fp8=True)
    g = torch.randn_like(out) * 1e-3
    gx, gw = torch.autograd.grad(out, (x, w), g)
    xr, wr = x.detach().float().requires_grad_(), w.detach().requires_grad_()
    ref = xr @ wr.T
    rx, rw = torch.autograd.grad(ref, (xr, wr), g.float())
    rel = lambda a, b: ((a.float() - b).norm() / b.norm()).item()
    # Stated tolerances: e4m3 forward ~ 2^-4 relative per element, averaged over K;
    # e5m2 gradients ~ 2^-3. Measured values are printed for the record.
    print("fp8 rel errors: out", rel(out, ref), "grad_x", rel(gx, rx), "grad_w", rel(gw, rw))
    assert out.dtype == torch.bfloat16 and gx.dtype == torch.bfloat16 and gw.dtype == torch.float32
    assert rel(out, ref) < 0.05
    assert rel(gx, rx) < 0.1
    assert rel(gw, rw) < 0.1


@pytest.mark.gpu
def test_fp8_head_compiles_whole(cuda):
    if not fp8_supported(cuda):
        pytest.skip("GPU without FP8 matrix products")
    x = torch.randn(256, 768, device=cuda, dtype=torch.bfloat16)
    w = torch.randn(1024, 768, device=cuda) * 0.02
    f = torch.compile(lambda a, b: head_matmul(a, b, True), fullgraph=True)
    torch.testing.assert_close(f(x, w), head_matmul(x, w, True))
