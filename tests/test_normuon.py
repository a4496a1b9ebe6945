"""NorMuon with Polar Express, cautious decay and the fp32 master split into bf16 + mantissa.

Each piece is checked against a plain computation written here from the
spec's equations (record-2026-07.md, "NorMuon + Polar Express"): Polar
Express against a float64 loop (bf16 tolerance), the variance step and the
cautious mask by hand, the mantissa split bit for bit, a whole step against
float64 equations, the state_dict round trip, and two gloo processes against
one process bit for bit.
"""

from __future__ import annotations

import io
import math
import os
import textwrap

import pytest
import torch
import torch.distributed as dist
from interpreter_helpers import run_interpreted
from model_helpers import run_forked_ranks

from speedrun.optim.normuon import (
    NorMuon,
    NorMuonConfig,
    cautious_update,
    join_master,
    matrix_step_sizes,
    mlp_matrix_lr_mul,
    record_param_groups,
    shape_lr_mul,
    split_master,
    variance_reduce,
)
from speedrun.optim.kernels import momentum_reference
from speedrun.optim.polar_express import POLAR_EXPRESS_COEFFS, polar_express

SPEC_COEFFS = [  # copied from the spec, to catch a mistyped digit in the module
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]


def _polar_f64(G: torch.Tensor, bf16: bool = False) -> torch.Tensor:
    """The recurrence in float64 for one matrix, the tall case through the wide formula on Gᵀ.

    bf16=True rounds to bfloat16 wherever the spec computes in bfloat16: the
    input, the norm and the normalised X, and each iteration's A, b·A + c·A²
    and new X (each product accumulated exactly, then rounded once).
    """
    r = (lambda t: t.to(torch.bfloat16).double()) if bf16 else (lambda t: t)
    X = r(G.double())
    tall = X.shape[0] > X.shape[1]
    X = X.T if tall else X
    X = r(X / r(r(r(X.norm()) * 1.02) + 1e-6))
    for a, b, c in SPEC_COEFFS:
        A = r(X @ X.T)
        X = r(a * X + r(b * A + c * A @ A) @ X)
    return X.T if tall else X


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ---------------------------------------------------------------------------
# Polar Express
# ---------------------------------------------------------------------------

def test_coefficients_are_the_specs():
    assert [tuple(c) for c in POLAR_EXPRESS_COEFFS] == SPEC_COEFFS


@pytest.mark.parametrize("shape", [(16, 48), (32, 32), (96, 24)])
def test_polar_express_matches_float64_recurrence(shape):
    G = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    out = polar_express(G)
    assert out.dtype == torch.bfloat16 and out.shape == G.shape
    assert _rel(out, _polar_f64(G)) < 8e-2  # bf16 rounding, amplified by the first coefficients: 2-6 %
    assert _rel(out, _polar_f64(G, bf16=True)) < 2e-3  # the same roundings: equal but for rare 1-ulp ties


def test_polar_express_batches_each_matrix_on_its_own():
    G = torch.randn(2, 3, 12, 40, generator=torch.Generator().manual_seed(2))
    G[1, 2] *= 1000  # a different scale in one matrix must not affect the others
    out = polar_express(G)
    for i in range(2):
        for j in range(3):
            assert _rel(out[i, j], _polar_f64(G[i, j], bf16=True)) < 2e-3


def test_polar_express_singular_values_near_one():
    G = torch.randn(64, 128, generator=torch.Generator().manual_seed(3))
    s = torch.linalg.svdvals(polar_express(G).double())
    assert s.min() > 0.8 and s.max() < 1.2  # the coefficients' target band is about 1 ± 0.14
    assert torch.linalg.svdvals(G.double()).max() / torch.linalg.svdvals(G.double()).min() > 5


def test_polar_express_keeps_zero_matrix_zero():
    assert torch.equal(polar_express(torch.zeros(2, 8, 24)), torch.zeros(2, 8, 24, dtype=torch.bfloat16))


# ---------------------------------------------------------------------------
# Momentum, variance reduction, cautious decay, lr multipliers
# ---------------------------------------------------------------------------

