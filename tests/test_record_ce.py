"""The 2026 record's fused head loss (kernels/record_ce.py) against the model's reference loss.

The kernel runs on the CPU through Triton's interpreter, in a subprocess (interpreter_helpers). It
must give `record_loss.record_training_loss`'s sum and, through its saved gradient times the upstream
gradient, autograd's gradient of it: with and without the prefix term, with one to three MTP terms,
with a batch shorter than the terms (the reference drops what lies past the batch), in float32 and
bfloat16, and compiled whole (its fake kernel). The model's seam takes it for bf16 logits only.
"""

import json

import pytest
import torch

from interpreter_helpers import run_interpreted
from speedrun.kernels import record_attention
from speedrun.model.record import RecordGPT, RecordKernels, RecordModelConfig

_INTERPRETED = r'''
import json, torch
from speedrun.kernels.record_ce import MAX_TERMS, fused_training_loss
from speedrun.model.record_loss import record_training_loss

g = torch.Generator().manual_seed(0)
out = {"cases": []}
for dtype in (torch.float32, torch.bfloat16):
    for pi in (torch.tensor(0.3), 0.0):
        for n, k in ((37, 3), (37, 1), (2, 3)):
            z = (torch.randn(n, 300, generator=g) * 8).to(dtype).requires_grad_()
            t = torch.randint(0, 300, (n,), generator=g)
            t[1] = t[0]  # two terms of one row on the same column
            prefix = torch.randint(-1, 300, (300,), generator=g)
            w = torch.tensor([1.0, 0.5, 0.25][:k])
            ref = record_training_loss(z, t, w, pi, prefix)
            (g_ref,) = torch.autograd.grad(ref * 0.7, z)
            got = fused_training_loss(z, t, w if k > 1 else [1.0], pi, prefix)
            (g_got,) = torch.autograd.grad(got * 0.7, z)
            # bf16: the kernel rounds the gradient, then its product with the upstream gradient (two
            # roundings, under two bf16 ulps); the reference rounds once
            ulp = 2.0 ** -6 if dtype == torch.bfloat16 else 1e-6
            bad = ((g_got.float() - g_ref.float()).abs() > ulp * g_ref.float().abs() + 1e-6).sum().item()
            out["cases"].append([str(dtype), float(pi), n, k, ref.item(), got.item(), bad])
with torch.no_grad():
    z = torch.randn(5, 300)
    out["no_grad"] = [fused_training_loss(z, torch.arange(5), [1.0, 0.5], 0.0, torch.zeros(300, dtype=torch.long)).item(),
                      record_training_loss(z, torch.arange(5), [1.0, 0.5], 0.0, torch.zeros(300, dtype=torch.long)).item()]
try:
    fused_training_loss(torch.randn(5, 300), torch.arange(5), [1.0] * (MAX_TERMS + 1), 0.0, torch.zeros(300, dtype=torch.long))
    out["too_many"] = "no error"
except ValueError as e:
    out["too_many"] = str(e)
z = torch.randn(16, 300, dtype=torch.bfloat16, requires_grad=True)
args = (torch.randint(0, 300, (16,), generator=g), torch.tensor([1.0, 0.5]), torch.tensor(0.2),
        torch.randint(-1, 300, (300,), generator=g))
compiled = torch.compile(fused_training_loss, backend="aot_eager", fullgraph=True)
c = compiled(z, *args)
(g_c,) = torch.autograd.grad(c, z)
e = fused_training_loss(z, *args)
(g_e,) = torch.autograd.grad(e, z)
out["compiled"] = [c.item(), e.item(), bool(torch.equal(g_c, g_e))]
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED, timeout=900)


def test_the_kernel_is_the_reference_loss_and_its_gradient(interpreted):
    assert len(interpreted["cases"]) == 12
    for dtype, pi, n, k, ref, got, bad in interpreted["cases"]:
        assert got == pytest.approx(ref, rel=1e-5), (dtype, pi, n, k)
        assert bad == 0, (dtype, pi, n, k)  # every gradient entry within two bf16 ulps (float32: 1e-6)


def test_without_a_gradient_and_past_its_terms(interpreted):
    ref_free, ref = interpreted["no_grad"]
    assert ref_free == pytest.approx(ref, rel=1e-5)
    assert "at most 4 MTP weights" in interpreted["too_many"]


def test_it_compiles_whole(interpreted):
    c, e, same_grad = interpreted["compiled"]
    assert c == e and same_grad


def test_the_model_takes_the_kernel_for_half_precision_logits_only():
    seen = []
    kernels = RecordKernels("spy", loss=lambda z, *a: seen.append(z.dtype) or z.float().sum())
    model = RecordGPT(RecordModelConfig.tiny(), generator=torch.Generator().manual_seed(0))
    model.kernels = kernels
    tokens = torch.randint(0, 100, (33,))
    cu = torch.tensor([0, 20, 32], dtype=torch.int32)
    prefix = torch.full((model.cfg.vocab,), -1)
    for dtype in (torch.float32, torch.bfloat16):
        model.training_loss(tokens[:-1], tokens[1:], cu, (8, 16), 0.1, [1.0], 0.0, prefix, dtype=dtype)
    assert seen == [torch.bfloat16]
    assert record_attention.pick("auto", torch.device("cpu")).loss is None  # the reference on the CPU


def test_the_gpu_choice_names_the_kernel():
    assert json.dumps(sorted(RecordKernels.__dataclass_fields__)) == json.dumps(
        sorted(["name", "attend", "dc", "fp8_product", "loss", "mlp", "head_loss", "mlp_backward"]))
