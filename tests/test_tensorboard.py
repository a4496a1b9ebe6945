"""TensorBoard mirror: events hold the metrics.jsonl values; missing package is a one-line error."""

import importlib.util
import json

import pytest

from speedrun.cli.main import main

HAVE_TB = importlib.util.find_spec("tensorboard") is not None

RECORDS = [{"step": 0, "val_loss": 10.8, "train_time_ms": 0.0, "tokens": 0},
           {"step": 1, "train_loss": 9.5, "train_time_ms": 120.0, "tokens": 2048},
           {"step": 2, "train_loss": 8.25, "train_time_ms": 240.0, "tokens": 4096},
           {"step": 2, "val_loss": 8.5, "train_time_ms": 240.0, "tokens": 4096}]


def make_run(folder):
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return folder


def read_scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.skipif(not HAVE_TB, reason="tensorboard is not installed (pip install tensorboard)")
def test_convert_mirrors_metrics(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    assert main(["tensorboard", str(run)]) == 0
    assert "tensorboard --logdir" in capsys.readouterr().out
    s = read_scalars(run / "tensorboard")
    assert s["val_loss"] == [(0, pytest.approx(10.8)), (2, pytest.approx(8.5))]
    assert s["train_loss"] == [(1, pytest.approx(9.5)), (2, pytest.approx(8.25))]
    assert main(["tensorboard", str(run)]) == 2  # refuses to duplicate events
    assert "--overwrite" in capsys.readouterr().err
    assert main(["tensorboard", str(run), "--overwrite"]) == 0
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 1


@pytest.mark.skipif(not HAVE_TB, reason="tensorboard is not installed (pip install tensorboard)")
def test_writer_used_live(tmp_path):
    from speedrun.tools.tensorboard_log import TensorBoardWriter

    with TensorBoardWriter(tmp_path) as w:
        for r in RECORDS:
            w.log(r)
        w.log({"note": "no step"})
    assert read_scalars(tmp_path / "tensorboard")["tokens"][-1] == (2, 4096.0)


def test_missing_package_is_one_line_config_error(tmp_path, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *a, **k):
        if name == "tensorboard" or name.startswith("tensorboard."):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    assert main(["tensorboard", str(make_run(tmp_path / "run"))]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "pip install tensorboard" in err


def test_missing_run_is_one_line_error(tmp_path, capsys):
    assert main(["tensorboard", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "nope" in err
