"""train.cudagraphs: the whole-model compile replayed as CUDA graphs. On the CPU only its gradient handling
runs (no graphs), and it must not change a bit of training; the config check rejects regional compiles.
On a GPU the compiled step with graphs must train like the one without, and the in-place gradient sums
(train.grad_accum=inplace, the default with graphs) must be read and written where they are."""

from __future__ import annotations

import json

import pytest
import torch

from reliability_helpers import assert_curves_close, curves, train
from speedrun.config import validate
from speedrun.errors import ConfigError
from speedrun.recipes.presets import record


def test_gradient_copies_leave_training_unchanged(tmp_path):
    """Two micro-steps a step: the first one's gradients copied out (own_grads), the second added into
    the copies. Every logged loss equals the default run's exactly."""
    assert train(tmp_path / "a", steps=4) == 0
    assert train(tmp_path / "b", "--set", "train.cudagraphs=true", steps=4) == 0
    (train_a, val_a), (train_b, val_b) = curves(tmp_path / "a"), curves(tmp_path / "b")
    assert len(train_a) == 4 and train_a == train_b and val_a == val_b
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    # no graphs where the step is not compiled on a GPU, and the summary says so; reserved memory (where
    # graphs keep their pools) is reported beside the allocated peak, None on the CPU
    assert summary["cuda_graphs"] is False and summary["peak_reserved_bytes"] is None


def test_cuda_graphs_reject_regional_compile():
    """train.cudagraphs acts on the whole-model compile only."""
    option = "cudagraphs"
    cfg = record()
    cfg.train.compile = "regional"
    setattr(cfg.train, option, True)
    with pytest.raises(ConfigError, match=f"train.{option}"):
        validate(cfg, 1)
    cfg.train.compile = "on"
    validate(cfg, 1)


@pytest.mark.gpu
def test_gpu_graphs_train_like_the_compiled_step(tmp_path):
    """The tiny run compiled on the GPU, with and without CUDA graphs: the same losses to within the
    run-to-run spread of the compiled step (its kernels' sums are not ordered)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    gpu = ["--set", "train.compile=on", "--set", "train.precompile=false", "--set", "train.warmup_steps=2"]
    assert train(tmp_path / "a", *gpu, steps=6) == 0
    assert train(tmp_path / "b", *gpu, "--set", "train.cudagraphs=true", steps=6) == 0
    assert_curves_close(tmp_path / "a", tmp_path / "b")
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["cuda_graphs"] is True and summary["peak_reserved_bytes"] > 0


@pytest.mark.gpu
def test_gpu_graphs_add_into_the_buffers_in_place():
    """Whole-model compile with CUDA graphs and train.grad_accum=inplace on a small model (a bfloat16
    table, float32 weights cast once a step): two steps of four micro-steps give the gradients of the
    same compile without graphs, bit for bit (the table's to float32 rounding: Inductor's embedding
    backward adds with atomics, in no fixed order). Had a replay copied the buffers into the graph's own
    inputs, the backward would add into the copies and the buffers would stay zero."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from test_grad_accum import Sliced, _batches, accumulate_inplace

    from speedrun.train import grad_accum
    from speedrun.compile.regional import compile_step_model

    def run(cudagraphs: bool):
        torch.manual_seed(0)
        model = Sliced().cuda()
        step_model = compile_step_model(model, "on", True, cudagraphs, summed="inplace")
        casts = grad_accum.StepCasts(model, ["pair", "up", "down"], torch.bfloat16, static=cudagraphs)
        bufs = grad_accum.GradBuffers(model, static=cudagraphs)
        call = _mark_steps(step_model) if cudagraphs else step_model
        grads = []
        for _ in range(2):
            batches = [(t.cuda(), y.cuda(), f) for t, y, f in _batches((0, 1, 0, 0))]
            grads.append(accumulate_inplace(call, model, batches, casts, bufs=bufs))
            with torch.no_grad():  # a stand-in optimiser step, so the second step's weights differ
                for p in model.parameters():
                    p.sub_(0.01 * p.grad.to(p.dtype) if p.grad is not None else 0)
        return grads

    want, got = run(False), run(True)
    for w, g in zip(want, got):
        for name in ("up", "down", "pair", "sometimes"):
            assert torch.equal(g[name], w[name]), name
        torch.testing.assert_close(g["embed.weight"].float(), w["embed.weight"].float(), rtol=2**-7, atol=1e-6)
        assert g["up"].abs().sum() > 0 and g["embed.weight"].abs().sum() > 0
    assert not torch.equal(want[0]["up"], want[1]["up"])  # the second step is another step


def _mark_steps(step_model):
    """The trainer's mark_graph_step before each micro-step's forward."""
    def call(*args):
        torch.compiler.cudagraph_mark_step_begin()
        return step_model(*args)
    return call


@pytest.mark.gpu
def test_gpu_graphs_replay_the_gluon_attention(tmp_path):
    """The Gluon attention's custom ops (attn_gluon.py) captured in CUDA graphs: a bfloat16 run at head_dim
    128 and 64-token mask blocks (where `auto` picks them on Hopper), compiled with and without graphs,
    trains the same to within the bfloat16 step's run-to-run spread, and the summaries say the Gluon
    kernels ran. A replay that read stale block lists or descriptors would drift from the first step."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon attention needs a Hopper GPU")
    shape = ["--set", "model.model_dim=128", "--set", "model.head_dim=128", "--set", "model.mlp_hidden=256",
             "--set", "train.dtype=bfloat16", "--set", "train.seq_len=1024", "--set", "train.val_seq_len=1024",
             "--set", "train.val_tokens=2048", "--set", "attention.backend=auto", "--set", "train.compile=on",
             "--set", "train.precompile=false", "--set", "train.warmup_steps=2"]
    assert train(tmp_path / "a", *shape, steps=6) == 0
    assert train(tmp_path / "b", *shape, "--set", "train.cudagraphs=true", steps=6) == 0
    assert_curves_close(tmp_path / "a", tmp_path / "b", rel=2e-3)
    for run, graphs in (("a", False), ("b", True)):
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert summary["attention_backend"] == "gluon" and summary["cuda_graphs"] is graphs
