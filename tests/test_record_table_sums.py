"""The 2026 record's looked-up tables with their gradients added into `.grad` row by row
(`record_micro.TableSums`, `RecordKernels.lookup`) against autograd's dense embedding backward.

In float32 on the CPU both add each row's tokens in their order (`embed_rows`), so the gradients of
every parameter are the reference's bit for bit, over micro-steps and onto a gradient already there
(Adam's pending sum at an odd step). The scratch tables end at zero, and a forward without sums, or
with a device choice that has no `lookup`, never calls it.
"""

from __future__ import annotations

from functools import partial

import torch

from speedrun.kernels import embed_rows, record_attention
from speedrun.model.record import LOOKUP_TABLES, RecordGPT, RecordKernels, RecordModelConfig
from speedrun.train.record_micro import TableSums


def _model() -> RecordGPT:
    model = RecordGPT(RecordModelConfig.tiny(), generator=torch.Generator().manual_seed(0)).float()
    with torch.no_grad():  # the record's zero-initialised tables would give the lookups nothing to carry
        for name in ("bigram_embed", "value_embeds"):
            getattr(model, name).normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    return model


def _batches(n: int = 3):
    g = torch.Generator().manual_seed(2)
    for _ in range(n):
        tokens = torch.randint(0, 128, (65,), generator=g)
        tokens[10:20] = tokens[5]  # rows repeated inside a micro-batch
        yield tokens[:-1], tokens[1:], torch.tensor([0, 40, 64], dtype=torch.int32)


def _grads(model: RecordGPT, sums: TableSums | None, pending: dict[str, torch.Tensor]):
    model.zero_grad(set_to_none=True)
    for name, g in pending.items():
        getattr(model, name).grad = g.clone()
    for inputs, targets, cu in _batches():
        loss = model.training_loss(inputs, targets, cu, (8, 16), 0.1, [1.0, 0.5], 0.0, torch.full((128,), -1),
                                   dtype=torch.float32, table_sums=sums.pairs() if sums else None)
        (loss * 0.5).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_the_sums_are_autograd_s_gradients_bit_for_bit():
    model = _model()
    pending = {"bigram_embed": torch.randn(model.bigram_embed.shape, generator=torch.Generator().manual_seed(3))}
    ref = _grads(model, None, pending)
    model.kernels = RecordKernels("rows", lookup=partial(embed_rows.lookup_into, impl="torch"))
    sums = TableSums(model)
    got = _grads(model, sums, pending)
    assert sorted(got) == sorted(ref)
    for name in ref:
        assert torch.equal(got[name], ref[name]), name
    for name in LOOKUP_TABLES:  # the tables' gradients are made where they are used, not in autograd
        assert ref[name].abs().sum() > 0, name
        assert not sums.scratch[name].any(), name
    assert model.bigram_embed.grad is not sums.buffers["bigram_embed"]  # the pending sum took the adds
    assert model.embed.grad is sums.buffers["embed"]


def test_the_lookup_serves_only_a_forward_with_sums():
    calls = []
    model = _model()
    model.kernels = RecordKernels("spy", lookup=lambda index, table, total, scratch: calls.append(1) or table[index])
    tokens = torch.randint(0, 128, (33,))
    cu = torch.tensor([0, 32], dtype=torch.int32)
    model.training_loss(tokens[:-1], tokens[1:], cu, (8, 16), 0.1, [1.0], 0.0, torch.full((128,), -1),
                        dtype=torch.float32)
    assert calls == []
    model.training_loss(tokens[:-1], tokens[1:], cu, (8, 16), 0.1, [1.0], 0.0, torch.full((128,), -1),
                        dtype=torch.float32, table_sums=TableSums(model).pairs())
    assert len(calls) == len(LOOKUP_TABLES)
    assert record_attention.pick("auto", torch.device("cpu")).lookup is None  # the dense backward on the CPU