def test_nesterov_momentum():
    g = torch.tensor([[1.0, -2.0], [0.5, 4.0]])
    m = torch.tensor([[0.25, 1.0], [-1.0, 0.0]])
    mu = 0.9
    m_new = mu * m.double() + (1 - mu) * g.double()
    u = momentum_reference(g.bfloat16(), m, mu)  # NorMuon's momentum: a bf16 gradient is read in fp32
    assert m.dtype == torch.float32 and u.dtype == torch.float32
    torch.testing.assert_close(m.double(), m_new, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(u.double(), (1 - mu) * g.double() + mu * m_new, rtol=1e-6, atol=1e-7)


def _variance_by_hand(X, v, beta2, per_row):
    """Plain loops over Python floats: the spec's variance step for one matrix."""
    rows, cols = len(X), len(X[0])
    if per_row:
        q = [sum(x * x for x in X[i]) / cols for i in range(rows)]
    else:
        q = [sum(X[i][j] ** 2 for i in range(rows)) / rows for j in range(cols)]
    v = [beta2 * vi + (1 - beta2) * qi for vi, qi in zip(v, q)]
    s = [max(vi, 1e-10) ** -0.5 for vi in v]
    Y = [[X[i][j] * s[i if per_row else j] for j in range(cols)] for i in range(rows)]
    before = math.sqrt(sum(x * x for row in X for x in row))
    after = math.sqrt(sum(y * y for row in Y for y in row))
    return [[y * before / after for y in row] for row in Y], v


@pytest.mark.parametrize("per_row", [True, False])
def test_variance_reduction_by_hand(per_row):
    X = [[1.0, 2.0], [3.0, 4.0], [0.0, 1.0]] if per_row else [[1.0, 3.0, 0.0], [2.0, 4.0, 1.0]]
    v0 = [0.5, 2.0, 0.125]  # a buffer with history: β2 matters
    buffer = torch.tensor(v0).view((3, 1) if per_row else (1, 3))
    Xt = torch.tensor(X, dtype=torch.bfloat16)
    v_hand = v0
    for _ in range(2):  # twice: the buffer carries over
        expected, v_hand = _variance_by_hand(X, v_hand, 0.9, per_row)
        out = variance_reduce(Xt, buffer, 0.9)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(buffer.flatten().double(), torch.tensor(v_hand, dtype=torch.float64))
        torch.testing.assert_close(out.double(), torch.tensor(expected, dtype=torch.float64), rtol=8e-3, atol=0)
        assert abs(out.double().norm().item() / math.sqrt(31) - 1) < 8e-3


def test_variance_reduction_keeps_zero_matrix_zero():
    buffer = torch.zeros(2, 1, 6)
    out = variance_reduce(torch.zeros(2, 4, 6, dtype=torch.bfloat16), buffer, 0.9)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(buffer, torch.zeros_like(buffer))


def test_cautious_decay_mask_is_non_strict():
    P = torch.tensor([[1.0, -1.0, 2.0, 0.0, -3.0, 0.5]])
    X = torch.tensor([[0.5, 0.5, 0.0, 1.0, -1.0, -2.0]])
    eta, decay = 0.1, 0.25
    # X·P:            0.5 -0.5  0    0    3   -1  → decay where ≥ 0 (zero included), none where < 0
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    expected = P.double() - eta * X.double() - eta * decay * P.double() * mask
    out = cautious_update(P, X, eta, decay)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-7)
    assert out[0, 2].item() == pytest.approx(2.0 * (1 - eta * decay))  # X = 0 still decays
    assert out[0, 1].item() == pytest.approx(-1.0 - 0.05)  # opposite signs: no decay


def test_lr_multipliers():
    assert shape_lr_mul(256, 768) == 1.0 and shape_lr_mul(768, 768) == 1.0 and shape_lr_mul(3072, 768) == 2.0
    assert mlp_matrix_lr_mul(4) == (1.0, 2.0, 1.0, 2.0)
    # spec: "the lr at s = 1 is 0.023 / 0.046 / 0.092" (Q, K, V, O / W1 / W2)
    assert matrix_step_sizes(0.023, 256, 768, [1.0]) == pytest.approx([0.023])
    assert matrix_step_sizes(0.023, 768, 768, [1.0]) == pytest.approx([0.023])
    assert matrix_step_sizes(0.023, 3072, 768, mlp_matrix_lr_mul(2)) == pytest.approx([0.046, 0.092])


