"""The micro-steps' gradients added in place into buffers kept for the run (grad_accum.py), the training
path. It must give autograd's own accumulation bit for bit: compiled on the CPU (with a bfloat16 table
whose rounding Inductor would otherwise skip) and eager, with a parameter only one micro-step uses, one
no micro-step uses, and the casts made once a step; and the trainer's step must give autograd's on the
tiny model. On a GPU the compiled step, FP8 head operands made once a step included, must stay within
the compiled step's run-to-run spread of autograd's."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reliability_helpers import curves, train
from speedrun.train import grad_accum
from speedrun.train.grad_accum import compile_step_model


class Small(nn.Module):
    """A bfloat16 embedding table, two float32 weights used in bfloat16 (as the model's linears), and a
    weight that only some micro-steps use (long_blocks > 0)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(97, 32).to(torch.bfloat16)
        self.up = nn.Parameter(torch.randn(64, 32) / 6)
        self.down = nn.Parameter(torch.randn(32, 64) / 8)
        self.sometimes = nn.Parameter(torch.randn(32))

    def forward(self, tokens, targets, long_blocks, dtype=torch.bfloat16):
        x = self.embed(tokens)
        h = F.linear(x, self.up.to(dtype)).relu().square()
        y = F.linear(h, self.down.to(dtype)).float()
        if long_blocks:
            y = y * self.sometimes
        return F.cross_entropy(F.linear(y, self.embed.weight.float()), targets)


def reference(model: nn.Module, compiled: bool) -> nn.Module:
    """Autograd's own accumulation: the model itself, whole-model compiled where `compiled`."""
    return torch.compile(model, dynamic=False, fullgraph=True) if compiled else model


def _accumulate(step_model, model, batches):
    """A step of `batches` through autograd's accumulation; the gradients."""
    for p in model.parameters():
        p.grad = None
    for tokens, targets, flag in batches:
        loss = step_model(tokens, targets, flag, torch.bfloat16)
        (loss / len(batches)).backward()
    return {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}


def _batches(flags):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 97, (48,), generator=gen), torch.randint(0, 97, (48,), generator=gen), flag)
            for flag in flags]


def test_allow_caching_in_a_fresh_process():
    """Before anything has compiled (torch._functorch.config not yet imported), as in the trainer."""
    code = ("from speedrun.train import grad_accum; grad_accum.allow_caching(); import torch._functorch.config as c; "
            "assert c.autograd_cache_allow_custom_autograd_functions")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]


def test_round_bf16_is_the_cast():
    x = torch.cat([torch.randn(10_000) * 10.0 ** torch.randint(-40, 38, (10_000,)),
                   torch.tensor([0.0, -0.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.3895e38, -3.3895e38, 1e-45,
                                 float("inf"), float("-inf")])])
    want = x.bfloat16().float()
    assert torch.equal(grad_accum.round_bf16(x), want)
    assert grad_accum.round_bf16(torch.tensor([float("nan")])).isnan().all()


