"""Muon, single process: against torch.optim.Muon and against the formula by hand.

Tolerances: torch.optim.Muon runs the same bf16 Newton–Schulz (addmm where we
use baddbmm, norm clamped instead of + eps), so parameter changes agree to
bf16 noise: relative error of the total change < 2e-2 (measured: 0, i.e.
bitwise equal, on CPU with torch 2.13; the margin is for other kernels).
With ns_impl="reference" (float32) our step is compared to a float64 hand
computation at 1e-5.
"""

import math

import pytest
import torch

from speedrun.optim.muon import Muon, lr_scale, owner_major_order
from speedrun.optim.newton_schulz import newton_schulz_reference

TORCH_TOL = 2e-2
SHAPES_2D = [(64, 64), (96, 32), (32, 96)]


def rel(x, ref):
    return ((x - ref).norm() / ref.norm()).item()


def make_params(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g) * 0.1) for s in shapes]


def grads_for(shapes, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) for s in shapes] for _ in range(steps)]


def run(opt, params, grads_per_step):
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("steps", [1, 4])
def test_matches_torch_muon(steps):
    ours, theirs = make_params(SHAPES_2D), make_params(SHAPES_2D)
    start = [p.detach().clone() for p in ours]
    grads = grads_for(SHAPES_2D, steps)
    run(Muon(ours, lr=0.05, momentum=0.95, ns_impl="torch"), ours, grads)
    ref_opt = torch.optim.Muon(theirs, lr=0.05, weight_decay=0, momentum=0.95, nesterov=True,
                               adjust_lr_fn="original")
    run(ref_opt, theirs, grads)
    for p, q, p0 in zip(ours, theirs, start):
        assert rel(p.detach() - p0, q.detach() - p0) < TORCH_TOL


def muon_by_hand(p0, grads, lr, mu, wd=0.0):
    """The spec's formula, float64, per trailing matrix."""
    p, buf = p0.double().clone(), torch.zeros_like(p0, dtype=torch.float64)
    for g in grads:
        g = g.double()
        buf = buf + (1 - mu) * (g - buf)
        update = g + mu * (buf - g)
        ortho = newton_schulz_reference(update.float()).double()
        p = p * (1 - lr * wd) - lr * math.sqrt(max(1, p.shape[-2] / p.shape[-1])) * ortho
    return p.float()


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (4, 24, 24), (2, 3, 8, 20)])
def test_matches_formula_reference_impl(shape):
    (p,) = make_params([shape])
    p0 = p.detach().clone()
    grads = [gs[0] for gs in grads_for([shape], 3)]
    run(Muon([p], lr=0.05, momentum=0.9, weight_decay=0.1, ns_impl="reference"), [p], [[g] for g in grads])
    torch.testing.assert_close(p.detach(), muon_by_hand(p0, grads, 0.05, 0.9, 0.1), rtol=1e-5, atol=1e-5)


def test_stacked_param_is_separate_matrices():
    """A (4, m, m) parameter moves exactly like four (m, m) parameters."""
    (big,) = make_params([(4, 32, 32)])
    small = [torch.nn.Parameter(big.detach()[i].clone()) for i in range(4)]
    grads = grads_for([(4, 32, 32)], 2)
    run(Muon([big], ns_impl="reference"), [big], grads)
    run(Muon(small, ns_impl="reference"), small, [[g[0][i] for i in range(4)] for g in grads])
    for i in range(4):
        torch.testing.assert_close(big.detach()[i], small[i].detach(), rtol=1e-5, atol=1e-6)