def test_record_groups_mark_every_w2():
    meta = dict(device="meta", dtype=torch.bfloat16)
    groups = record_param_groups(torch.empty(64, 256, 768, **meta), torch.empty(24, 768, 768, **meta),
                                 torch.empty(12, 2, 3072, 768, **meta))
    assert [g.get("matrix_lr_mul") for g in groups[:2]] == [None, None]
    assert groups[2]["matrix_lr_mul"] == (1.0, 2.0) * 12  # mlp_bank[i, 1] is W2: odd flat indices


def test_w2_moves_twice_as_far_as_w1():
    bank = torch.nn.Parameter(torch.zeros(1, 2, 24, 8, dtype=torch.bfloat16))
    g = torch.randn(24, 8, generator=torch.Generator().manual_seed(4)).bfloat16()
    bank.grad = torch.stack([g, g])[None]
    opt = NorMuon([dict(params=[bank], matrix_lr_mul=mlp_matrix_lr_mul(2))], lr=0.023, momentum=0.9)
    opt.step()
    master = join_master(bank.detach().view(2, 24, 8), opt.state[bank]["mantissa"])
    assert master[0].abs().max() > 0
    assert torch.equal(master[1], 2 * master[0])  # η of W2 = 2·η of W1, exactly (zero weights: no decay)


# ---------------------------------------------------------------------------
# The master weight: bf16 high half + uint16 mantissa
# ---------------------------------------------------------------------------

def test_split_join_is_bit_exact():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4096, generator=gen) * torch.exp2(torch.randint(-140, 120, (4096,), generator=gen).float())
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-45, -1e-45, 3.4e38, -1.17e-38])
    x = torch.cat([x, special, torch.tensor([float("nan")]), torch.tensor([-1]).view(torch.float32)])
    hi, lo = split_master(x)
    assert hi.dtype == torch.bfloat16 and lo.dtype == torch.uint16
    assert torch.equal(join_master(hi, lo).view(torch.int32), x.view(torch.int32))


def test_split_known_value():
    x = torch.tensor([1.0 + 3 * 2.0 ** -9, -(1.0 + 3 * 2.0 ** -9)])  # 0x3F80C000: low half 0xC000
    hi, lo = split_master(x)
    assert hi.tolist() == [1.0, -1.0]  # truncated toward zero, where rounding would give 1 + 2^-7
    assert x.bfloat16().tolist() == [1.0078125, -1.0078125]
    assert lo.to(torch.int32).tolist() == [0xC000, 0xC000]


def _truncate_f64(x: torch.Tensor) -> torch.Tensor:
    """x truncated toward zero to 8 significant bits (bf16's precision), by frexp in float64."""
    mant, exp = torch.frexp(x.double())
    return torch.ldexp(torch.trunc(mant * 256) / 256, exp.double())


def test_forward_sees_the_master_truncated():
    bank = torch.nn.Parameter((torch.randn(2, 8, 24, generator=torch.Generator().manual_seed(6)) * 0.1).bfloat16())
    opt = NorMuon([bank], lr=0.05, momentum=0.9)
    for step in range(2):
        bank.grad = torch.randn(2, 8, 24, generator=torch.Generator().manual_seed(7 + step)).bfloat16()
        opt.step()
    master = join_master(bank.detach(), opt.state[bank]["mantissa"])
    assert opt.state[bank]["mantissa"].to(torch.int32).count_nonzero() > 0
    assert torch.equal(bank.detach().double(), _truncate_f64(master))
    assert not torch.equal(bank.detach(), master.bfloat16())  # rounding would differ somewhere


# ---------------------------------------------------------------------------
# A whole step against the equations; state_dict; two processes
# ---------------------------------------------------------------------------

def _banks(seed: int) -> list[torch.nn.Parameter]:
    """A qk-like bank with 2 zero pads, a square vo-like bank, an MLP bank (3, 2, 40, 16): W = 2 divides all,
    and each rank's MLP chunk starts at a different parity (rank 1 owns W2, W1, W2)."""
    gen = torch.Generator().manual_seed(seed)
    qk = torch.randn(6, 8, 24, generator=gen)
    qk[4:] = 0
    vo = torch.randn(4, 16, 16, generator=gen)
    mlp = torch.randn(3, 2, 40, 16, generator=gen)
    return [torch.nn.Parameter(t.bfloat16()) for t in (qk, vo, mlp)]


def _grads(step: int, rank: int, banks) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    grads = [torch.randn(b.shape, generator=gen).bfloat16() for b in banks]
    grads[0][4:] = 0  # pads have no gradient
    return grads


