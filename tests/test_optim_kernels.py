"""The optimisers' fused kernels (optim_kernels.py) against their eager references: Adam's update per
tensor and Muon's momentum per bucket, under Triton's interpreter on the CPU (a subprocess, see
interpreter_helpers) and at the record's sizes on the GPU; Muon's stacked momentum buffers across a
state-dict round trip; the config field."""

import copy
import textwrap

import pytest
import torch

from interpreter_helpers import run_interpreted
from speedrun.optim import kernels as ok
from speedrun.optim.adam import DistAdam
from speedrun.optim.muon import Muon

_INTERPRETED = textwrap.dedent(r'''
    import json, os
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch
    from speedrun.optim import kernels as ok
    from speedrun.optim.adam import DistAdam
    from speedrun.optim.muon import Muon

    def diff(a, b):
        a, b = a.float(), b.float()
        return {"unequal": int((a != b).sum()), "max_abs": float((a - b).abs().max()),
                "scale": float(b.abs().max())}

    g = torch.Generator().manual_seed(0)
    out = {"adam": [], "momentum": [], "optimisers": {}}
    for dtype in (torch.bfloat16, torch.float32):
        for n, beta1, wd, step in ((5000, 0.8, 0.0, 1.0), (2047, 0.8, 0.1, 7.0), (1, 0.3, 0.0, 3.0)):
            p, gr = torch.randn(n, generator=g).to(dtype), torch.randn(n, generator=g).to(dtype)
            m = (torch.randn(n, generator=g) * 0.1).to(dtype)
            v = (torch.rand(n, generator=g) * 0.01).to(dtype)
            ref, got = [t.clone() for t in (p, gr, m, v)], [t.clone() for t in (p, gr, m, v)]
            args = (step, 0.6, (beta1, 0.95), 1e-10, wd)
            ok.adam_reference(*ref, *args)
            ok.adam_step(*got, *args, impl="triton")
            out["adam"].append({"dtype": str(dtype), "n": n, "beta1": beta1, "wd": wd,
                                **{k: diff(a, b) for k, a, b in zip(("p", "g", "m", "v"), got, ref)}})
    for shape, mu in (((3, 64, 48), 0.95), ((2, 33, 17), 0.3)):
        grads, bufs = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
        ref_b, got_b, grads0 = bufs.clone(), bufs.clone(), grads.clone()
        ref_u = ok.momentum_reference(grads, ref_b, mu)
        got_u = ok.momentum_step(grads, got_b, mu, impl="triton")
        out["momentum"].append({"mu": mu, "dtype": str(got_u.dtype), "bufs": diff(got_b, ref_b),
                                "update": diff(got_u, ref_u.bfloat16()), "grads_kept": bool(torch.equal(grads, grads0))})

    # the optimisers end to end: three steps each way from the same start
    def params(shapes, dtype):
        gen = torch.Generator().manual_seed(1)
        return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in shapes]

    def run(opt, ps):
        gen = torch.Generator().manual_seed(2)
        for _ in range(3):
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
            opt.step()
        return ps

    for name, make, shapes, dtype in (
            ("muon", lambda ps, k: Muon(ps, ns_impl="torch", kernel=k), [(3, 32, 16), (3, 32, 16), (16, 40)],
             torch.float32),
            ("adam_bf16", lambda ps, k: DistAdam(ps, lr=0.6, kernel=k), [(50, 8), (7,)], torch.bfloat16),
            ("adamw_f32", lambda ps, k: DistAdam(ps, lr=0.01, weight_decay=0.1, kernel=k), [(50, 8), ()],
             torch.float32)):
        a, b = params(shapes, dtype), params(shapes, dtype)
        run(make(a, "torch"), a)
        run(make(b, "triton"), b)
        moved = all(not torch.equal(x.detach(), y.detach()) for x, y in zip(a, params(shapes, dtype)))
        out["optimisers"][name] = [dict(diff(x.detach(), y.detach()), moved=moved) for x, y in zip(b, a)]
    print("RESULT " + json.dumps(out))
''')


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED, timeout=600)


def test_interpreted_adam_kernel_is_the_eager_update(interpreted):
    """bfloat16: every rounding of the eager operations reproduced, bit for bit. float32: the CPU's
    eager division by the bias correction is a true division, the GPU's (and the kernel's) a product
    with the reciprocal, so the last bit may differ."""
    cases = interpreted["adam"]
    assert len(cases) == 6
    for case in cases:
        assert case["g"]["unequal"] == 0, case
        if case["dtype"] == "torch.bfloat16":
            assert all(case[k]["unequal"] == 0 for k in "pmv"), case
        else:
            assert all(case[k]["max_abs"] <= 2 ** -22 * max(case[k]["scale"], 1.0) for k in "pmv"), case


def test_interpreted_momentum_kernel_is_the_eager_momentum(interpreted):
    for case in interpreted["momentum"]:
        assert case["dtype"] == "torch.bfloat16" and case["grads_kept"], case
        assert case["bufs"]["unequal"] == 0 and case["update"]["unequal"] == 0, case


def test_interpreted_optimisers_step_alike(interpreted):
    """Muon and DistAdam with kernel=triton take the same three steps as with kernel=torch."""
    for name, results in interpreted["optimisers"].items():
        for r in results:
            limit = 0 if name == "adam_bf16" else 1e-6 * max(r["scale"], 1.0)
            assert r["max_abs"] <= limit and r["moved"], (name, r)


def _muon_run(opt, params, grads):
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.step()