def accumulate_inplace(step_model, model, batches, casts=None, unused=(), bufs=None):
    """A step of `batches` with the in-place sums, as the trainer runs it (with `bufs`, the buffers kept
    from an earlier step); the gradients."""
    bufs = grad_accum.GradBuffers(model, unused) if bufs is None else bufs
    bufs.start()
    if casts is not None:
        casts.refresh()
    for tokens, targets, flag in batches:
        loss = step_model(tokens, targets, flag, torch.bfloat16, bufs.buffers,
                          None if casts is None else casts.aligned())
        (loss / len(batches)).backward()
    bufs.finish()
    return {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("compiled", [False, True])
def test_inplace_sums_equal_autograd_bit_for_bit(compiled):
    """The backward adds into buffers kept for the run. The same sums as autograd's bit for bit: the
    bfloat16 table, the float32 weights, a parameter only one micro-step uses, and the casts made once a
    step; the buffers are the parameters' `.grad` afterwards."""
    torch.manual_seed(0)
    model = Sliced()
    batches = _batches((0, 1, 0, 0))
    want = _accumulate(reference(model, compiled), model, batches)
    # compiled, the step with the casts alone, which adds in place too (each compiled step model is two
    # graphs' forward and backward through the CPU's C++ compiler: about 40 s of the suite)
    got = None if compiled else accumulate_inplace(compile_step_model(model, compiled), model, batches)
    casts = grad_accum.StepCasts(model, ["pair", "up", "down"], torch.bfloat16)
    cast = accumulate_inplace(compile_step_model(model, compiled), model, batches, casts)
    assert want.keys() == cast.keys()
    for name in want:
        assert cast[name].dtype == want[name].dtype and torch.equal(cast[name], want[name]), name
        assert got is None or torch.equal(got[name], want[name]), name
    assert want["embed.weight"].dtype == torch.bfloat16 and want["sometimes"].abs().sum() > 0


def test_inplace_leaves_an_unused_parameter_without_gradient():
    """No micro-step uses `sometimes`: autograd leaves its `.grad` None. The buffers cannot tell (theirs
    stays zero), so the parameters named unused keep None; unnamed, it gets the zeros."""
    torch.manual_seed(0)
    model = Small()
    batches = _batches((0, 0))
    want = _accumulate(model, model, batches)
    step_model = compile_step_model(model, False)
    named = accumulate_inplace(step_model, model, batches, unused=("sometimes",))
    unnamed = accumulate_inplace(step_model, model, batches)
    assert want["sometimes"] is None and named["sometimes"] is None
    assert torch.equal(unnamed["sometimes"], torch.zeros(32))
    for name in ("embed.weight", "up", "down"):
        assert torch.equal(named[name], want[name]) and torch.equal(unnamed[name], want[name]), name


def test_unused_parameter_names_match_autograd_for_every_preset():
    """`GPT.unused_parameter_names` against autograd: for every GPT preset (the ladder's rungs too), at
    a small width, exactly the trained parameters a training loss's backward leaves without gradient."""
    from speedrun.config import RunConfig
    from speedrun.model.gpt import GPT
    from speedrun.recipes.registry import registry

    seen = set()
    for name, build in registry().items():
        cfg = build()
        if not isinstance(cfg, RunConfig):  # the 2026 record's model has no unused parameters
            continue
        m = cfg.model
        m.model_dim, m.num_heads, m.head_dim, m.mlp_hidden, m.vocab_size = 64, 2, 32, 128, 1000
        torch.manual_seed(0)
        model = GPT(cfg.model, cfg.attention).train()
        tokens, targets = torch.randint(0, 1000, (2, 256))
        model(tokens, targets, torch.tensor(2, dtype=torch.int32), torch.float32).backward()
        without = [n for n, p in grad_accum.trained_parameters(model) if p.grad is None]
        assert model.unused_parameter_names() == without, name
        seen.add(tuple(without))
    assert seen == {(), ("scalars",)}  # both cases occur among the presets


class Sliced(Small):
    """Small, plus a float32 stack of two matrices read as slices, each cast (as GPT's qkvo_w)."""

    def __init__(self):
        super().__init__()
        self.pair = nn.Parameter(torch.randn(2, 32, 32) / 6)

    def forward(self, tokens, targets, long_blocks, dtype=torch.bfloat16):
        x = self.embed(tokens)
        x = x + F.linear(x, self.pair[0].to(dtype)) * F.linear(x, self.pair[1].to(dtype)).sigmoid()
        h = F.linear(x, self.up.to(dtype)).relu().square()
        y = F.linear(h, self.down.to(dtype)).float()
        if long_blocks:
            y = y * self.sometimes
        return F.cross_entropy(F.linear(y, self.embed.weight.float()), targets)


@pytest.mark.parametrize("compiled", [False, True])
def test_casts_once_a_step_give_the_same_gradients_bit_for_bit(compiled):
    """The float32 matrices cast before the step, not in each micro-step, give autograd's sums exactly;
    the bfloat16 table and the parameter that is not named keep their own path."""
    torch.manual_seed(0)
    model = Sliced()
    batches = _batches((0, 1, 0, 0))
    want = _accumulate(reference(model, compiled), model, batches)
    casts = grad_accum.StepCasts(model, ["pair", "up", "down", "embed.weight"], torch.bfloat16)
    names = [name for name, _ in grad_accum.trained_parameters(model)]
    assert [name for name, c in zip(names, casts.aligned()) if c is not None] == ["up", "down", "pair"]
    bufs = grad_accum.GradBuffers(model)
    got = accumulate_inplace(compile_step_model(model, compiled), model, batches, casts, bufs=bufs)
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
    # a second step after an update reads the updated weights (refresh), not the first step's casts
    with torch.no_grad():
        model.up.add_(0.25)
    want = _accumulate(model, model, batches)
    got = accumulate_inplace(compile_step_model(model, False), model, batches, casts, bufs=bufs)
    assert torch.equal(got["up"], want["up"]) and torch.equal(got["down"], want["down"])


def test_step_casts_checks_names_and_skips_float32_runs():
    model = Sliced()
    with pytest.raises(ValueError, match="'nope'"):
        grad_accum.StepCasts(model, ["up", "nope"], torch.bfloat16)
    assert grad_accum.StepCasts(model, ["up"], torch.float32).aligned() == [None] * 5  # nothing to cast
    casts = grad_accum.StepCasts(model, ["up"], torch.bfloat16)
    casts.refresh()
    assert torch.equal(casts.copies[0], model.up.detach().bfloat16())


def test_gpt_reads_its_cast_only_parameters_only_cast():
    """GPT.cast_only_names: the forward in bfloat16 with those parameters replaced by their bfloat16
    casts gives the same loss bit for bit; a parameter read in float32 anywhere would change it."""
    from speedrun.config import apply_overrides
    from speedrun.model.gpt import GPT
    from speedrun.recipes.presets import demo_2025_08 as demo

    cfg = demo()
    apply_overrides(cfg, ["model.num_layers=4", "model.model_dim=64", "model.num_heads=2", "model.head_dim=32",
                          "model.mlp_hidden=128", "model.long_layers=0,3", "model.no_attn_layers=2"])
    torch.manual_seed(0)
    model = GPT(cfg.model, cfg.attention)
    with torch.no_grad():
        for p in model.parameters():  # no zero-initialised weight may hide a read
            p.normal_(0.0, 0.05)
    names = model.cast_only_names()
    assert len(names) == 2 * 4 + 2 * 3  # fc_w, proj_w in every block; qkvo_w, gate_w where it attends
    tokens = torch.randint(0, 50257, (256,))
    window = torch.tensor(2)
    with torch.no_grad():
        want = model(tokens, tokens.roll(-1), window, torch.bfloat16)
        casts = {n: p.bfloat16() for n, p in model.named_parameters() if n in names}
        got = torch.func.functional_call(model, casts, (tokens, tokens.roll(-1), window, torch.bfloat16))
    assert torch.equal(got, want)
    with torch.no_grad():  # and the test can fail: a float32 read of one of them changes the loss
        casts["blocks.0.mlp.fc_w"] = casts["blocks.0.mlp.fc_w"].float() + 1e-3
        assert not torch.equal(torch.func.functional_call(model, casts, (tokens, tokens.roll(-1), window,
                                                                          torch.bfloat16)), want)


def test_summed_model_hands_keyword_arguments_to_the_model():
    """head_q (the FP8 head's operands, made once a step) reaches the model's forward with the sums and
    without."""
    class Seen(Small):
        def forward(self, tokens, targets, long_blocks, dtype=torch.bfloat16, head_q=None):
            self.seen = head_q
            return super().forward(tokens, targets, long_blocks, dtype)

    model = Seen()
    tokens, targets, flag = _batches((0,))[0]
    summed = grad_accum.SummedModel(model)
    marker = (torch.zeros(1), torch.ones(1))
    summed(tokens, targets, flag, torch.bfloat16, grad_accum.GradBuffers(model).buffers, None, head_q=marker)
    assert model.seen is marker
    summed(tokens, targets, flag, torch.bfloat16, head_q=None)
    assert model.seen is None


def test_casts_once_resume_exactly(tmp_path):
    """bfloat16 on the CPU with the casts made once a step: stopped by SIGTERM after step 2 and resumed,
    the run is the straight one loss for loss (the casts come from the restored weights)."""
    from reliability_helpers import resume

    bf16 = ["--set", "train.dtype=bfloat16", "--checkpoint-every", "2"]
    assert train(tmp_path / "straight", *bf16, steps=4) == 0
    run = tmp_path / "run"
    assert train(run, *bf16, "--set", "train.inject_fault=sigterm@2", steps=4) == 143
    assert resume(run) == 0
    assert curves(run) == curves(tmp_path / "straight")


TINY_GPT = ["model.num_layers=2", "model.value_embeds=1", "model.long_layers=0", "model.no_attn_layers=",
            "model.model_dim=64", "model.num_heads=1", "model.head_dim=64", "model.mlp_hidden=128",
            "train.seq_len=256", "train.batch_seqs=2", "attention.window_tokens=256", "train.warmup_steps=0",
            "train.val_tokens=0", "train.precompile=false"]


def trainer_and_autograd(folder: Path, overrides: list[str]) -> tuple[tuple, tuple]:
    """The trainer's first step on random tokens (its in-place sums, the embedding tables' rows, the
    casts and the FP8 head's operands made once a step), and the same batches through autograd's own
    accumulation on a copy of its model (compiled as the trainer's is): (mean loss, gradients) of each."""
    from speedrun.bench.step import write_random_data
    from speedrun.config import apply_overrides
    from speedrun.recipes.registry import get_preset
    from speedrun.train.dist import init_distributed
    from speedrun.train.loop import Trainer

    cfg = apply_overrides(get_preset("demo_2025_08"), TINY_GPT + overrides)
    info = init_distributed()
    write_random_data(folder / "data", cfg, 1, info.world_size)
    cfg.data.data_dir = str(folder / "data")
    cfg.data.train_pattern, cfg.data.val_pattern = "bench_train_*.bin", "bench_val_*.bin"
    torch._dynamo.reset()
    trainer = Trainer(cfg, info, folder / "run", progress=False)
    try:
        model = copy.deepcopy(trainer.model)
        batches, got = [], {}
        next_batches = trainer.guard.next_batches

        def recorded():
            batches.extend(next_batches())
            return list(batches)

        trainer.guard.next_batches = recorded
        trainer.guard.before_update = lambda step: got.update(_grads(trainer.model))
        trainer.guard.start()
        loss = trainer.train_step(0)
        window, dtype, compiled = trainer.window(0), trainer.dtype, trainer.compiled
    finally:
        trainer.session.release()
        trainer.loader.close()
        trainer.guard.close()
        trainer.out.close()
    step_model = reference(model, compiled)  # wrapped with the trainer's package cache off again
    total = torch.zeros((), device=window.device)
    for inputs, targets in batches:
        step_loss = step_model(inputs, targets, window, dtype)
        (step_loss / len(batches)).backward()
        total += step_loss.detach()
    return (loss, got), (total / (len(batches) * cfg.train.seq_len), _grads(model))


def _grads(model: nn.Module) -> dict:
    return {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("overrides", [
    pytest.param(["train.dtype=float32"], id="float32-eager"),
    pytest.param(["train.dtype=bfloat16", "train.compile=on"], id="bfloat16-compiled", marks=pytest.mark.slow)])
def test_trainer_step_is_autograds_bit_for_bit(tmp_path, overrides):
    """The tiny model with a value embedding on the CPU, two micro-steps: eager in float32 (the float32
    tables' rows add in the dense backward's order), and compiled in bfloat16 with the block matrices
    cast once a step: the trainer's loss and every gradient are autograd's, bit for bit."""
    (loss, got), (want_loss, want) = trainer_and_autograd(tmp_path, overrides)
    assert torch.equal(loss, want_loss)
    assert got.keys() == want.keys()
    for name in want:
        assert (got[name] is None) == (want[name] is None), name
        if want[name] is not None:
            assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
