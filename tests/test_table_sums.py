"""The record's looked-up tables summed row by row (train/table_sums.py) against autograd's `.grad`.

Model level, exact: in float32 (parameters and activations, one thread, so that both paths add each
table's rows in the tokens' order) a step's micro-steps through `kernels.lookup` and `TableSums` leave
every parameter's `.grad` bit for bit as autograd's accumulation does, from zero (an even step) and
from a restored pending sum (an odd step). Trainer level: the gradients RecordAdam sees at an even and
the following odd step of the tiny record run, with the tables in bf16 as the record holds them, are
the reference trainer's up to the CPU's dense backward summing bf16 rows in bf16 (the row path sums
in float32 and rounds once, as the GPU's compiled dense path does).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
import torch

from speedrun.kernels import embed_rows
from speedrun.model.record import RecordGPT, RecordKernels, RecordModelConfig
from speedrun.train.table_sums import TableSums

LOOKUP = partial(embed_rows.lookup_into, impl="torch")


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(kernels: RecordKernels) -> RecordGPT:
    model = RecordGPT(RecordModelConfig.tiny(), generator=torch.Generator().manual_seed(0)).float()
    model.kernels = kernels
    return model


def _micro_batches(count: int):
    g = torch.Generator().manual_seed(1)
    for _ in range(count):
        tokens = torch.randint(0, 127, (97,), generator=g)
        yield tokens[:-1], tokens[1:], torch.tensor([0, 40, 75, 96], dtype=torch.int32)


def _step(model: RecordGPT, sums: TableSums | None) -> None:
    """Three micro-steps' backward, as the record trainer runs them."""
    prefix = torch.full((model.cfg.vocab,), -1)
    if sums is not None:
        sums.start()
    for inputs, targets, cu in _micro_batches(3):
        loss = model.training_loss(inputs, targets, cu, (8, 16), 0.1, [1.0, 0.5], 0.0, prefix,
                                   dtype=torch.float32, table_sums=sums and sums.pairs)
        (loss / 3).backward()
        if sums is not None:  # the tables get no gradient from autograd
            assert all(model.get_parameter(n).grad is None for n in sums.params)
    if sums is not None:
        sums.finish()


@pytest.mark.parametrize("odd", [False, True])
def test_a_step_s_gradients_are_autograd_s_bit_for_bit(one_thread, odd):
    ref, got = _model(RecordKernels()), _model(RecordKernels(lookup=LOOKUP))
    names = got.lookup_table_names()
    assert names == ["embed", "bigram_embed", "value_embeds"]
    sums = TableSums(got, names)
    if odd:  # the even step's pending sums, restored into .grad before the odd step's backward
        for name in names:
            pending = torch.randn_like(ref.get_parameter(name))
            ref.get_parameter(name).grad, got.get_parameter(name).grad = pending.clone(), pending.clone()
    _step(ref, None)
    _step(got, sums)
    for (name, a), b in zip(ref.named_parameters(), got.parameters()):
        assert (a.grad is None) == (b.grad is None), name
        assert a.grad is None or torch.equal(a.grad, b.grad), name
    for total, scratch in sums.pairs.values():
        assert not scratch.any()  # zero again after every micro-step


def test_a_step_that_never_reached_the_optimiser_is_dropped(one_thread):
    model = _model(RecordKernels(lookup=LOOKUP))
    sums = TableSums(model, model.lookup_table_names())
    _step(model, sums)
    first = {n: model.get_parameter(n).grad.clone() for n in sums.params}
    _step(model, sums)  # .grad is still the sums: start zeroes them rather than adding onto them
    for name, grad in first.items():
        assert torch.equal(model.get_parameter(name).grad, grad), name


def test_sums_without_a_lookup_and_unknown_tables_are_refused():
    model = _model(RecordKernels())
    with pytest.raises(ValueError, match="no parameter named 'nope'"):
        TableSums(model, ["nope"])
    sums = TableSums(model, ["embed"])
    with pytest.raises(ValueError, match="table sums given for 'embed' but the kernels"):
        _step(model, sums)


def test_the_trainer_hands_adam_autograd_s_sums_at_an_even_and_an_odd_step(tmp_path):
    from test_record_train import tiny, write_documents
    from speedrun.config import apply_overrides
    from speedrun.optim.record_adam import RecordAdam
    from speedrun.recipes.registry import get_preset
    from speedrun.train.dist import init_distributed
    from speedrun.train.record_loop import RecordTrainer
    from speedrun.train.record_micro import MicroLoss

    write_documents(tmp_path / "data")
    flags = tiny(tmp_path / "data")
    sets = [flags[i + 1] for i, f in enumerate(flags) if f == "--set"] + ["train.dtype=bfloat16", "fp8.head=false",
                                                                          "fp8.mlp=false"]
    cfg = apply_overrides(get_preset("demo"), sets + [f"data.data_dir={tmp_path / 'data'}"])
    seen: list[dict] = []
    original = RecordAdam.step

    def spy(self, closure=None, *, step):
        seen.append({n: p.grad.float().clone() for n, p in zip(("embed", "bigram_embed", "value_embeds"),
                                                              (tr.model.embed, tr.model.bigram_embed, tr.model.value_embeds))})
        return original(self, closure, step=step)

    runs = []
    for lookup in (None, LOOKUP):
        tr = RecordTrainer(cfg, init_distributed(), tmp_path / f"run-{lookup is None}", progress=False, t_start=0.0)
        if lookup is not None:
            tr.model.kernels = replace(tr.model.kernels, lookup=lookup)
            tr.loss = MicroLoss(cfg, tr.model, tr.device, tr.dtype, False)
        seen = []
        RecordAdam.step = spy
        try:
            tr.train_step(0)
            tr.train_step(1)
        finally:
            RecordAdam.step = original
        runs.append(seen)
    (ref0, ref1), (got0, got1) = runs
    for name in ref0:
        for ref, got in ((ref0, got0), (ref1, got1)):
            assert ((got[name] - ref[name]).norm() / ref[name].norm()).item() < 1e-2, name
        # the odd step's sums hold the even step's: without them they would be off by about ref0's share
        assert ((got1[name] - (ref1[name] - ref0[name])).norm() / ref1[name].norm()).item() > 0.1, name
