"""The 2026 record's FP8 products on a GPU (kernels/record_fp8.py) against the float32 reference.

`_scaled_mm` multiplies the same FP8 operands as `record_fp8.reference_product` and differs from it
only in the order (and, with fast accumulation, the precision) of its float32 accumulation: every
product it makes, for each operand pairing the record uses, is held to the reference within a
tolerance stated per output dtype. The whole head and MLP then go through the model's seams:
training logits and gradients with the GPU product against the same functions with the reference
product, and against the bf16 result they stand for.
"""

from __future__ import annotations

import pytest
import torch

from speedrun.model import record_fp8

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _fp8(shape, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, device="cuda", generator=gen) * 4).to(dtype)


@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype", [
    (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16),  # forward products
    (torch.float8_e5m2, torch.float8_e4m3fn, torch.bfloat16),  # the head's grad_x
    (torch.float8_e4m3fn, torch.float8_e5m2, torch.float32),  # the head's grad_W
])
def test_scaled_product_is_the_references(a_dtype, b_dtype, out_dtype):
    from speedrun.kernels.record_fp8 import scaled_product

    a, b_t = _fp8((512, 768), a_dtype, 1), _fp8((1024, 768), b_dtype, 2)
    scale = torch.tensor(0.37, device="cuda")
    got = scaled_product(a, b_t, scale, out_dtype)
    want = record_fp8.reference_product(a, b_t, scale, out_dtype)
    assert got.dtype == out_dtype and got.shape == want.shape
    err = (got.float() - want.float()).abs()
    if out_dtype == torch.bfloat16:  # one rounding of a reordered (fast-accumulated) sum
        assert err.max() <= 2e-2 * want.float().abs().max()
    else:  # a float32 sum in another order: bounded by its terms' magnitudes, element by element
        bound = 1e-4 * (a.float().abs() @ b_t.float().abs().T) * scale
        assert (err <= bound).all(), f"worst excess {(err - bound).max().item():.3g}"


def test_transposed_operands_as_the_head_passes_them():
    from speedrun.kernels.record_fp8 import scaled_product

    x, g = _fp8((256, 768), torch.float8_e4m3fn, 3), _fp8((256, 1024), torch.float8_e5m2, 4)
    scale = torch.tensor(0.5, device="cuda")
    got = scaled_product(x.T, g.T, scale, torch.float32)
    want = record_fp8.reference_product(x.T, g.T, scale, torch.float32)
    # Hopper's FP8 products accumulate in reduced precision inside each block of k even without fast
    # accumulation: measured on an H200 (torch 2.11, 2026-12-06), 1.2e-4 to 1.3e-4 of Σ|a||b| at this
    # k = 256 over three seeds, 1.4e-5 to 1.9e-5 at k = 4,096 (the float32 reference: 3e-8 of it)
    assert ((got - want).abs() <= 2.0**-12 * (x.float().abs().T @ g.float().abs()) * scale).all()


def test_the_model_seams_with_the_gpu_product():
    """Training loss and gradients of a tiny model, FP8 head and MLP: the GPU product against the
    reference product (close), and both against the bf16 model (FP8's own error, looser)."""
    from speedrun.kernels import record_attention
    from speedrun.model.record import RecordGPT, RecordModelConfig

    cfg = RecordModelConfig.tiny()
    n = 1024
    tokens = torch.randint(0, cfg.vocab - 1, (n + 1,), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    cu = torch.tensor([0, 300, 800, n], dtype=torch.int32, device="cuda")
    prefix = torch.full((cfg.vocab,), -1, dtype=torch.int64, device="cuda")
    mtp = torch.tensor([1.0, 0.5], device="cuda")

    def loss_and_grads(product, fp8: bool):
        model = RecordGPT(cfg, device="cuda", generator=torch.Generator().manual_seed(0))
        model.kernels = record_attention.pick("auto", torch.device("cuda"))
        if fp8:
            model.kernels = type(model.kernels)(model.kernels.name, model.kernels.attend, model.kernels.dc, product)
            model.fp8 = record_fp8.Fp8Training(record_fp8.RECORD_FP8, 1.0, cfg.mlp_bank_layers, "cuda")
            model.fp8.refresh(model.mlp_bank, bootstrap=True)
        loss = model.training_loss(tokens[:-1], tokens[1:], cu, (128, 384), 0.1, mtp, 0.0, prefix)
        loss.backward()
        return loss.detach(), {k: p.grad.float() for k, p in model.named_parameters() if p.grad is not None}

    from speedrun.kernels.record_fp8 import scaled_product

    gpu, ref, bf16 = (loss_and_grads(scaled_product, True), loss_and_grads(record_fp8.reference_product, True),
                      loss_and_grads(None, False))
    assert torch.isclose(gpu[0], ref[0], rtol=1e-3)
    assert torch.isclose(gpu[0], bf16[0], rtol=2e-2)
    for name in ("lm_head", "mlp_bank", "qk_bank"):
        g, r = gpu[1][name], ref[1][name]
        assert (g - r).norm() <= 2e-2 * r.norm(), name
