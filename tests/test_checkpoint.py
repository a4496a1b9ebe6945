"""Resumable checkpoints: complete or absent, the previous one survives, state round-trips."""

import errno
import json
import random

import numpy as np
import torch

from reliability_helpers import events, train
from speedrun.run import checkpoint as ck
from speedrun.optim.adam import DistAdam
from speedrun.config import RunConfig
from speedrun.optim.muon import Muon


def _snap(step: int, value: float = 1.0) -> ck.Snapshot:
    model = {"w": torch.full((4, 4), value)}
    return ck.Snapshot(ck.checkpoint_name(step), RunConfig(name="t"), {"step": step, "world_size": 1},
                       {"optimizers": [], "rng": ck.rng_state()}, model)


def _write(run, step, value=1.0):
    w = ck.CheckpointWriter(run, 0, 1)
    w.start(_snap(step, value))
    return w.wait()


def test_commit_latest_and_keep_two(tmp_path):
    for step in (0, 3, 6):
        result = _write(tmp_path, step, float(step))
        assert result.error is None and result.path.name == ck.checkpoint_name(step)
    assert [p.name for p in ck.committed(tmp_path / "checkpoints")] == ["step_000003", "step_000006"]
    latest = ck.latest_checkpoint(tmp_path)
    assert latest.name == "step_000006"
    loaded = ck.load_checkpoint(latest, 0)
    assert torch.equal(loaded.model["w"], torch.full((4, 4), 6.0)) and loaded.trainer["step"] == 6


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    assert _write(tmp_path, 2).error is None

    def disk_full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck, "_write_model", disk_full)  # dies after rank0.pt was written
    result = _write(tmp_path, 4)
    assert isinstance(result.error, OSError) and result.path is None
    assert ck.latest_checkpoint(tmp_path).name == "step_000002"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000002"]


def test_leftovers_of_a_crash_are_ignored_and_removed(tmp_path):
    _write(tmp_path, 2)
    half = tmp_path / "checkpoints" / ".tmp-step_000004"
    half.mkdir()
    (half / "rank0.pt").write_bytes(b"partial")
    (tmp_path / "checkpoints" / "latest").write_text("step_000009\n")  # names nothing complete
    assert ck.latest_checkpoint(tmp_path).name == "step_000002"
    ck.remove_partial(tmp_path)
    assert not half.exists()


def test_other_rank_failure_aborts_the_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(ck, "COMMIT_TIMEOUT_S", 5.0)
    tmp = tmp_path / "checkpoints" / ".tmp-step_000001"
    tmp.mkdir(parents=True)
    (tmp / "rank1.failed").touch()
    w = ck.CheckpointWriter(tmp_path, 0, 2)
    w.start(_snap(1))
    result = w.wait()
    assert "rank 1" in str(result.error) and ck.latest_checkpoint(tmp_path) is None and not tmp.exists()


def test_rng_state_round_trip():
    state = ck.rng_state()
    a = (torch.rand(3), random.random(), np.random.rand())
    ck.set_rng_state(state)
    b = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


def test_optimizer_state_round_trip(tmp_path):
    """Muon and DistAdam state_dict -> file -> fresh optimisers gives identical next steps."""
    def make():
        torch.manual_seed(0)
        m, v = torch.nn.Parameter(torch.randn(8, 8)), torch.nn.Parameter(torch.randn(8))
        return [m, v], [Muon([m], lr=0.05, ns_impl="reference"), DistAdam([v], lr=0.01)]

    def step(params, opts, seed):
        g = torch.Generator().manual_seed(seed)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        for o in opts:
            o.step()

    pa, oa = make()
    step(pa, oa, 1)
    host = ck.HostCopier().copy({"optimizers": [o.state_dict() for o in oa]}, torch.device("cpu"))
    torch.save(host, tmp_path / "o.pt")
    pb, ob = make()
    with torch.no_grad():
        for a, b in zip(pa, pb):
            b.copy_(a)
    for o, s in zip(ob, torch.load(tmp_path / "o.pt", weights_only=True)["optimizers"]):
        o.load_state_dict(s)
    step(pa, oa, 2)
    step(pb, ob, 2)
    assert all(torch.equal(a, b) for a, b in zip(pa, pb))


def test_checkpoint_folder_is_a_model_folder(tmp_path):
    """sample/export load a checkpoint like a finished run (load_model)."""
    run = tmp_path / "run"
    assert train(run, "--checkpoint-every", "2", "--keep-checkpoints", steps=3) == 0
    model, cfg = ck.load_model(ck.latest_checkpoint(run))
    assert cfg.model.num_layers == 2
    meta = json.loads((ck.latest_checkpoint(run) / "trainer.json").read_text())
    assert meta["step"] == 2 and meta["config_hash"] == ck.config_hash(cfg)
    assert {e["name"] for e in events(run, "checkpoint_written")} == {"step_000000", "step_000002"}


def test_run_survives_a_full_disk(tmp_path, monkeypatch, capsys):
    real = ck._write_model
    calls = []

    def sometimes_full(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(ck, "_write_model", sometimes_full)
    run = tmp_path / "run"
    assert train(run, "--checkpoint-every", "2", "--keep-checkpoints", steps=5) == 0
    (failed,) = events(run, "checkpoint_failed")
    assert failed["name"] == "step_000002" and "No space left" in failed["reason"]
    assert "could not be written" in capsys.readouterr().out
    assert ck.latest_checkpoint(run).name == "step_000004"
    assert not list((run / "checkpoints").glob(".tmp-*"))
