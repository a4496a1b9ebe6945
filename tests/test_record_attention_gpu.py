"""The 2026 record's GPU attention (kernels/record_attention.py) against `reference_attention`.

Per packed document, causal, query i sees keys i - w ... i: FlashAttention varlen with window (w, 0)
must give the reference's output and gradients up to bfloat16 rounding, at windows from 0 (a token
sees itself) past the longest document, with empty trailing documents, and for the paired layers'
doubled rows. On the CPU only the choice is tested: no kernel there, and none under
`train.kernels=reference`.
"""

from __future__ import annotations

import pytest
import torch

from record_standins import dc_by_attention
from speedrun.kernels import record_attention
from speedrun.model import record_parts

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_the_choice():
    from speedrun.model.record import RecordKernels

    assert record_attention.pick("auto", torch.device("cpu")) == RecordKernels()
    assert record_attention.pick("reference", torch.device("cuda")) == RecordKernels()


def _inputs(n: int, heads: int, dim: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(n, heads, dim, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_()
            for _ in range(3)]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("window", [0, 1, 127, 383, 5000])
def test_varlen_matches_the_reference(window):
    n = 3000
    cu = torch.tensor([0, 700, 701, 2048, 2500, n, n, n], dtype=torch.int32, device="cuda")
    q, k, v = _inputs(n, 6, 128, window)
    scale = 0.12
    got = record_attention.varlen_attend(q, k, v, cu, window, scale)
    assert torch.equal(got, record_attention.varlen_attend(q, k, v, cu, window, scale, longest=2048))
    want = record_parts.reference_attention(q.float(), k.float(), v.float(), cu, window, scale)
    assert (got.float() - want).abs().max() < 2e-2
    grad = torch.randn_like(want)
    g_got = torch.autograd.grad(got.float(), (q, k, v), grad)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = record_parts.reference_attention(q32, k32, v32, cu, window, scale)
    g_want = torch.autograd.grad(ref, (q32, k32, v32), grad)
    for a, b in zip(g_got, g_want):
        assert (a.float() - b).abs().max() <= 3e-2 * b.abs().max() + 1e-5  # window 0: q, k get no gradient


@pytest.mark.gpu
@gpu
def test_the_model_forward_is_the_references_on_the_gpu():
    from speedrun.model.record import RecordGPT, RecordModelConfig

    torch.manual_seed(0)
    model = RecordGPT(RecordModelConfig.tiny(), device="cuda", generator=torch.Generator().manual_seed(0))
    n = 1024
    tokens = torch.randint(0, 127, (n,), device="cuda")
    cu = torch.tensor([0, 300, 800, n], dtype=torch.int32, device="cuda")
    args = (tokens, cu, (128, 384), 0.1)
    with torch.no_grad():
        want = model(*args, dtype=torch.bfloat16).float()
        model.kernels = record_attention.pick("auto", torch.device("cuda"))
        got = model(*args, dtype=torch.bfloat16).float()
        bounded = model(*args, dtype=torch.bfloat16, longest=500).float()
    assert torch.equal(got, bounded)
    assert (got - want).abs().max() <= 5e-2 * want.abs().max()


def test_dc_through_an_attention_function_is_the_references():
    """The kernel's DC form, with the reference attention as its function, on the CPU in float32."""
    gen = torch.Generator().manual_seed(3)
    n, heads, dim = 300, 6, 16
    q, k, v = (torch.randn(n, heads, dim, generator=gen) for _ in range(3))
    w1, w2 = torch.randn(n, heads, generator=gen), torch.randn(n, heads, generator=gen)
    cu = torch.tensor([0, 150, 151, 290, n, n], dtype=torch.int32)  # one document longer than 112 keys
    want = record_parts.dc_correction(q, k, v, cu, w1, w2, 0.2)
    def reference(q, k, v, cu, window, scale, longest):
        return record_parts.reference_attention(q, k, v, cu, window, scale)

    got = dc_by_attention(reference, q, k, v, cu, w1, w2, 0.2)
    assert got.dtype == torch.float32 and torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    batched = dc_by_attention(reference, q[None], k[None], v[None], cu,
                                               w1[None], w2[None], 0.2)
    assert torch.equal(batched[0], got)