def test_hyperparameters_read_each_step():
    shapes = [(32, 32)]
    a, b = make_params(shapes), make_params(shapes)
    grads = grads_for(shapes, 2)
    opt_a = Muon(a, lr=0.05, momentum=0.95, ns_impl="reference")
    assert opt_a.param_groups[0]["initial_lr"] == 0.05
    for i, gs in enumerate(grads):
        opt_a.param_groups[0]["lr"] = opt_a.param_groups[0]["initial_lr"] * (1.0, 0.5)[i]
        opt_a.param_groups[0]["momentum"] = (0.85, 0.9)[i]
        run(opt_a, a, [gs])
    expected = muon_by_hand(b[0].detach(), [grads[0][0]], 0.05, 0.85)
    buf = (1 - 0.85) * grads[0][0].double()
    buf = buf + (1 - 0.9) * (grads[1][0].double() - buf)
    upd = grads[1][0].double() + 0.9 * (buf - grads[1][0].double())
    expected = expected - 0.025 * newton_schulz_reference(upd.float())
    torch.testing.assert_close(a[0].detach(), expected, rtol=1e-5, atol=1e-5)


def test_params_without_grad_are_skipped():
    p, q = make_params([(16, 16), (16, 16)])
    q0 = q.detach().clone()
    p.grad = torch.randn(16, 16)
    Muon([p, q]).step()
    assert torch.equal(q.detach(), q0) and not torch.equal(p.detach(), q0)
    assert "momentum_buffer" not in Muon([q]).state


def test_refuses_vectors_and_bad_impl():
    with pytest.raises(ValueError):
        Muon([torch.nn.Parameter(torch.zeros(8))])
    with pytest.raises(ValueError):
        Muon(make_params([(4, 4)]), ns_impl="fast")


def test_lr_scale_and_ownership_layout():
    assert lr_scale(torch.Size([3072, 768])) == 2.0
    assert lr_scale(torch.Size([4, 768, 3072])) == 1.0
    # 5 params over 2 ranks: rank 0 owns 0, 2, 4; rank 1 owns 1, 3 and a pad.
    assert owner_major_order(5, 2) == [0, 2, 4, 1, 3, -1]
    assert owner_major_order(3, 4) == [0, 1, 2, -1]


def test_launch_reduce_then_step_is_the_same_step():
    shapes = [(32, 16), (32, 16), (8, 8)]
    a, b = make_params(shapes), make_params(shapes)
    grads = grads_for(shapes, 1)[0]
    opt_a, opt_b = Muon(a, ns_impl="reference"), Muon(b, ns_impl="reference")
    for p, q, g in zip(a, b, grads):
        p.grad, q.grad = g.clone(), g.clone()
    opt_a.launch_reduce()
    opt_a.zero_grad()  # the launched reduction already holds the gradients
    opt_a.step()
    opt_b.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_step_fast_path_matches_reference():
    """On CUDA, "auto" (Triton where available) steps like the float32 reference and like torch.optim.Muon."""
    shapes = [(768, 768)] * 3 + [(768, 3072), (3072, 768), (4, 768, 768), (6, 12)]
    start = [p.cuda() for p in make_params(shapes)]
    grads = [[g.cuda() for g in gs] for gs in grads_for(shapes, 3)]
    results = {}
    for impl in ("auto", "reference"):
        ps = [torch.nn.Parameter(p.clone()) for p in start]
        run(Muon(ps, ns_impl=impl), ps, grads)
        results[impl] = ps
    two_d = [i for i, s in enumerate(shapes) if len(s) == 2]
    theirs = [torch.nn.Parameter(start[i].clone()) for i in two_d]
    run(torch.optim.Muon(theirs, lr=0.05, weight_decay=0, adjust_lr_fn="original"), theirs,
        [[gs[i] for i in two_d] for gs in grads])
    for i, p0 in enumerate(start):  # bf16 vs float32 NS: 0.8 % measured at 768, 2.0 % at 6×12
        assert rel(results["auto"][i].detach() - p0, results["reference"][i].detach() - p0) < 3e-2
    for j, i in enumerate(two_d):
        assert rel(results["auto"][i].detach() - start[i], theirs[j].detach() - start[i]) < TORCH_TOL
