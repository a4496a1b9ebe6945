"""Dynamo's package cache: where packages go, the fallback when one cannot be installed, and a
warm start that skips tracing yet trains the same.

The last test runs the real trainer twice on the CPU (tiny model, compiled, fresh processes, one
cache folder): the first run compiles and saves its packages; the second finds them, compiles no
graph at all (Dynamo's own counter stays at 0), and logs the same losses.
"""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from speedrun.compile import dynamo_cache
from speedrun.compile.cache import cache_key
from speedrun.recipes.presets import demo_2025_08 as demo

pytestmark = pytest.mark.skipif(not dynamo_cache.supported(), reason="this torch has no caching precompile")


@pytest.fixture
def restore_dynamo(monkeypatch):
    from torch._dynamo.package import DynamoCache

    before = torch._dynamo.config.caching_precompile
    torch._dynamo.config.caching_precompile = False  # torch's default, whatever ran before in this worker
    yield
    torch._dynamo.config.caching_precompile = before
    DynamoCache.__dict__.pop("path_prefix", None)


def test_off_before_torch_2_13_where_installing_failed(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    assert not dynamo_cache.supported()
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    assert dynamo_cache.supported()


def test_off_by_config_changes_nothing(restore_dynamo):
    cfg = demo()
    cfg.train.dynamo_cache = False
    assert dynamo_cache.enable(cfg, torch.device("cpu"), 1, 0) is None
    assert torch._dynamo.config.caching_precompile is False


def test_packages_go_to_a_folder_per_run_key_device_and_rank(restore_dynamo, monkeypatch, tmp_path):
    from torch._dynamo.package import DynamoCache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cfg = demo()
    packages = dynamo_cache.enable(cfg, torch.device("cpu"), 2, 1)
    assert packages.path == tmp_path / "inductor" / dynamo_cache.FOLDER / f"{cache_key(cfg, 'cpu', 2)}-cpu-r1"
    assert not packages.found
    assert torch._dynamo.config.caching_precompile is True and DynamoCache.path_prefix() == str(packages.path)
    other = demo()
    other.model.num_layers += 1  # another graph: another folder
    assert dynamo_cache.enable(other, torch.device("cpu"), 2, 1).path != packages.path
    dynamo_cache.disable(packages)
    assert torch._dynamo.config.caching_precompile is False
    assert DynamoCache.path_prefix() != str(packages.path)  # torch's own location again


def test_a_package_that_fails_to_install_is_deleted_and_compiling_goes_on(restore_dynamo, tmp_path):
    entry = tmp_path / "pkg" / "abc" / "entry"
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"not a package")
    packages = dynamo_cache.DynamoPackages(path=tmp_path / "pkg", found=dynamo_cache.has_package(tmp_path / "pkg"))
    assert packages.found
    torch._dynamo.config.caching_precompile = True
    calls = []

    def compile_fn():
        calls.append(torch._dynamo.config.caching_precompile)
        if len(calls) == 1:
            raise TypeError("assigned grad expected to be a Tensor or None")
        return "compiled"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dynamo_cache.compile_with(packages, compile_fn) == "compiled"
    assert calls == [True, False]  # retried with the feature off
    assert not packages.path.exists() and not packages.found
    assert "assigned grad" in dynamo_cache.failed_note(packages.path).read_text()  # later runs: not again
    assert any("could not install" in str(w.message) and str(packages.path) in str(w.message) for w in caught)


def test_a_key_whose_package_failed_before_is_not_tried_again(restore_dynamo, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cfg = demo()
    packages = dynamo_cache.enable(cfg, torch.device("cpu"), 1, 0)
    dynamo_cache.disable(packages)
    packages.path.parent.mkdir(parents=True)
    dynamo_cache.failed_note(packages.path).write_text("TypeError\n")
    assert dynamo_cache.enable(cfg, torch.device("cpu"), 1, 0) is None
    assert torch._dynamo.config.caching_precompile is False


def test_no_packages_no_save():
    assert dynamo_cache.save(None) is False


TINY = ["--preset", "demo_2025_08", "--no-progress", "--set", "model.num_layers=1", "--set", "model.value_embeds=0",
        "--set", "model.model_dim=32", "--set", "model.num_heads=2", "--set", "model.head_dim=16",
        "--set", "model.mlp_hidden=64", "--set", "model.long_layers=0", "--set", "train.compile=on",
        "--set", "train.warmup_steps=2", "--set", "train.steps=3", "--set", "train.val_every=3",
        "--set", "train.seq_len=256", "--set", "train.batch_seqs=2", "--set", "train.val_seq_len=512",
        "--set", "train.val_tokens=1024", "--set", "train.sample_tokens=0"]


def _train(out: Path, env: dict) -> tuple[str, dict, list]:
    run = subprocess.run([sys.executable, "-m", "speedrun.train", *TINY, "--out", str(out)], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return run.stdout, json.loads((out / "summary.json").read_text()), records


def test_second_run_loads_the_packages_traces_nothing_and_trains_the_same(tmp_path):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), SPEEDRUN_HOME=str(tmp_path / "home"),
               SPEEDRUN_COMPILE_CACHE="off")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out1, cold, rec1 = _train(tmp_path / "cold", dict(env, PYTHONDONTWRITEBYTECODE="1"))
    out2, warm, rec2 = _train(tmp_path / "warm", env)
    assert "note: PYTHONDONTWRITEBYTECODE is set" in out1 and "PYTHONDONTWRITEBYTECODE" not in out2
    assert "dynamo cache: none" in out1 and "dynamo cache: found" in out2
    assert "local compile caches: cold" in out1 and "local compile caches: warm" in out2
    assert len(list((tmp_path / "inductor" / "speedrun-warm").iterdir())) == 1  # the first run's warm note
    assert "dynamo_save" in cold["cold_start_phases_s"] and "dynamo_save" not in warm["cold_start_phases_s"]
    # the warm run compiled no graph at all, before or after its first timed step
    assert warm["graphs_compiled_in_timed_run"] == 0 and cold["graphs_compiled_in_timed_run"] == 0
    assert warm["cold_start_phases_s"]["first_step"] < cold["cold_start_phases_s"]["first_step"] / 3
    assert "first_validation" in warm["cold_start_phases_s"]  # the step-0 validation is inside the cold start
    # warm: one warm-up step (train.warmup_steps_warm) instead of train.warmup_steps=2
    assert "warmup_steps" in cold["cold_start_phases_s"] and "warmup_steps" not in warm["cold_start_phases_s"]
    losses1 = [r.get("train_loss", r.get("val_loss")) for r in rec1 if "event" not in r]
    losses2 = [r.get("train_loss", r.get("val_loss")) for r in rec2 if "event" not in r]
    assert len(losses1) == len(losses2) >= 5
    assert losses1[:3] == losses2[:3]  # the step-0 validation and the first steps: bit for bit
    assert losses2 == pytest.approx(losses1, rel=1e-4)  # later: the CPU's threaded reductions may reorder sums