def _make_opt(banks, process_group=None) -> NorMuon:
    groups = [dict(params=banks[:2]), dict(params=[banks[2]], matrix_lr_mul=mlp_matrix_lr_mul(6))]
    return NorMuon(groups, lr=0.3, momentum=0.85, weight_decay=1.2, beta2=0.9, process_group=process_group)


SCHEDULE = [(0.3, 0.85), (0.25, 0.9), (0.2, 0.95)]  # (lr, momentum) of each step, set by the caller


def _train(opt, banks, grad_fn, steps, first_step=0):
    """Steps with the caller's (lr, momentum) per step; grad_fn(step, banks) gives the gradients."""
    for step, (lr, mu) in enumerate(steps, start=first_step):
        for group in opt.param_groups:
            group["lr"], group["momentum"] = lr, mu
        for b, g in zip(banks, grad_fn(step, banks)):
            b.grad = g
        opt.step()
        opt.zero_grad(set_to_none=True)


def _plain_steps(P, grads, lr_mul, schedule):
    """The spec's equations for one matrix in float64, step after step; returns the final master."""
    P = P.double()
    m = torch.zeros_like(P)
    per_row = P.shape[0] >= P.shape[1]
    v = torch.zeros(P.shape[0] if per_row else P.shape[1], dtype=torch.float64)
    for (lr, mu), g in zip(schedule, grads):
        g = g.double()
        m = mu * m + (1 - mu) * g
        X = _polar_f64((1 - mu) * g + mu * m, bf16=True)
        q = (X ** 2).mean(dim=1 if per_row else 0)
        v = 0.9 * v + 0.1 * q
        Y = X * (v.clamp_min(1e-10) ** -0.5).view((-1, 1) if per_row else (1, -1))
        X = Y * X.norm() / Y.norm().clamp_min(1e-10)
        eta = lr * math.sqrt(max(1.0, P.shape[0] / P.shape[1])) * lr_mul
        P = P - eta * X - eta * (1.2 * lr) * P * ((X * P) >= 0)
    return P


def test_full_step_matches_plain_equations():
    banks = _banks(0)
    start = [b.detach().clone() for b in banks]
    opt = _make_opt(banks)
    _train(opt, banks, lambda step, bs: _grads(step, 0, bs), SCHEDULE)
    per_step = [_grads(step, 0, banks) for step in range(len(SCHEDULE))]  # [step][bank]
    for j, (b, p0, lr_muls) in enumerate(zip(banks, start, [(1.0,) * 6, (1.0,) * 4, mlp_matrix_lr_mul(6)])):
        rows, cols = b.shape[-2:]
        master = join_master(b.detach().view(-1, rows, cols), opt.state[b]["mantissa"])
        for i, p_i in enumerate(p0.view(-1, rows, cols)):
            g_i = [grads[j].view(-1, rows, cols)[i] for grads in per_step]
            if b.shape[0] == 6 and i >= 4:  # a pad: exactly zero after the steps, with zero state
                assert torch.equal(master[i], torch.zeros_like(master[i]))
                assert torch.equal(opt.state[b]["momentum_buffer"][i], torch.zeros_like(master[i]))
                continue
            ref = _plain_steps(p_i, g_i, lr_muls[i], SCHEDULE)
            assert _rel(master[i] - p_i.float(), ref - p_i.double()) < 3e-2, (tuple(b.shape), i)


def test_state_dict_round_trip_continues_identically():
    banks = _banks(1)
    opt = _make_opt(banks)
    _train(opt, banks, lambda step, bs: _grads(step, 0, bs), SCHEDULE[:2])
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    clones = [torch.nn.Parameter(b.detach().clone()) for b in banks]
    opt2 = _make_opt(clones)
    opt2.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    for b, c in zip(banks, clones):
        assert [opt2.state[c][k].dtype for k in ("momentum_buffer", "second_momentum_buffer", "mantissa")] == [
            torch.float32, torch.float32, torch.uint16]
    more = [(0.2, 0.95), (0.1, 0.9)]
    _train(opt, banks, lambda step, bs: _grads(step, 0, bs), more, first_step=2)
    _train(opt2, clones, lambda step, bs: _grads(step, 0, bs), more, first_step=2)
    for b, c in zip(banks, clones):
        assert torch.equal(b, c)
        for key, value in opt.state[b].items():
            assert torch.equal(value, opt2.state[c][key]), key
    opt2.reset_state()
    assert all(torch.equal(t, torch.zeros_like(t)) for s in opt2.state.values() for t in s.values())