def test_muon_buffers_stay_stacked_and_survive_a_state_dict_round_trip():
    """The momentum buffers of a bucket are rows of one tensor; a loaded state dict (separate tensors)
    is re-stacked on the next step, and the run continues exactly as an uninterrupted one."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(3, 16, 8), (3, 16, 8), (8, 12)]
    start = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(4)]
    a = [torch.nn.Parameter(t.clone()) for t in start]
    opt_a = Muon(a, ns_impl="torch", kernel="torch")
    _muon_run(opt_a, a, grads)
    b = [torch.nn.Parameter(t.clone()) for t in start]
    opt_b = Muon(b, ns_impl="torch", kernel="torch")
    _muon_run(opt_b, b, grads[:2])
    bufs = [opt_b.state[p]["momentum_buffer"] for p in b[:2]]
    assert bufs[0]._base is not None and bufs[0]._base is bufs[1]._base and bufs[0]._base.shape == (2, 3, 16, 8)
    saved = copy.deepcopy(opt_b.state_dict())
    c = [torch.nn.Parameter(p.detach().clone()) for p in b]
    opt_c = Muon(c, ns_impl="torch", kernel="torch")
    opt_c.load_state_dict(saved)
    _muon_run(opt_c, c, grads[2:])
    for x, y in zip(a, c):
        assert torch.equal(x.detach(), y.detach())
    restacked = [opt_c.state[p]["momentum_buffer"] for p in c[:2]]
    assert restacked[0]._base is restacked[1]._base is not None


def test_reference_is_the_optimisers_former_math():
    """momentum_reference is Muon's former per-buffer form (foreach lerp, stack, Nesterov lerp)."""
    gen = torch.Generator().manual_seed(5)
    grads, bufs = torch.randn(4, 6, 5, generator=gen), torch.randn(4, 6, 5, generator=gen)
    singles = [b.clone() for b in bufs.unbind(0)]
    torch._foreach_lerp_(singles, list(grads.unbind(0)), 1 - 0.9)
    expected = grads.clone().lerp_(torch.stack(singles), 0.9)
    got = ok.momentum_reference(grads, bufs, 0.9)
    assert torch.equal(got, expected) and torch.equal(bufs, torch.stack(singles))


def test_cpu_auto_is_the_reference_and_bad_choices_are_refused():
    p = torch.randn(10)
    args = (p.clone(), torch.randn(10), torch.zeros(10), torch.zeros(10))
    ref = [t.clone() for t in args]
    ok.adam_step(*args, 1.0, 0.1, (0.8, 0.95), 1e-10, 0.0)  # auto on the CPU: the reference
    ok.adam_reference(*ref, 1.0, 0.1, (0.8, 0.95), 1e-10, 0.0)
    assert all(torch.equal(x, y) for x, y in zip(args, ref))
    with pytest.raises(ValueError, match="kernel"):
        DistAdam([torch.nn.Parameter(p)], kernel="fast")
    with pytest.raises(ValueError, match="kernel"):
        Muon([torch.nn.Parameter(torch.zeros(4, 4))], kernel="fast")
    assert Muon([torch.nn.Parameter(torch.zeros(4, 4))], ns_impl="reference", kernel="triton").kernel == "torch"


@pytest.mark.gpu
def test_gpu_kernels_at_record_sizes(cuda):
    """The record's Adam tensors (a bfloat16 embedding table, the float32 head) and Muon's largest
    bucket: the kernels against the eager operations on the same GPU. bfloat16 bit for bit (measured:
    every element of p, m, v). float32: nvcc and Triton contract some multiply-adds differently
    (measured: 93.6% of p's and 74.9% of v's elements equal), so each element within 8 units in the
    last place of the largest value its update computes with: |p| and the step for p, |m| and |g| for
    m, |v| and g² for v."""
    pytest.importorskip("triton")
    gen = torch.Generator("cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        n = 50304 * 768
        p, g = torch.randn(n, generator=gen, device=cuda).to(dtype), torch.randn(n, generator=gen, device=cuda).to(dtype)
        m = (torch.randn(n, generator=gen, device=cuda) * 0.1).to(dtype)
        v = (torch.rand(n, generator=gen, device=cuda) * 0.01).to(dtype)
        ref, got = [t.clone() for t in (p, g, m, v)], [t.clone() for t in (p, g, m, v)]
        ok.adam_reference(*ref, 5.0, 0.6, (0.8, 0.95), 1e-10, 0.0)
        ok.adam_step(*got, 5.0, 0.6, (0.8, 0.95), 1e-10, 0.0, impl="triton")
        scales = {"p": p.abs() + (ref[0] - p).abs(), "m": m.abs() + g.abs(), "v": v.abs() + g.square()}
        for name, a, b in zip("pgmv", got, ref):
            same = (a == b).float().mean().item()
            worst = 0.0 if name == "g" else ((a - b).abs() / scales[name]).max().item()
            print(f"adam {dtype} {name}: {same:.6f} equal, largest difference {worst:.3g} of its scale")
            if dtype == torch.bfloat16 or name == "g":
                assert same == 1.0, (dtype, name, same)
            else:
                assert worst <= 2.0 ** -20, (dtype, name, same, worst)
    grads = torch.randn(12, 3072, 768, generator=gen, device=cuda)
    bufs = torch.randn(12, 3072, 768, generator=gen, device=cuda)
    ref_b, got_b = bufs.clone(), bufs.clone()
    ref_u = ok.momentum_reference(grads, ref_b, 0.95).bfloat16()
    got_u = ok.momentum_step(grads, got_b, 0.95, impl="triton")
    for name, a, b in (("bufs", got_b, ref_b), ("update", got_u, ref_u)):
        same = (a == b).float().mean().item()
        print(f"momentum {name}: {same:.6f} equal")
        assert same > 0.999, (name, same)
        torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -7, atol=0)
