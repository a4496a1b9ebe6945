"""`record_parts.bank_views`: the banks' matrices as views whose gradients reach the bank in one
concatenation, in place of a select or slice per use (each a bank-sized tensor of zeros with one block
filled, which Inductor sums in one bank-sized pass testing every use at every element: about 1.2 ms a
micro-step on an H100 for one bank). The values and the gradient bits are the plain views'."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from speedrun.model import record_parts
from speedrun.model.record import RecordGPT, RecordKernels, RecordModelConfig

sys.path.insert(0, str(Path(__file__).parent))
from record_standins import dense_attend, dense_dc  # noqa: E402


def _plain_views(bank, rows=1):
    return tuple(bank.unbind(0)) if rows == 1 else tuple(bank.split(rows))


def _uses(views):
    """Some blocks used once, one twice, one (the last) not at all: the bank's pads."""
    out = sum((v.float() * (i + 1)).square().sum() for i, v in enumerate(views[:-1]))
    return out + views[1].float().sum()


@pytest.mark.parametrize("rows", [1, 3])
def test_views_and_gradients_are_the_plain_views(rows):
    gen = torch.Generator().manual_seed(0)
    bank = torch.randn(8, 5, 4, generator=gen, dtype=torch.bfloat16).requires_grad_()
    ours, plain = record_parts.bank_views(bank, rows), _plain_views(bank, rows)
    assert len(ours) == len(plain) and all(torch.equal(a, b) for a, b in zip(ours, plain))
    (g_ours,) = torch.autograd.grad(_uses(ours), bank)
    (g_plain,) = torch.autograd.grad(_uses(plain), bank)
    assert torch.equal(g_ours, g_plain)
    assert not g_ours[-1].any()  # the unused block's gradient is zero


def _backward_ops(fn, bank):
    """The aten ops of the backward graph that AOT autograd makes of fn (no Inductor)."""
    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm)
        return make_boxed_func(gm)

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm), bw_compiler=keep)
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    compiled(bank).backward()
    return {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}


def test_the_compiled_backward_concatenates_instead_of_scattering_per_use():
    bank = torch.randn(6, 4, 4, requires_grad=True)
    x = torch.randn(3, 4)

    def layers(views_of):
        def fn(b):
            views = views_of(b)
            return sum((x @ v.T).tanh().sum() for v in views)
        return fn

    plain = _backward_ops(layers(lambda b: [b[i] for i in range(6)]), bank)
    ours = _backward_ops(layers(record_parts.bank_views), bank)
    assert any("select_backward" in op for op in plain)
    assert not any("select_backward" in op or "slice_backward" in op for op in ours), ours
    assert any("stack" in op or "cat" in op for op in ours), ours


@pytest.mark.parametrize("world_size", [1, 8])
def test_the_models_gradients_are_the_plain_views_bit_for_bit(monkeypatch, world_size):
    """The tiny model's every gradient through the banks' views, against autograd's through plain
    selects and slices, in bfloat16 with the pads of eight ranks."""
    cfg, n = RecordModelConfig.tiny(), 192
    tokens = torch.randint(0, cfg.vocab - 1, (n + 1,), generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0, 70, 150, n, n], dtype=torch.int32)
    rope = record_parts.rope_tables(record_parts.rope_freqs(cfg.rope_pairs), 2 * n)
    prefix = torch.full((cfg.vocab,), -1, dtype=torch.int64)

    def grads():
        model = RecordGPT(cfg, world_size=world_size, generator=torch.Generator().manual_seed(0))
        model.kernels = RecordKernels("dense", dense_attend, dense_dc)
        loss = model.training_loss(tokens[:-1], tokens[1:], cu, (32, 64), 0.1, torch.tensor([1.0, 0.5]),
                                   torch.tensor(0.2), prefix, rope=rope, dtype=torch.bfloat16, longest=80)
        loss.backward()
        return {name: p.grad for name, p in model.named_parameters()}

    ours = grads()
    monkeypatch.setattr(record_parts, "bank_views", _plain_views)
    plain = grads()
    for name in ("qk_bank", "vo_bank", "mlp_bank"):
        assert ours[name].abs().sum() > 0, name
    assert [name for name in ours if not torch.equal(ours[name], plain[name])] == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_record_size_gradients_are_the_plain_views(monkeypatch):
    """The record's model on the device's kernels (the MLP's custom ops take the views as their
    weights, their gradients come back through the concatenation): every gradient of one eager
    micro-step as the plain selects and slices give it, within the device's own run-to-run spread
    (FlashAttention's dQ and the tables' scatters add with atomics) and a thousandth of its norm:
    a block's gradient in another block's place is the whole norm."""
    from speedrun.kernels import record_attention

    cfg, n = RecordModelConfig(), 16_384
    gen = torch.Generator("cuda").manual_seed(0)
    tokens = torch.randint(0, cfg.vocab - 1, (n + 1,), device="cuda", generator=gen)
    cu = torch.tensor([0, 3000, 9000, 12_500, n], dtype=torch.int32, device="cuda")
    prefix = torch.full((cfg.vocab,), -1, dtype=torch.int64, device="cuda")
    mtp = torch.tensor([1.0, 0.5], device="cuda")

    def grads():
        model = RecordGPT(cfg, device="cuda", generator=torch.Generator().manual_seed(0))
        model.kernels = record_attention.pick("auto", torch.device("cuda"))
        model.training_loss(tokens[:-1], tokens[1:], cu, (128, 384), 0.1, mtp, 0.0, prefix, longest=6000).backward()
        return {name: p.grad.float() for name, p in model.named_parameters() if p.grad is not None}

    ours = grads()
    monkeypatch.setattr(record_parts, "bank_views", _plain_views)
    plain, again = grads(), grads()
    assert ours.keys() == plain.keys() and {"qk_bank", "vo_bank", "mlp_bank"} <= ours.keys()
    for name, want in plain.items():
        spread = (again[name] - want).norm()
        assert (ours[name] - want).norm() <= 4 * spread + 1e-3 * want.norm(), (name, spread)
