"""train.cudagraphs: the whole-model compile replayed as CUDA graphs. On the CPU only its gradient handling
runs (no graphs), and it must not change a bit of training; the config check rejects regional compiles.
On a GPU the compiled step with graphs must train like the one without."""

from __future__ import annotations

import json

import pytest
import torch

from reliability_helpers import assert_curves_close, curves, train
from speedrun.config import validate
from speedrun.errors import ConfigError
from speedrun.presets import record


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


@pytest.mark.parametrize("option", ["cudagraphs", "pdl"])
def test_whole_model_options_reject_regional_compile(option):
    """train.cudagraphs and train.pdl (test_pdl.py) act on the whole-model compile only."""
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
