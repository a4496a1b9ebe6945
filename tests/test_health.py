"""Health records, and injected faults ending as the policy says.

Faults are tied to data batches (see speedrun/run/faults.py). Every run here
checkpoints every 2 steps; after any fault the checkpoints written before it
must still be there and loadable.
"""

import json
import math


from reliability_helpers import events, records, train
from speedrun.run import checkpoint as ck
from speedrun.run.health import LossJudge

CKPT = ["--checkpoint-every", "2", "--keep-checkpoints", "--set", "train.health_every=2"]


def _good_checkpoints(run):
    done = ck.committed(run / "checkpoints")
    assert done, "no checkpoint left"
    for folder in done:
        ck.load_model(folder)  # complete and loadable
        assert math.isfinite(json.loads((folder / "trainer.json").read_text())["train_time_s"])
    assert not list((run / "checkpoints").glob(".tmp-*"))
    return [f.name for f in done]


def test_health_records_every_k_steps(tmp_path):
    run = tmp_path / "run"
    assert train(run, "--set", "train.health_every=2", steps=6) == 0
    health = [r for r in records(run) if "health" in r]
    assert [r["step"] for r in health] == [2, 4, 6]
    h = health[0]["health"]
    assert set(h) == {"loss", "grad_norm", "update_norm", "weight_norm", "act_rms"}
    assert len(h["act_rms"]) == 2 and all(v > 0 for v in h["act_rms"])
    assert h["grad_norm"] > 0 and h["update_norm"] > 0 and h["weight_norm"]["total"] > 0
    assert {"embed", "head", "matrix", "scalar"} <= set(h["weight_norm"])


def test_loss_judge():
    j = LossJudge(spike_factor=2.0)
    assert all(j.judge(i, i, 10.0 - i * 0.1) is None for i in range(5))
    assert j.judge(5, 5, 25.0).reason.startswith("loss spike at step 5")
    assert j.judge(6, 6, float("nan")).batches == [5, 6]
    assert j.judge(7, 7, 9.4) is None
    assert LossJudge(0).judge(0, 0, 1e9) is None  # off (no history needed either)


def test_nan_batch_with_stop_policy(tmp_path, capsys):
    run = tmp_path / "run"
    assert train(run, *CKPT, "--set", "train.inject_fault=nan@3") == 3
    err = capsys.readouterr().err
    assert "training loss is nan at step 3" in err and "stopped (--on-fault stop)" in err
    assert "step_000002" in err  # the last good checkpoint is named
    assert not (run / "summary.json").exists()
    assert _good_checkpoints(run)[-1] == "step_000002"
    assert events(run, "fault")[0]["policy"] == "stop"


def test_nan_batch_recovers(tmp_path):
    run = tmp_path / "run"
    assert train(run, *CKPT, "--on-fault", "recover", "--set", "train.inject_fault=nan@3") == 0
    (rec,) = events(run, "recover")
    assert rec["step"] == 2 and rec["lr_factor"] == 0.5 and 3 in rec["skip_batches"]
    assert any("FP8" in a for a in rec["actions"])
    summary = json.loads((run / "summary.json").read_text())
    assert math.isfinite(summary["final_val_loss"])
    assert all(math.isfinite(r["train_loss"]) for r in records(run) if "train_loss" in r)
    names = _good_checkpoints(run)
    meta = json.loads((run / "checkpoints" / names[-1] / "trainer.json").read_text())
    assert meta["recoveries"] == 1 and meta["lr_factor"] == 0.5 and 3 in meta["skip_batches"]


def test_gradient_overflow_recovers(tmp_path):
    run = tmp_path / "run"
    assert train(run, *CKPT, "--on-fault", "recover", "--set", "train.inject_fault=grad_inf@3") == 0
    (fault,) = events(run, "fault")
    assert "gradient norm is" in fault["reason"]  # step 3 is a health step: caught at its gradient
    assert 3 in events(run, "recover")[0]["skip_batches"]
    _good_checkpoints(run)


def test_gradient_overflow_between_health_steps(tmp_path):
    """Not a health step: the next loss is NaN (or the weights, before a checkpoint)."""
    run = tmp_path / "run"
    assert train(run, *CKPT, "--set", "train.inject_fault=grad_inf@2", steps=6) == 3
    assert _good_checkpoints(run)[-1] == "step_000002"


def test_forced_spike(tmp_path, capsys):
    run = tmp_path / "run"
    assert train(run, *CKPT, "--on-fault", "recover", "--set", "train.inject_fault=spike@5",
                 "--set", "train.spike_factor=1.5") == 0
    (fault,) = events(run, "fault")
    assert fault["reason"].startswith("loss spike at step 5")
    assert events(run, "recover")[0]["skip_batches"] == [5]
    assert "recovery 1/3" in capsys.readouterr().out


def test_persistent_fault_gives_up(tmp_path, capsys):
    run = tmp_path / "run"
    code = train(run, *CKPT, "--on-fault", "recover", "--set", "train.max_recoveries=2",
                 "--set", "train.inject_fault=nan@3+", steps=6)
    assert code == 3
    assert "gave up after 2 recoveries" in capsys.readouterr().err
    assert len(events(run, "recover")) == 2
    _good_checkpoints(run)
