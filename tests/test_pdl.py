"""train.pdl: Inductor's Triton kernels launched with programmatic dependent launch. The compile keys
name it (the config check that keeps it to the whole-model compile is in test_cudagraphs.py), and on a
GPU the compiled run must train like the one without and its kernels must carry the dependent-launch
wait."""

from __future__ import annotations

import pytest
import torch

from reliability_helpers import assert_curves_close, train
from speedrun.compile.cache import graph_config
from speedrun.recipes.presets import record


def test_key_names_it():
    """(Its rejection of regional compilation: test_cudagraphs.py's whole-model options test.)"""
    cfg = record()
    cfg.train.pdl = True
    assert graph_config(cfg)["train"]["pdl"] is True
    assert "pdl" not in graph_config(record())["train"]  # off: the keys of earlier runs hold


@pytest.mark.gpu
def test_gpu_pdl_trains_like_the_compiled_step(tmp_path, monkeypatch):
    """The tiny run compiled on the GPU with and without PDL: the same losses to within the compiled step's
    run-to-run spread; the kernels Inductor wrote for the PDL run wait on their predecessor."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper or newer GPU")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    gpu = ["--set", "train.compile=on", "--set", "train.precompile=false", "--set", "train.warmup_steps=2",
           "--set", "train.dtype=bfloat16", "--set", "train.dynamo_cache=false"]
    assert train(tmp_path / "a", *gpu, steps=6) == 0
    written = {p for p in (tmp_path / "inductor").rglob("*.py")}
    assert train(tmp_path / "b", *gpu, "--set", "train.pdl=true", steps=6) == 0
    new = [p for p in (tmp_path / "inductor").rglob("*.py") if p not in written]
    assert any("gdc_wait" in p.read_text(errors="replace") for p in new)
    assert_curves_close(tmp_path / "a", tmp_path / "b")
