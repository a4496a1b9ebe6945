"""The weight gradients' BLAS library (`model.wgrad_blas`, blas.py).

On the CPU the library does not apply, so every choice must give F.linear's output and gradients bit for
bit, eager and compiled, and the model must train the same. On a GPU the products under cuBLASLt must be
the cuBLAS ones up to rounding, with PyTorch's preference put back after each.
"""

import pytest
import torch
import torch.nn.functional as F

from speedrun.kernels import blas

from speedrun.kernels import relu2_mlp
from speedrun.config import validate
from speedrun.errors import ConfigError
from speedrun.recipes.presets import demo

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_library_for_each_choice():
    big, small = 768 * 2304, 768 * 768
    assert blas.library_for("cublas", big) == "cublas"
    assert blas.library_for("cublaslt", small) == "cublaslt"
    assert blas.library_for("auto", big) == "cublaslt" and blas.library_for("auto", 768 * 3072) == "cublaslt"
    assert blas.library_for("auto", small) == "cublas"  # the output projection: slower on cuBLASLt
    with pytest.raises(ValueError, match="model.wgrad_blas='lt'"):
        blas.library_for("lt", big)


def test_config_takes_the_choices_and_names_a_wrong_one():
    for choice in blas.WGRAD_CHOICES:
        cfg = demo()
        cfg.model.wgrad_blas = choice
        validate(cfg)
    cfg = demo()
    cfg.model.wgrad_blas = "cublasLt"
    with pytest.raises(ConfigError, match="model.wgrad_blas: must be cublas, cublaslt or auto, got 'cublasLt'"):
        validate(cfg)


def _grads(fn, x, w):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fn(x, w)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3), dtype=y.dtype)
    return (y.detach(), *torch.autograd.grad(y, (x, w), gy))


@pytest.mark.parametrize("choice", blas.WGRAD_CHOICES)
def test_linear_is_f_linear_on_the_cpu(choice):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 32, generator=g).bfloat16()
    w = torch.randn(1100, 32, generator=g).bfloat16()  # 35,200 elements: below auto's threshold
    w_big = torch.randn(32768, 32, generator=g).bfloat16()  # 2^20 elements: at it
    for weight in (w, w_big):
        want = _grads(F.linear, x, weight)
        got = _grads(lambda a, b: blas.linear(a, b, wgrad=choice), x, weight)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_compiled_linear_calls_the_op_and_gives_f_linear_gradients(monkeypatch):
    calls = []
    plain = blas.mm
    monkeypatch.setattr(blas, "mm", lambda a, b, library: calls.append(library) or plain(a, b, library))
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(64, 48, generator=g), torch.randn(40, 48, generator=g)
    compiled = torch.compile(lambda a, b: blas.linear(a, b, wgrad="cublaslt"), fullgraph=True)
    got = _grads(compiled, x, w)
    assert calls == ["cublaslt"]  # the weight gradient, at run time, through the op
    want = _grads(F.linear, x, w)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_mm_on_the_cpu_leaves_the_preference_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", lambda *a: calls.append(a))
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    assert torch.equal(blas.mm(a, b, "cublaslt"), a @ b) and calls == []


def test_mlp_reference_takes_the_choice():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(16, 32, generator=g).bfloat16()
    w1, w2 = torch.randn(128, 32, generator=g).bfloat16(), torch.randn(32, 128, generator=g).bfloat16()
    want = _grads(lambda a, b: relu2_mlp.reference(a, b, w2), x, w1)
    got = _grads(lambda a, b: relu2_mlp.reference(a, b, w2, "cublaslt"), x, w1)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_model_trains_the_same_with_every_choice():
    from speedrun.config import apply_overrides
    from speedrun.model.gpt import GPT

    losses = {}
    for choice in blas.WGRAD_CHOICES:  # zero_init off: with the head at zero no block would get a gradient
        cfg = demo()
        apply_overrides(cfg, ["model.num_layers=4", "model.value_embeds=2", "model.model_dim=64",
                              "model.num_heads=2", "model.head_dim=32", "model.mlp_hidden=128",
                              "model.long_layers=0,3", "model.zero_init=False", f"model.wgrad_blas={choice}"])
        torch.manual_seed(0)
        model = GPT(cfg.model, cfg.attention)
        tok = torch.randint(0, 1000, (128,), generator=torch.Generator().manual_seed(0))
        loss = model(tok, torch.roll(tok, -1), torch.tensor(2))
        loss.backward()
        losses[choice] = (loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert all(g.abs().sum() > 0 for g in losses["cublas"][1][-4:])
    for choice in ("cublaslt", "auto"):
        assert torch.equal(losses[choice][0], losses["cublas"][0])
        assert all(torch.equal(a, b) for a, b in zip(losses[choice][1], losses["cublas"][1]))


@pytest.mark.gpu
@requires_cuda
def test_gpu_cublaslt_products_are_the_cublas_ones_up_to_rounding():
    """The record's weight-gradient shapes at one micro-step's 49,152 tokens: close to cuBLAS's (bf16
    rounding of two summation orders), no split-K reduction kernel, the preference put back."""
    n = 49_152
    g = torch.Generator(device="cuda").manual_seed(0)
    for out_f, in_f in ((2304, 768), (768, 3072), (3072, 768)):
        dy = torch.randn(n, out_f, device="cuda", dtype=torch.bfloat16, generator=g)
        x = torch.randn(n, in_f, device="cuda", dtype=torch.bfloat16, generator=g)
        before = torch.backends.cuda.preferred_blas_library()
        want = blas.mm(dy.t(), x, "cublas").float()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            got = blas.mm(dy.t(), x, "cublaslt").float()
            torch.cuda.synchronize()
        assert torch.backends.cuda.preferred_blas_library() == before
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        assert names and not any("splitKreduce" in name for name in names), names
        rel = ((got - want).norm() / want.norm()).item()
        assert rel < 4e-3, (out_f, in_f, rel)


@pytest.mark.gpu
@requires_cuda
def test_gpu_mlp_kernel_with_cublaslt_weight_gradients():
    """The relu2 MLP op's backward with `wgrad="auto"`: dL/dx bit-equal to the default's (same kernels),
    the weight gradients equal up to rounding."""
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(8192, 768, device="cuda", dtype=torch.bfloat16, generator=g)
    w1 = (torch.randn(3072, 768, device="cuda", generator=g) * 768 ** -0.5).bfloat16()
    w2 = (torch.randn(768, 3072, device="cuda", generator=g) * 3072 ** -0.5).bfloat16()
    gy = torch.randn(8192, 768, device="cuda", dtype=torch.bfloat16, generator=g)
    out = {}
    for choice in ("cublas", "auto"):
        xs, a, b = (t.clone().requires_grad_() for t in (x, w1, w2))
        y = relu2_mlp.relu2_mlp(xs, a, b, "auto", "", choice)
        out[choice] = (y.detach(), *torch.autograd.grad(y, (xs, a, b), gy))
    assert torch.equal(out["auto"][0], out["cublas"][0]) and torch.equal(out["auto"][1], out["cublas"][1])
    for got, want in zip(out["auto"][2:], out["cublas"][2:]):
        rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
        assert rel < 4e-3, rel
