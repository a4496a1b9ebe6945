"""train.grad_accum=graph: the micro-steps' gradients added up inside the compiled backward. It must give
autograd's sums bit for bit (compiled on the CPU, with a bfloat16 table whose rounding Inductor would
otherwise skip), keep a sum a micro-step did not touch, and train the tiny model exactly as autograd
does. On a GPU the compiled run must train like the autograd one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reliability_helpers import assert_curves_close, curves, train
from speedrun.train import grad_accum
from speedrun.config import validate
from speedrun.errors import ConfigError
from speedrun.recipes.presets import record
from speedrun.compile.regional import compile_step_model


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


def _accumulate(step_model, model, batches, sums: grad_accum.GradSums | None):
    for p in model.parameters():
        p.grad = None
    for tokens, targets, flag in batches:
        if sums is None:
            loss = step_model(tokens, targets, flag, torch.bfloat16)
        else:
            loss = step_model(tokens, targets, flag, torch.bfloat16, sums.begin())
        (loss / len(batches)).backward()
        if sums is not None:
            sums.end()
    return {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}


def _batches(flags):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 97, (48,), generator=gen), torch.randint(0, 97, (48,), generator=gen), flag)
            for flag in flags]


def test_compiled_sums_equal_autograd_bit_for_bit():
    torch.manual_seed(0)
    model = Small()
    batches = _batches((0, 0, 0, 0))
    want = _accumulate(compile_step_model(model, "on", True), model, batches, None)
    got = _accumulate(compile_step_model(model, "on", True, summed=True), model, batches, grad_accum.GradSums(model))
    assert want.keys() == got.keys() and want["sometimes"] is None and got["sometimes"] is None
    for name in ("embed.weight", "up", "down"):
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
    assert want["embed.weight"].dtype == torch.bfloat16


def test_a_parameter_some_micro_steps_skip_keeps_its_sum():
    """`sometimes` gets a gradient in the second micro-step only (eager: the sums' bookkeeping is the
    trainer's, the same compiled or not)."""
    torch.manual_seed(0)
    model = Small()
    batches = _batches((0, 1, 0, 0))
    want = _accumulate(model, model, batches, None)
    got = _accumulate(compile_step_model(model, "on", False, summed=True), model, batches,
                      grad_accum.GradSums(model))
    for name in want:
        assert torch.equal(got[name], want[name]), name
    none = _accumulate(compile_step_model(model, "on", False, summed=True), model, batches[:1],
                       grad_accum.GradSums(model))
    assert none["sometimes"] is None and none["up"] is not None


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


def test_resolve_and_config_check():
    assert grad_accum.resolve("auto", "auto", True, False, 8) == "graph"
    assert grad_accum.resolve("auto", "on", True, True, 8) == "inplace"  # CUDA graphs
    assert grad_accum.resolve("auto", "on", True, True, 1) == "autograd"
    assert grad_accum.resolve("auto", "regional", True, False, 8) == "autograd"
    assert grad_accum.resolve("auto", "auto", False, False, 8) == "autograd"  # not compiled
    assert grad_accum.resolve("auto", "auto", True, False, 1) == "autograd"  # one micro-step
    assert grad_accum.resolve("graph", "auto", False, False, 1) == "graph"
    cfg = record()
    cfg.train.grad_accum = "graph"
    validate(cfg, 1)
    for field, value in (("cudagraphs", True), ("compile", "regional")):
        bad = record()
        bad.train.grad_accum = "graph"
        setattr(bad.train, field, value)
        with pytest.raises(ConfigError, match="train.grad_accum"):
            validate(bad, 1)
    bad = record()
    bad.train.grad_accum = "fused"
    with pytest.raises(ConfigError, match="train.grad_accum"):
        validate(bad, 1)
    cfg = record()
    cfg.train.grad_accum, cfg.train.cudagraphs = "inplace", True
    validate(cfg, 1)
    cfg.train.compile, cfg.train.cudagraphs = "regional", False
    with pytest.raises(ConfigError, match="train.grad_accum: inplace needs the whole-model compile"):
        validate(cfg, 1)


def test_tiny_run_unchanged(tmp_path):
    """The tiny model (eager on the CPU, two micro-steps) with graph sums and with in-place sums: every
    loss as autograd's."""
    assert train(tmp_path / "autograd", "--set", "train.grad_accum=autograd", steps=4) == 0
    for mode in ("graph", "inplace"):
        assert train(tmp_path / mode, "--set", f"train.grad_accum={mode}", steps=4) == 0
        assert curves(tmp_path / "autograd") == curves(tmp_path / mode), mode
        assert json.loads((tmp_path / mode / "env.json").read_text())["run"]["grad_accum"] == mode


def accumulate_inplace(step_model, model, batches, casts=None, unused=(), bufs=None):
    """A step of `batches` with train.grad_accum=inplace, as the trainer runs it (with `bufs`, the
    buffers kept from an earlier step); the gradients."""
    bufs = grad_accum.GradBuffers(model, False, unused) if bufs is None else bufs
    bufs.start()
    if casts is not None:
        casts.refresh()
    for tokens, targets, flag in batches:
        loss = step_model(tokens, targets, flag, torch.bfloat16, bufs.begin(),
                          None if casts is None else casts.aligned())
        (loss / len(batches)).backward()
        bufs.end()
    bufs.finish()
    return {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("compiled", [False, True])
def test_inplace_sums_equal_autograd_bit_for_bit(compiled):
    """train.grad_accum=inplace: the backward adds into buffers kept for the run. The same sums as
    autograd's bit for bit: the bfloat16 table, the float32 weights, a parameter only one micro-step
    uses, and the casts made once a step; the buffers are the parameters' `.grad` afterwards."""
    torch.manual_seed(0)
    model = Sliced()
    batches = _batches((0, 1, 0, 0))
    want = _accumulate(compile_step_model(model, "on", compiled), model, batches, None)
    got = accumulate_inplace(compile_step_model(model, "on", compiled, summed="inplace"), model, batches)
    casts = grad_accum.StepCasts(model, ["pair", "up", "down"], torch.bfloat16)
    cast = accumulate_inplace(compile_step_model(model, "on", compiled, summed="inplace"), model, batches, casts)
    assert want.keys() == got.keys() == cast.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
        assert torch.equal(cast[name], want[name]), name
    assert want["embed.weight"].dtype == torch.bfloat16 and want["sometimes"].abs().sum() > 0


def test_inplace_leaves_an_unused_parameter_without_gradient():
    """No micro-step uses `sometimes`: autograd leaves its `.grad` None. The buffers cannot tell (theirs
    stays zero), so the parameters named unused keep None; unnamed, it gets the zeros."""
    torch.manual_seed(0)
    model = Small()
    batches = _batches((0, 0))
    want = _accumulate(model, model, batches, None)
    step_model = compile_step_model(model, "on", False, summed="inplace")
    named = accumulate_inplace(step_model, model, batches, unused=("sometimes",))
    unnamed = accumulate_inplace(step_model, model, batches)
    assert want["sometimes"] is None and named["sometimes"] is None
    assert torch.equal(unnamed["sometimes"], torch.zeros(32))
    for name in ("embed.weight", "up", "down"):
        assert torch.equal(named[name], want[name]) and torch.equal(unnamed[name], want[name]), name


def test_unused_parameter_names_match_autograd_for_every_preset():
    """`GPT.unused_parameter_names` against autograd: for every preset (the ladder's rungs too), at a
    small width, exactly the trained parameters a training loss's backward leaves without gradient."""
    from speedrun.model.gpt import GPT
    from speedrun.recipes.registry import registry

    seen = set()
    for name, build in registry().items():
        cfg = build()
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


@pytest.mark.gpu
def test_gpu_graph_sums_train_like_autograd(tmp_path):
    """The tiny run compiled on the GPU in bfloat16 (its embedding tables too), with sums in the graph
    (the default there, with the casts made once a step), with autograd's, with the graph's sums but
    the casts in every micro-step, and with the FP8 head's weight operands made in each micro-step's
    head op (train.head_once=false; the default makes them once a step): the same losses to within the compiled step's run-to-run spread."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    gpu = ["--set", "train.compile=on", "--set", "train.precompile=false", "--set", "train.warmup_steps=2",
           "--set", "train.dtype=bfloat16"]
    assert train(tmp_path / "a", *gpu, "--set", "train.grad_accum=autograd", steps=6) == 0
    assert train(tmp_path / "b", *gpu, steps=6) == 0
    assert train(tmp_path / "c", *gpu, "--set", "train.cast_once=false", steps=6) == 0
    assert train(tmp_path / "d", *gpu, "--set", "train.head_once=false", steps=6) == 0
    assert_curves_close(tmp_path / "a", tmp_path / "b")
    assert_curves_close(tmp_path / "c", tmp_path / "b")
    assert_curves_close(tmp_path / "d", tmp_path / "b")
    run = json.loads((tmp_path / "b" / "env.json").read_text())["run"]
    assert run["grad_accum"] == "inplace" and run["embed_rows"] is True  # model.embed_kernel=rows, the default
    assert run["cast_once"] is True and run["head_once"] is True
    assert json.loads((tmp_path / "c" / "env.json").read_text())["run"]["cast_once"] is False
    assert json.loads((tmp_path / "d" / "env.json").read_text())["run"]["head_once"] is False


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


def _accumulate_cast(step_model, model, batches, casts: grad_accum.StepCasts):
    sums = grad_accum.GradSums(model)
    for p in model.parameters():
        p.grad = None
    casts.refresh()
    for tokens, targets, flag in batches:
        loss = step_model(tokens, targets, flag, torch.bfloat16, sums.begin(), casts.aligned())
        (loss / len(batches)).backward()
        sums.end()
    return {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("compiled", [False, True])
def test_casts_once_a_step_give_the_same_gradients_bit_for_bit(compiled):
    """train.cast_once: the float32 matrices cast before the step, not in each micro-step, give autograd's
    sums exactly; the bfloat16 table and the parameter that is not named keep their own path."""
    torch.manual_seed(0)
    model = Sliced()
    batches = _batches((0, 1, 0, 0))
    want = _accumulate(compile_step_model(model, "on", compiled), model, batches, None)
    casts = grad_accum.StepCasts(model, ["pair", "up", "down", "embed.weight"], torch.bfloat16)
    names = [name for name, _ in grad_accum.trained_parameters(model)]
    assert [name for name, c in zip(names, casts.aligned()) if c is not None] == ["up", "down", "pair"]
    got = _accumulate_cast(compile_step_model(model, "on", compiled, summed=True), model, batches, casts)
    for name in want:
        if want[name] is None:
            assert got[name] is None, name
        else:
            assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
    # a second step after an update reads the updated weights (refresh), not the first step's casts
    with torch.no_grad():
        model.up.add_(0.25)
    want = _accumulate(compile_step_model(model, "on", False), model, batches, None)
    got = _accumulate_cast(compile_step_model(model, "on", False, summed=True), model, batches, casts)
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
    from speedrun.recipes.presets import demo

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


def test_tiny_run_with_casts_once_unchanged(tmp_path):
    """The tiny model in bfloat16 on the CPU (eager, graph sums): every loss the same with the casts made
    once a step and in every micro-step."""
    bf16 = ["--set", "train.grad_accum=graph", "--set", "train.dtype=bfloat16"]
    assert train(tmp_path / "a", *bf16, "--set", "train.cast_once=false", steps=3) == 0
    assert train(tmp_path / "b", *bf16, steps=3) == 0
    assert curves(tmp_path / "a") == curves(tmp_path / "b")
    assert json.loads((tmp_path / "b" / "env.json").read_text())["run"]["cast_once"] is True
    assert json.loads((tmp_path / "a" / "env.json").read_text())["run"]["cast_once"] is False


def test_summed_model_hands_keyword_arguments_to_the_model():
    """head_q (train.head_once) reaches the model's forward with the sums and without."""
    class Seen(Small):
        def forward(self, tokens, targets, long_blocks, dtype=torch.bfloat16, head_q=None):
            self.seen = head_q
            return super().forward(tokens, targets, long_blocks, dtype)

    model = Seen()
    tokens, targets, flag = _batches((0,))[0]
    summed = grad_accum.SummedModel(model)
    marker = (torch.zeros(1), torch.ones(1))
    summed(tokens, targets, flag, torch.bfloat16, grad_accum.GradSums(model).begin(), None, head_q=marker)
    assert model.seen is marker
    summed(tokens, targets, flag, torch.bfloat16, head_q=None)
    assert model.seen is None


def test_head_once_without_fp8_changes_nothing(tmp_path):
    """On the CPU the head is not FP8: train.head_once leaves the run as it is and says so."""
    assert train(tmp_path / "a", "--set", "train.head_once=true", steps=2) == 0
    assert json.loads((tmp_path / "a" / "env.json").read_text())["run"]["head_once"] is False


def test_compile_key_names_head_once_only_when_on():
    """head_once is on by default and the compile keys name it, so the keys of earlier runs (their graphs
    quantise the head's weight in each micro-step) never match the new graphs; off, the earlier keys hold."""
    from speedrun.compile.cache import graph_config
    from speedrun.recipes.presets import record

    cfg = record()
    assert cfg.train.head_once is True and graph_config(cfg)["train"]["head_once"] is True
    cfg.train.head_once = False
    assert "head_once" not in graph_config(cfg)["train"]


def test_casts_once_resume_exactly(tmp_path):
    """bfloat16 on the CPU with the casts made once a step: stopped by SIGTERM after step 2 and resumed,
    the run is the straight one loss for loss (the casts come from the restored weights)."""
    from reliability_helpers import resume

    bf16 = ["--set", "train.grad_accum=graph", "--set", "train.dtype=bfloat16", "--checkpoint-every", "2"]
    assert train(tmp_path / "straight", *bf16, steps=4) == 0
    run = tmp_path / "run"
    assert train(run, *bf16, "--set", "train.inject_fault=sigterm@2", steps=4) == 143
    assert resume(run) == 0
    assert curves(run) == curves(tmp_path / "straight")
    assert json.loads((run / "env.json").read_text())["run"]["cast_once"] is True
