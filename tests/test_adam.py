"""DistAdam in one process is plain Adam: it must equal torch.optim.Adam / AdamW.

The update is written op for op like torch's single-tensor Adam, so float32
results are compared with rtol 1e-6, atol 1e-7 (they are bitwise equal in
practice on CPU).
"""

import pytest
import torch

from speedrun.optim.adam import DistAdam


def make(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def run(opt, params, steps, seed=1, lrs=None):
    g = torch.Generator().manual_seed(seed)
    for i in range(steps):
        if lrs:
            opt.param_groups[0]["lr"] = lrs[i]
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
        opt.zero_grad()


SHAPES = [(10, 6), (7,), (3, 4, 5), ()]


@pytest.mark.parametrize("steps", [1, 5])
def test_equals_torch_adam(steps):
    a, b = make(SHAPES), make(SHAPES)
    run(DistAdam(a, lr=0.04, betas=(0.8, 0.95), eps=1e-10), a, steps)
    run(torch.optim.Adam(b, lr=0.04, betas=(0.8, 0.95), eps=1e-10, foreach=False), b, steps)
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_equals_torch_adamw_with_schedule():
    a, b = make(SHAPES), make(SHAPES)
    lrs = [0.01, 0.008, 0.004]
    opt = DistAdam(a, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    assert opt.param_groups[0]["initial_lr"] == 0.01
    run(opt, a, 3, lrs=lrs)
    run(torch.optim.AdamW(b, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False), b, 3, lrs=lrs)
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_param_groups_and_missing_grads():
    p, q = make([(4, 4), (4,)])
    q0 = q.detach().clone()
    opt = DistAdam([dict(params=[p], lr=0.6), dict(params=[q], lr=0.008)])
    assert [g["initial_lr"] for g in opt.param_groups] == [0.6, 0.008]
    p.grad = torch.ones(4, 4)
    opt.step()
    # first bias-corrected Adam step moves every element by lr (sign of grad)
    torch.testing.assert_close(p.detach(), make([(4, 4), (4,)])[0].detach() - 0.6)
    assert torch.equal(q.detach(), q0) and q not in opt.state
