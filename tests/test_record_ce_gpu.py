"""The 2026 record's fused head loss (kernels/record_ce.py) on a GPU, at the record's vocabulary.

The compiled kernel against `record_loss.record_training_loss` on the same bf16 logits: the loss
sum within 1e-5 relative (float32 sums in another order over 8,192 rows), every gradient entry
within two bf16 ulps (the kernel rounds the gradient and then its product with the upstream
gradient; the reference rounds once), with the prefix term and three MTP terms, and compiled.
"""

from __future__ import annotations

import pytest
import torch

from speedrun.data.tokenizer import get_encoding
from speedrun.kernels.record_ce import fused_training_loss
from speedrun.model.record_loss import PADDED_VOCAB, prefix_table, record_training_loss

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("pi,weights", [(0.25, (1.0, 0.5, 0.25)), (0.0, (1.0,))])
@pytest.mark.parametrize("compiled", [False, True])
def test_the_kernel_is_the_reference_at_the_record_s_vocabulary(pi, weights, compiled):
    gen = torch.Generator(device="cuda").manual_seed(0)
    n = 8192
    z = (torch.randn(n, PADDED_VOCAB, device="cuda", generator=gen) * 4).bfloat16().requires_grad_()
    t = torch.randint(0, 50257, (n,), device="cuda", generator=gen)
    prefix = prefix_table(get_encoding(), PADDED_VOCAB).cuda()
    w = torch.tensor(weights, device="cuda")
    p = torch.tensor(pi, device="cuda") if pi else 0.0
    ref = record_training_loss(z, t, w, p, prefix)
    (g_ref,) = torch.autograd.grad(ref * 0.125, z)
    fn = torch.compile(fused_training_loss, fullgraph=True) if compiled else fused_training_loss
    got = fn(z, t, w, p, prefix)
    (g_got,) = torch.autograd.grad(got * 0.125, z)
    assert got.item() == pytest.approx(ref.item(), rel=1e-5)
    diff = (g_got.float() - g_ref.float()).abs()
    assert bool((diff <= 2.0 ** -6 * g_ref.float().abs() + 1e-9).all()), diff.max().item()