def _world_banks(world_size: int) -> list[torch.nn.Parameter]:
    """`_banks(2)` for W = 2; for more ranks banks grown to a multiple of W: qk (W matrices, zero pads
    from the fifth), vo (W), and an MLP bank of W / 2 layer pairs (one matrix a rank, parities alternating)."""
    if world_size == 2:
        return _banks(2)
    gen = torch.Generator().manual_seed(2)
    qk = torch.randn(world_size, 8, 24, generator=gen)
    qk[4:] = 0
    vo = torch.randn(world_size, 16, 16, generator=gen)
    mlp = torch.randn(world_size // 2, 2, 40, 16, generator=gen)
    return [torch.nn.Parameter(t.bfloat16()) for t in (qk, vo, mlp)]


def _dyadic_grads(step: int, rank: int, banks, world_size: int) -> list[torch.Tensor]:
    """Multiples of 1/32 small enough that the world's bf16 sum is exact in any order, so one process
    can be fed the same average as the ranks' all-reduce gives."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    bound = 32 // world_size
    grads = [(torch.randint(-bound, bound, b.shape, generator=gen).float() / 32).bfloat16() for b in banks]
    grads[0][4:] = 0  # pads have no gradient
    return grads


def _world_opt(banks, world_size: int) -> NorMuon:
    groups = [dict(params=banks[:2]), dict(params=[banks[2]], matrix_lr_mul=mlp_matrix_lr_mul(banks[2].shape[0] * 2))]
    return NorMuon(groups, lr=0.3, momentum=0.85, weight_decay=1.2, beta2=0.9)


def _dist_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        banks = _world_banks(world_size)
        opt = _world_opt(banks, world_size)
        _train(opt, banks, lambda step, bs: _dyadic_grads(step, rank, bs, world_size), SCHEDULE)
        states = [{k: v.clone() for k, v in opt.state[b].items()} for b in banks]
        torch.save(dict(banks=[b.detach().clone() for b in banks], states=states),
                   os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _mean_grads(world_size: int):
    """What the ranks' averaging gives: the (exact) bf16 sum, then the division by a power of two."""
    def grads(step, banks):
        per_rank = [_dyadic_grads(step, r, banks, world_size) for r in range(world_size)]
        return [sum(gs[1:], gs[0]) / world_size for gs in zip(*per_rank)]
    return grads


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 8])
def test_gloo_ranks_equal_one_process(tmp_path, world_size):
    banks = _world_banks(world_size)
    opt = _world_opt(banks, world_size)  # (first, so that the forked ranks inherit torch's lazily imported modules)
    _train(opt, banks, _mean_grads(world_size), SCHEDULE)
    results = run_forked_ranks(_dist_worker, world_size, tmp_path, timeout_s=120.0)
    for rank, result in enumerate(results):
        for b, got, state in zip(banks, result["banks"], result["states"]):
            assert torch.equal(got.view(torch.int16), b.detach().view(torch.int16))  # bit for bit
            k = b.detach().view(-1, *b.shape[-2:]).shape[0] // world_size
            for key, value in state.items():  # each rank holds its own chunk's state
                assert value.shape[0] == k
                assert torch.equal(value, opt.state[b][key][rank * k:(rank + 1) * k]), key
    assert not torch.equal(results[0]["banks"][1], _world_banks(world_size)[1])


def test_config_defaults_are_the_records():
    cfg = NorMuonConfig()
    assert (cfg.lr, cfg.weight_decay, cfg.beta2, cfg.w2_lr_mul, cfg.var_eps) == (0.023, 1.2, 0.9, 2.0, 1e-10)
    with pytest.raises(ValueError):
        NorMuon([torch.nn.Parameter(torch.zeros(2, 4, 4))])  # an fp32 bank has no mantissa to split
    with pytest.raises(ValueError):
        NorMuon([dict(params=[torch.nn.Parameter(torch.zeros(4, 4, 4, dtype=torch.bfloat16))], matrix_lr_mul=(1.0,))])


