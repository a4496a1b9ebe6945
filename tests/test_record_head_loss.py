"""The FP8 head and its loss as one operation (`record_ce.fp8_head_training_loss`) against the model's
reference: `record_training_loss` of `record_fp8.fp8_head`'s logits.

The fused path's logit gradient never exists in bf16: the loss kernel writes e5m2(∂loss/∂z / u) and
its transpose, the layouts the head's two gradient products read. Its codes are the float32
gradient's own quantisation, entry for entry (under Triton's interpreter the kernel rounds to e5m2's
grid by hand, as the GPU's cast does, so the interpreter gives the GPU's codes). The reference rounds the gradient to bf16, multiplies by the
upstream gradient and then quantises, so a few of its codes land one step away: the two gradients
differ by about 2 % (of their norm) here, and each is as far from the unquantised gradient as the
other. The model's seam takes the fused path in FP8 training only.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from interpreter_helpers import run_interpreted
from speedrun.model.record import RecordGPT, RecordKernels, RecordModelConfig
from speedrun.model.record_fp8 import Fp8Training, RECORD_FP8

_INTERPRETED = textwrap.dedent(r'''
    import json
    import torch
    from speedrun.kernels.record_ce import fp8_head_training_loss, launch
    from speedrun.model.record_fp8 import RECORD_FP8 as cfg, fp8_head, saturating_e5m2
    from speedrun.model.record_loss import record_training_loss

    g = torch.Generator().manual_seed(0)
    N, D, V = 75, 32, 300   # 75 rows: a partial last row block
    x0 = (torch.randn(N, D, generator=g) * 6).bfloat16()
    w0 = (torch.randn(D, V, generator=g) * 0.1).bfloat16()  # w/w_s within e4m3
    t = torch.randint(0, V, (N,), generator=g)
    t[1] = t[0]
    prefix = torch.randint(-1, V, (V,), generator=g)
    weights, pi = torch.tensor([1.0, 0.5, 0.25]), torch.tensor(0.3)
    out = {}

    def grads(fn, upstream):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        loss = fn(x, w)
        gx, gw = torch.autograd.grad(loss * upstream, (x, w))
        return loss.item(), gx.float(), gw.float()

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    for upstream in (0.5, 0.3):
        ref = grads(lambda x, w: record_training_loss(fp8_head(x, w, upstream, cfg), t, weights, pi, prefix), upstream)
        got = grads(lambda x, w: fp8_head_training_loss(x, w, t, weights, pi, prefix, cfg), upstream)
        out[str(upstream)] = [ref[0], got[0], rel(got[1], ref[1]), rel(got[2], ref[2])]

    # the codes: the kernel's pair against the float32 gradient's own quantisation
    z = fp8_head(x0, w0, 1.0, cfg).detach()
    zr = z.float().requires_grad_()
    (exact,) = torch.autograd.grad(record_training_loss(zr, t, weights, pi, prefix), zr)
    want = saturating_e5m2(exact / cfg.head_grad_factor).float()
    _, g8, g8t = launch(z, t, weights, pi.reshape(1), prefix, True, True, 1.0 / cfg.head_grad_factor)
    got8 = g8.float()
    out["codes"] = [bool(torch.equal(g8t.T.float(), got8)), bool(torch.equal(got8, want)),
                    g8.dtype == g8t.dtype == torch.float8_e5m2, (want != 0).float().mean().item()]
    _, big, big_t = launch(z, t, weights, pi.reshape(1), prefix, True, True, 1e9)
    out["saturates"] = [big.float().abs().max().item(), bool(big.float().isfinite().all())]

    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    compiled = torch.compile(fp8_head_training_loss, backend="aot_eager", fullgraph=True)
    c = compiled(x, w, t, weights, pi, prefix, cfg)
    cg = torch.autograd.grad(c, (x, w))
    e = fp8_head_training_loss(x, w, t, weights, pi, prefix, cfg)
    eg = torch.autograd.grad(e, (x, w))
    out["compiled"] = [c.item() == e.item(), all(torch.equal(a, b) for a, b in zip(cg, eg))]

    # the tiny model in FP8 training: the fused path through the seam against the references
    from speedrun.kernels.record_ce import fused_training_loss
    from speedrun.model.record import RecordGPT, RecordKernels, RecordModelConfig
    from speedrun.model.record_fp8 import Fp8Training
    model = RecordGPT(RecordModelConfig.tiny(), generator=torch.Generator().manual_seed(0))
    model.fp8 = Fp8Training(cfg, head_grad_scale=0.5, mlp_layers=0)
    tokens = torch.randint(0, 127, (65,), generator=g)
    cu = torch.tensor([0, 40, 64], dtype=torch.int32)

    def model_grads(kernels):
        model.kernels = kernels
        model.zero_grad()
        loss = model.training_loss(tokens[:-1], tokens[1:], cu, (8, 16), 0.1, [1.0, 0.5], 0.0,
                                   torch.full((128,), -1), dtype=torch.bfloat16)
        (loss * 0.5).backward()
        return loss.item(), model.lm_head.grad.float().clone(), model.embed.grad.float().clone()

    ref = model_grads(RecordKernels())
    got = model_grads(RecordKernels(loss=fused_training_loss, head_loss=fp8_head_training_loss))
    out["model"] = [ref[0], got[0], rel(got[1], ref[1]), rel(got[2], ref[2])]
    print("RESULT " + json.dumps(out))
''')


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED, timeout=900)


@pytest.mark.parametrize("upstream", ["0.5", "0.3"])
def test_loss_and_gradients_are_the_reference_s(interpreted, upstream):
    ref_loss, loss, rel_x, rel_w = interpreted[upstream]
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert rel_x < 0.04 and rel_w < 0.04, (rel_x, rel_w)


def test_the_e5m2_pair_is_the_float32_gradient_quantised(interpreted):
    transposed, equal, is_e5m2, nonzero = interpreted["codes"]
    assert transposed and equal and is_e5m2
    assert nonzero > 0.5  # the comparison is not of zeros


def test_the_gradient_saturates_instead_of_overflowing(interpreted):
    largest, finite = interpreted["saturates"]
    assert finite and largest == 57344.0


def test_it_compiles_whole(interpreted):
    assert interpreted["compiled"] == [True, True]


def test_the_model_trains_through_it_as_through_the_references(interpreted):
    ref_loss, loss, rel_head, rel_embed = interpreted["model"]
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert rel_head < 0.04 and rel_embed < 0.04, (rel_head, rel_embed)


def _spy_model():
    seen = []
    kernels = RecordKernels("spy", head_loss=lambda h, *a: seen.append("fused") or h.float().sum(),
                            loss=lambda z, *a: seen.append("loss") or z.float().sum())
    model = RecordGPT(RecordModelConfig.tiny(), generator=torch.Generator().manual_seed(0))
    model.kernels = kernels
    return model, seen


def test_the_model_takes_the_fused_path_in_fp8_training_only():
    model, seen = _spy_model()
    tokens = torch.randint(0, 100, (33,))
    cu = torch.tensor([0, 20, 32], dtype=torch.int32)
    prefix = torch.full((model.cfg.vocab,), -1)
    args = (tokens[:-1], tokens[1:], cu, (8, 16), 0.1, [1.0], 0.0, prefix)
    model.training_loss(*args, dtype=torch.bfloat16)  # no FP8: the loss kernel on bf16 logits
    model.fp8 = Fp8Training(RECORD_FP8, head_grad_scale=0.5, mlp_layers=0)
    model.training_loss(*args, dtype=torch.bfloat16)
    model.training_loss(*args, dtype=torch.float32)  # float32 h: the FP8 head's bf16 logits, the loss kernel
    model.eval()
    with torch.no_grad():
        model.training_loss(*args, dtype=torch.bfloat16)
    assert seen == ["loss", "fused", "loss", "loss"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs a GPU with FP8")
def test_at_the_record_s_size_on_a_gpu():
    from speedrun.data.tokenizer import get_encoding
    from speedrun.kernels.record_ce import fp8_head_training_loss, launch
    from speedrun.kernels.record_fp8 import scaled_product
    from speedrun.model.record_fp8 import fp8_head, saturating_e5m2
    from speedrun.model.record_loss import PADDED_VOCAB, prefix_table, record_training_loss

    gen = torch.Generator(device="cuda").manual_seed(0)
    n, d, up = 8192, 768, 0.125
    x0 = (torch.randn(n, d, device="cuda", generator=gen) * 6).bfloat16()
    w0 = (torch.randn(d, PADDED_VOCAB, device="cuda", generator=gen) * 0.05).bfloat16()  # w/w_s within e4m3
    t = torch.randint(0, 50257, (n,), device="cuda", generator=gen)
    prefix = prefix_table(get_encoding(), PADDED_VOCAB).cuda()
    w, pi = torch.tensor([1.0, 0.5, 0.25], device="cuda"), torch.tensor(0.25, device="cuda")

    def run(fn):
        x, lm = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        loss = fn(x, lm)
        return loss.item(), *(g.float() for g in torch.autograd.grad(loss * up, (x, lm)))

    ref = run(lambda x, lm: record_training_loss(fp8_head(x, lm, up, RECORD_FP8, scaled_product), t, w, pi, prefix))
    fused = torch.compile(fp8_head_training_loss, fullgraph=True)
    got = run(lambda x, lm: fused(x, lm, t, w, pi, prefix, RECORD_FP8, scaled_product))
    assert got[0] == pytest.approx(ref[0], rel=1e-5)
    for a, b in zip(got[1:], ref[1:]):
        assert ((a - b).norm() / b.norm()).item() < 0.04

    z = fp8_head(x0, w0, 1.0, RECORD_FP8, scaled_product)
    zr = z.float().requires_grad_()
    (exact,) = torch.autograd.grad(record_training_loss(zr, t, w, pi, prefix), zr)
    want = saturating_e5m2(exact / RECORD_FP8.head_grad_factor)
    _, g8, g8t = launch(z, t, w, pi.reshape(1), prefix, True, True, 1.0 / RECORD_FP8.head_grad_factor)
    assert torch.equal(g8t.T.float(), g8.float())
    # the kernel's exp and the reference's differ in the last bits: a code on a rounding boundary may flip
    assert (g8.float() == want.float()).float().mean().item() > 0.999
