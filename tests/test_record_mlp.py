"""The 2026 record's bf16 MLP on `relu2_mlp`'s kernels (kernels/record_attention.relu2_product) against
`record_fp8.mlp_reference`, and the model's `mlp` seam that reaches them.

The record's bf16 MLP is relu(a·W1ᵀ)²·W2 with W2 held (hidden, width); the kernels take W2ᵀ. On the
CPU the kernels run under Triton's interpreter (in a subprocess, interpreter_helpers.py), whose
float32 -> bfloat16 rounding truncates, hence the slack; on a GPU they are held to the reference at
the record's size. The seam: a bf16 forward calls `RecordKernels.mlp` on every layer, a float32 one
and an FP8 training forward do not.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import Tensor

from interpreter_helpers import run_interpreted
from speedrun.kernels import record_attention
from speedrun.model import record_fp8
from speedrun.model.record import RecordGPT, RecordKernels, RecordModelConfig

_INTERPRETED = textwrap.dedent(r'''
    import json
    import torch
    from speedrun.kernels.record_attention import relu2_backward, relu2_product
    from speedrun.model.record_fp8 import mlp_backward_bf16, mlp_reference

    g = torch.Generator().manual_seed(0)
    N, D, F = 72, 64, 256   # 72 rows: a partial last row block
    a = torch.randn(N, D, generator=g).bfloat16().requires_grad_()
    w1 = (torch.randn(F, D, generator=g) / 8).bfloat16().requires_grad_()
    w2 = (torch.randn(F, D, generator=g) / 16).bfloat16().requires_grad_()
    gy = torch.randn(N, D, generator=g).bfloat16()

    def run(fn):
        y = fn(a, w1, w2)
        return [y, *torch.autograd.grad(y, (a, w1, w2), gy)]

    got = run(lambda *t: relu2_product(*t, impl="triton"))
    want = run(mlp_reference)
    rel = [((x.double() - y.double()).abs().max() / y.double().abs().max()).item() for x, y in zip(got, want)]

    # the FP8 MLP's bf16 backward (its post from a bf16 pre, as the FP8 up product gives it)
    post = torch.nn.functional.relu(a.detach() @ w1.detach().T).float().square().bfloat16()
    args = (gy, a.detach(), w1.detach(), w2.detach(), post)
    got_b, want_b = relu2_backward(*args), mlp_backward_bf16(*args)
    rel_b = [((x.double() - y.double()).abs().max() / y.double().abs().max()).item() for x, y in zip(got_b, want_b)]
    print("RESULT " + json.dumps(dict(rel=rel, dtypes=[str(t.dtype) for t in got],
                                      shapes=[list(t.shape) for t in got], rel_backward=rel_b,
                                      shapes_backward=[[list(x.shape), list(y.shape)] for x, y in zip(got_b, want_b)])))
''')


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED)


def test_interpreted_kernels_are_the_reference_mlp(interpreted):
    assert interpreted["dtypes"] == ["torch.bfloat16"] * 4
    assert interpreted["shapes"] == [[72, 64], [72, 64], [256, 64], [256, 64]]
    # a few bfloat16 steps: the interpreter truncates where the reference rounds, twice in a row
    assert max(interpreted["rel"]) < 0.03, interpreted["rel"]


def test_interpreted_backward_is_the_fp8_mlp_s_bf16_backward(interpreted):
    assert interpreted["shapes_backward"] == [[[72, 64]] * 2, [[256, 64]] * 2, [[256, 64]] * 2]
    assert max(interpreted["rel_backward"]) < 0.03, interpreted["rel_backward"]


def _tiny(device: str = "cpu") -> tuple[RecordGPT, tuple]:
    model = RecordGPT(RecordModelConfig.tiny(), device=device, generator=torch.Generator().manual_seed(0))
    n = 256
    tokens = torch.randint(0, 127, (n,), generator=torch.Generator().manual_seed(1)).to(device)
    cu = torch.tensor([0, 100, n], dtype=torch.int32, device=device)
    return model, (tokens, cu, (32, 96), 0.1)


def test_the_bf16_forward_reaches_the_seam_on_every_layer():
    model, args = _tiny()
    calls = []

    def spy(a, w1, w2):
        calls.append((a.dtype, tuple(w1.shape), tuple(w2.shape)))
        return record_fp8.mlp_reference(a, w1, w2)

    with torch.no_grad():
        want = model(*args, dtype=torch.bfloat16)
        model.kernels = RecordKernels(mlp=spy)
        got = model(*args, dtype=torch.bfloat16)
        assert len(calls) == model.cfg.num_layers
        assert set(calls) == {(torch.bfloat16, (384, 96), (384, 96))}
        # the reference's function (its products rounded where the model's are)
        assert (got.float() - want.float()).abs().max() <= 2e-2 * want.float().abs().max()
        calls.clear()
        model(*args, dtype=torch.float32)
        assert calls == []  # float32 stays on the model's own expression


def test_an_fp8_training_forward_does_not_reach_the_seam():
    model, args = _tiny()
    model.fp8 = record_fp8.Fp8Training(record_fp8.RECORD_FP8, None, model.cfg.mlp_bank_layers)
    model.fp8.refresh(model.mlp_bank, bootstrap=True)
    calls = []
    model.kernels = RecordKernels(mlp=lambda *t: calls.append(1) or record_fp8.mlp_reference(*t))
    with torch.no_grad():
        model.train()
        model(*args, dtype=torch.bfloat16)
        assert calls == []
        model.eval()  # evaluation is bf16: the seam serves it
        model(*args, dtype=torch.bfloat16)
        assert len(calls) == model.cfg.num_layers


def test_an_fp8_training_backward_reaches_the_backward_seam_on_every_layer():
    model, args = _tiny()
    model.fp8 = record_fp8.Fp8Training(record_fp8.RECORD_FP8, None, model.cfg.mlp_bank_layers)
    model.fp8.refresh(model.mlp_bank, bootstrap=True)
    calls = []

    def spy(*t):
        calls.append(tuple(x.dtype for x in t))
        return record_fp8.mlp_backward_bf16(*t)

    def grad(kernels):
        model.kernels = kernels
        model.zero_grad()
        model(*args, dtype=torch.bfloat16).float().square().sum().backward()
        return model.mlp_bank.grad.clone()

    model.train()
    want = grad(RecordKernels())
    got = grad(RecordKernels(mlp_backward=spy))
    assert calls == [(torch.bfloat16,) * 5] * model.cfg.num_layers
    assert torch.equal(got, want)  # the seam passes the reference's own function through


def test_the_choice_on_the_cpu():
    kernels = record_attention.pick("auto", torch.device("cpu"))
    assert kernels.mlp is None and kernels.mlp_backward is None


def _record_layer() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One layer of one micro-step on the GPU: the normed input (49,152, 768), W1 and W2 (3,072, 768) at
    the record's init bound, and an upstream gradient (49,152, 768), all bf16."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, d, f = 49152, 768, 3072
    a = torch.nn.functional.rms_norm(torch.randn(n, d, device="cuda", generator=gen), (d,)).bfloat16()
    bound = 3**0.5 * 0.5 * d**-0.5
    w1, w2 = (((torch.rand(f, d, device="cuda", generator=gen) * 2 - 1) * bound).bfloat16() for _ in range(2))
    return a, w1, w2, (torch.randn(n, d, device="cuda", generator=gen) * 1e-3).bfloat16()


def _assert_bf16_close(got, want) -> None:
    """Pairwise: bf16, one shape, within 1 % of the largest value, and at most a fifth of entries apart
    (products summed in other orders move a few values by a bfloat16 step)."""
    for x, y in zip(got, want, strict=True):
        assert x.dtype == y.dtype == torch.bfloat16 and x.shape == y.shape
        rel = ((x.float() - y.float()).abs().max() / y.float().abs().max()).item()
        assert rel < 1e-2, rel
        assert (x != y).float().mean().item() < 0.2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_kernels_at_record_size():
    """One layer of one micro-step (49,152 tokens, 768 -> 3,072 -> 768) against the eager reference,
    forward and gradients: the products sum in other orders, so a few bfloat16 values differ by a step."""
    pytest.importorskip("triton")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the kernels serve capability 9.0")
    assert record_attention.pick("auto", torch.device("cuda")).mlp is record_attention.relu2_product
    a, w1, w2, gy = _record_layer()

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in (a, w1, w2)]
        y = fn(*leaves)
        return [y, *torch.autograd.grad(y, leaves, gy)]

    _assert_bf16_close(run(record_attention.relu2_product), run(record_fp8.mlp_reference))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_fp8_mlp_backward_at_record_size():
    """The FP8 MLP's bf16 backward by the kernel against `mlp_backward_bf16`, one layer of one
    micro-step: the products sum in other orders, so a few bfloat16 values differ by a step."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the kernels serve capability 9.0")
    assert record_attention.pick("auto", torch.device("cuda")).mlp_backward is record_attention.relu2_backward
    a, w1, w2, g = _record_layer()
    post = (a @ w1.T).float().relu().square().bfloat16()
    _assert_bf16_close(record_attention.relu2_backward(g, a, w1, w2, post),
                       record_fp8.mlp_backward_bf16(g, a, w1, w2, post))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_model_with_the_mlp_kernels_is_the_references():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the kernels serve capability 9.0")
    model, args = _tiny("cuda")
    tokens, cu, windows, scale = args
    targets = torch.roll(tokens, -1)

    def loss_and_grads(kernels):
        model.kernels = kernels
        model.zero_grad()
        loss = model.training_loss(tokens, targets, cu, windows, scale, [1.0], 0.0, torch.zeros(128, device="cuda"),
                                   dtype=torch.bfloat16)
        loss.backward()
        return loss.detach(), model.mlp_bank.grad.float().clone()

    want_loss, want_grad = loss_and_grads(RecordKernels())
    got_loss, got_grad = loss_and_grads(RecordKernels(mlp=record_attention.relu2_product))
    assert abs(got_loss.item() - want_loss.item()) <= 1e-2 * abs(want_loss.item())
    assert (got_grad - want_grad).abs().max() <= 5e-2 * want_grad.abs().max()