def test_host_to_device_gives_the_values_in_the_dtype():
    """The step sizes reach the device as torch.tensor would make them (float32-rounded Python floats)."""
    from speedrun.data.transfer import host_to_device

    etas = matrix_step_sizes(0.023 * 0.37, 3072, 768, mlp_matrix_lr_mul(2))
    got = host_to_device(etas, torch.float32, torch.device("cpu"))
    assert got.dtype == torch.float32 and torch.equal(got, torch.tensor(etas, dtype=torch.float32))


# ---------------------------------------------------------------------------
# The update's kernel passes against the eager steps
# ---------------------------------------------------------------------------

_INTERPRETED = textwrap.dedent(r'''
    import json, os
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch
    from speedrun.optim import normuon
    from speedrun.optim.normuon import NorMuon, new_state, normuon_update, record_param_groups, split_master

    calls = []
    apply_step = normuon.normuon_apply_step
    normuon.normuon_apply_step = lambda *a: calls.append(1) or apply_step(*a)
    gen = torch.Generator().manual_seed(0)
    out = {"update": [], "optimiser": []}
    for k, rows, cols in ((3, 48, 16), (2, 16, 40), (2, 24, 24)):  # per row, per column, square
        master = torch.randn(k, rows, cols, generator=gen) * 0.05
        master[-1] = 0  # a pad
        weight, low = split_master(master)
        weights, states = [weight.clone(), weight.clone()], [new_state(k, rows, cols, torch.device("cpu")) for _ in "ab"]
        for st in states:
            st["mantissa"].copy_(low)
        for _ in range(3):
            g = (torch.randn(k, rows, cols, generator=gen) * 0.01).bfloat16()
            g[-1] = 0
            for w, st, impl in zip(weights, states, ("torch", "triton")):
                normuon_update(w, g, st, lr=0.3, momentum=0.85, weight_decay=1.2, beta2=0.9,
                               matrix_lr_mul=[1.0 + j for j in range(k)], impl=impl)
        out["update"].append({"shape": [k, rows, cols], "weight": int((weights[0] != weights[1]).sum()),
                              **{key: int((states[0][key] != states[1][key]).sum()) for key in states[0]},
                              "moved": int((weights[0] != weight).sum()),
                              "pad": int(weights[1][-1].count_nonzero() + states[1]["mantissa"][-1].to(torch.int32).count_nonzero())})

    def run(kernel):
        g = torch.Generator().manual_seed(1)
        banks = [torch.nn.Parameter((torch.randn(s, generator=g) * 0.05).bfloat16())
                 for s in ((4, 8, 24), (2, 24, 24), (2, 2, 48, 24))]
        opt = NorMuon(record_param_groups(*banks), lr=0.3, momentum=0.85, kernel=kernel)
        for _ in range(3):
            for b in banks:
                b.grad = (torch.randn(b.shape, generator=g) * 0.01).bfloat16()
            opt.step()
        return banks, opt

    (a, opt_a), (b, opt_b) = run("torch"), run("triton")
    out["optimiser"] = [int((x != y).sum()) + sum(int((opt_a.state[x][key] != opt_b.state[y][key]).sum())
                                                  for key in opt_a.state[x]) for x, y in zip(a, b)]
    out["calls"] = len(calls)
    print("RESULT " + json.dumps(out))
''')


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED, timeout=600)


def test_interpreted_kernels_are_the_eager_update(interpreted):
    """Three steps on a per-row, a per-column and a square stack with a zero pad: the weight, the low
    halves and both buffers bit for bit the eager steps' (the momentum kernel and the apply kernel each
    round where the eager operations do), the pad still zero."""
    assert len(interpreted["update"]) == 3
    for case in interpreted["update"]:
        assert case["moved"] > 0 and case["pad"] == 0, case
        assert all(case[key] == 0 for key in ("weight", "momentum_buffer", "second_momentum_buffer", "mantissa")), case


def test_interpreted_optimiser_steps_alike(interpreted):
    """NorMuon(kernel="triton") over the record's three groups: every bank and state bit for bit, and
    the kernel ran for every update (three steps of the three stacks above and of the three banks)."""
    assert interpreted["optimiser"] == [0, 0, 0]
    assert interpreted["calls"] == 18


def test_cpu_auto_is_the_reference_and_bad_choices_are_refused():
    bank = torch.nn.Parameter(torch.zeros(2, 8, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="kernel"):
        NorMuon([bank], kernel="fast")
    ref, auto = _banks(3), _banks(3)
    _train(_make_opt(ref), ref, lambda s, b: _grads(s, 0, b), SCHEDULE)
    opt = NorMuon([dict(params=auto[:2]), dict(params=[auto[2]], matrix_lr_mul=mlp_matrix_lr_mul(6))], lr=0.3,
                  momentum=0.85, weight_decay=1.2, beta2=0.9, kernel="auto")
    _train(opt, auto, lambda s, b: _grads(s, 0, b), SCHEDULE)
    assert all(torch.equal(x, y) for x, y in zip(ref, auto))


@pytest.mark.gpu
def test_gpu_kernels_at_record_size(cuda):
    """The MLP bank (24 matrices of 3,072 x 768, per row) and a Q/K bank (per column) on the GPU. The
    apply kernel from the same X bit for bit against the eager steps; three whole updates each way,
    where the momentum kernel's lerp may round a last bit otherwise than PyTorch's (Muon's GPU test),
    within a hundredth of the step's size; prints the shares of equal elements."""
    pytest.importorskip("triton")
    from speedrun.optim.kernels import normuon_apply_step
    from speedrun.optim.normuon import new_state, normuon_update

    gen = torch.Generator("cuda").manual_seed(0)
    for k, rows, cols in ((24, 3072, 768), (64, 256, 768)):
        master = torch.randn(k, rows, cols, generator=gen, device=cuda) * 0.05
        weight, low = split_master(master)
        X = torch.randn(k, rows, cols, generator=gen, device=cuda).bfloat16()
        shape = (k, rows, 1) if rows >= cols else (k, 1, cols)
        scale = (torch.rand(shape, generator=gen, device=cuda) + 0.5).bfloat16()
        eta = torch.rand(k, generator=gen, device=cuda) * 0.05
        want = cautious_update(master, X * scale, eta.view(-1, 1, 1), 1.2 * 0.02)
        w, lo = weight.clone(), low.clone()
        normuon_apply_step(w, lo, X, scale, eta, 1.2 * 0.02)
        got = join_master(w, lo)
        print(f"normuon apply {k}x{rows}x{cols}: {(got == want).float().mean().item():.6f} equal")
        assert torch.equal(got, want)
        weights, states = [weight.clone(), weight.clone()], [new_state(k, rows, cols, cuda) for _ in "ab"]
        for st in states:
            st["mantissa"].copy_(low)
        for _ in range(3):
            g = (torch.randn(k, rows, cols, generator=gen, device=cuda) * 0.01).bfloat16()
            for w, st, impl in zip(weights, states, ("torch", "triton")):
                normuon_update(w, g, st, lr=0.02, momentum=0.85, weight_decay=1.2, beta2=0.9,
                               matrix_lr_mul=[1.0] * k, impl=impl)
        ref, fused = (join_master(w, st["mantissa"]) for w, st in zip(weights, states))
        moved = (ref - master).norm().item()
        print(f"normuon update {k}x{rows}x{cols}: {(fused == ref).float().mean().item():.6f} equal, "
              f"difference {(fused - ref).norm().item() / moved:.3g} of the steps")
        assert moved > 0 and (fused - ref).norm().item() <= 1e-2 * moved


@pytest.mark.parametrize("per_row", [True, False])
def test_apply_kernel_compiles_for_hopper_without_fused_multiply_adds(per_row):
    """The apply kernel compiled for sm_90 offline (Triton's bundled ptxas) at the record's 768 columns:
    every product and difference rounds on its own (no `fma` in the PTX, as the eager steps round), X·scale
    is one bfloat16 product, and no 64-bit division is left in the element's index."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from speedrun.optim import kernels

    kernel = kernels._build_kernels()[3]
    consts = dict(BLOCK=kernels.BLOCK, PER_ROW=per_row, EMULATE_RNE=False, COLS=768)
    types = {"W": "*i16", "LOW": "*i16", "X": "*bf16", "S": "*bf16", "ETA": "*fp32", "size": "i32", "rows": "i32",
             "decay": "fp32"}
    signature = {a: "constexpr" if a in consts else types[a] for a in kernel.arg_names}
    compiled = triton.compile(ASTSource(kernel, signature, consts), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": kernels.NUM_WARPS, "enable_fp_fusion": False})
    ptx = compiled.asm["ptx"]
    assert "fma" not in ptx and "div.s64" not in ptx and "div.u64" not in ptx
    assert "mul.rn.f32" in ptx and "sub.rn.f32" in ptx
