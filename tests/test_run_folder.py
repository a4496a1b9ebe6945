"""What `speedrun train` does with its run folder and its data, seen from the command line: runs it
refuses to train over, paths it cannot write, shards it cannot train on, what it leaves behind, and
what it tells the user while it runs."""

import json

import numpy as np
import pytest

from reliability_helpers import TINY, main, records, resume, train
from speedrun.data import shards
from speedrun.data.shards import HEADER_INTS, MAGIC, VERSION, write_shard


def _one_line_error(capsys, code, expected_code=2):
    err = capsys.readouterr().err.strip()
    assert code == expected_code, err
    assert err.startswith("speedrun: error: ") and "\n" not in err and "Traceback" not in err
    return err


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A run stopped by SIGTERM at step 2, with a checkpoint to resume."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    assert train(run, "--checkpoint-every", "2", "--set", "train.inject_fault=sigterm@1", steps=6) == 143
    return run


def _tokens(n: int, seed: int, top: int = 1000) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, top, n).astype(np.uint16)


def _data(folder, prefix: str = "mine", bad: int | None = None, bad_in: str = "train") -> None:
    """A train and a val shard big enough for the tiny config; `bad` puts that id into one of them."""
    train_t, val_t = _tokens(4096, 0), _tokens(1024, 1)
    if bad is not None:
        (train_t if bad_in == "train" else val_t)[700] = bad
    write_shard(folder / f"{prefix}_train_000000.bin", train_t)
    write_shard(folder / f"{prefix}_val_000000.bin", val_t)


def _write_public_shard(path, tokens) -> None:
    """A shard as the public FineWeb files are: the header's id field left 0."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (MAGIC, VERSION, len(tokens))
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes())


# ---------------------------------------------------------------- runs already in the folder

def test_an_interrupted_run_is_not_trained_over(stopped_run, capsys):
    before = (stopped_run / "metrics.jsonl").read_text()
    err = _one_line_error(capsys, train(stopped_run, steps=2))
    assert "holds an unfinished run" in err and f"--resume {stopped_run}" in err and "--overwrite" in err
    assert (stopped_run / "metrics.jsonl").read_text() == before
    assert (stopped_run / "checkpoints").is_dir()


def test_overwrite_replaces_an_interrupted_run_whole(stopped_run, tmp_path):
    run = tmp_path / "run"
    import shutil

    shutil.copytree(stopped_run, run)
    assert train(run, "--overwrite", steps=2) == 0
    steps = [r["step"] for r in records(run) if "train_loss" in r]
    assert steps == [1, 2] and not any("event" in r for r in records(run))  # the old run's records are gone
    assert not (run / "checkpoints").exists()


# ---------------------------------------------------------------- paths it cannot write

def test_an_out_path_under_a_file_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    err = _one_line_error(capsys, train(blocker / "run", steps=1))
    assert f"--out {blocker / 'run'}: cannot write the run folder" in err
    err = _one_line_error(capsys, train(blocker, steps=1))
    assert f"--out {blocker}: exists and is not a folder" in err


# ---------------------------------------------------------------- data

def test_a_token_past_the_vocabulary_is_refused_before_the_first_step(tmp_path, capsys):
    data = tmp_path / "data"
    _data(data, prefix="demo", bad=50300)
    out = tmp_path / "run"
    err = _one_line_error(capsys, train(out, "--data-dir", str(data), steps=2))
    assert "demo_train_000000.bin: holds token id 50300, outside the vocabulary of 50257 (model.vocab_size)" in err
    assert not out.exists()  # refused while setting up: no folder left behind


def test_a_public_shard_is_scanned_for_ids_past_the_vocabulary(tmp_path, capsys):
    data = tmp_path / "data"
    _data(data, prefix="demo")
    val = _tokens(1024, 1)
    val[5] = 50257
    _write_public_shard(data / "demo_val_000000.bin", val)
    err = _one_line_error(capsys, train(tmp_path / "run", "--data-dir", str(data), steps=2))
    assert "demo_val_000000.bin: token id 50257 at position 5 is outside the vocabulary of 50257" in err


def test_shards_written_here_are_checked_from_their_header(tmp_path, monkeypatch):
    path = write_shard(tmp_path / "a.bin", [1, 2, 50256])
    assert shards.id_bound(path) == 50257

    def no_scan(*args, **kwargs):
        raise AssertionError("a shard written by speedrun was scanned")

    monkeypatch.setattr(shards, "validate_shard", no_scan)
    shards.check_vocab([path], 50257)
    with pytest.raises(shards.DataError, match="holds token id 50256, outside the vocabulary of 50000"):
        shards.check_vocab([path], 50000)


def test_a_folder_of_tokenised_shards_trains_with_data_dir_alone(tmp_path):
    data = tmp_path / "data"
    _data(data, prefix="mybooks")
    run = tmp_path / "run"
    assert train(run, "--data-dir", str(data), steps=2) == 0
    assert json.loads((run / "summary.json").read_text())["final_val_loss"] > 0


def test_a_folder_with_two_series_names_them(tmp_path, capsys):
    data = tmp_path / "data"
    _data(data, prefix="a")
    _data(data, prefix="b")
    err = _one_line_error(capsys, train(tmp_path / "run", "--data-dir", str(data), steps=2))
    assert "no train shards: nothing matches 'demo_train_*.bin', several series match" in err
    assert "(a, b)" in err and "data.train_pattern" in err


def test_an_empty_folder_says_what_was_looked_for(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    err = _one_line_error(capsys, train(tmp_path / "run", "--data-dir", str(data), steps=2))
    assert "nothing matches 'demo_train_*.bin', nor '*_train_[0-9]*.bin'" in err


# ---------------------------------------------------------------- what a run leaves and says

def test_a_run_that_fails_while_setting_up_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "runs" / "r"
    _one_line_error(capsys, train(out, "--data-dir", str(tmp_path / "absent"), steps=2))
    assert not out.exists()


def test_a_finished_run_keeps_its_model_and_drops_its_checkpoints(tmp_path):
    run, kept = tmp_path / "run", tmp_path / "kept"
    assert train(run, "--checkpoint-every", "2", steps=4) == 0
    assert (run / "model.safetensors").exists() and not (run / "checkpoints").exists()
    assert train(kept, "--checkpoint-every", "2", "--keep-checkpoints", steps=4) == 0
    assert (kept / "checkpoints" / "latest").exists()


def test_a_resumed_run_says_where_it_resumed(stopped_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    capsys.readouterr()
    assert resume(run) == 0
    out = capsys.readouterr().out
    assert f"speedrun: resumed from step 2 ({run / 'checkpoints' / 'step_000002'})" in out


def test_every_logged_step_has_its_learning_rate_and_gradient_norm(tmp_path, capsys):
    run = tmp_path / "run"
    assert train(run, steps=4) == 0
    steps = [r for r in records(run) if "train_loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        assert r["grad_norm"] > 0 and 0 < r["lr_mult"] <= 1
        assert r["lr"]["muon"] == pytest.approx(0.05 * r["lr_mult"])
    assert steps[-1]["lr_mult"] < steps[0]["lr_mult"]  # the cool-down
    final = [ln for ln in capsys.readouterr().out.splitlines() if "final val_loss" in ln][0]
    val = json.loads((run / "summary.json").read_text())["final_val_loss"]
    assert f"final val_loss {val:.4f}, training time" in final


def test_the_progress_bar_shows_loss_and_speed_and_ends_before_an_error(tmp_path, capsys):
    args = [a for a in TINY if a != "--no-progress"]
    code = main(["train", "--steps", "6", "--out", str(tmp_path / "run"), *args,
                 "--set", "train.inject_fault=oom@4"])
    err = capsys.readouterr().err
    assert code == 4
    assert "loss=" in err and "tok/s=" in err
    assert "\nspeedrun: error: " in err  # on a line of its own, not glued to the bar


def test_the_bytecode_note_shows_once_per_machine(tmp_path, monkeypatch):
    from speedrun.compile.startup import first_time_on_machine

    monkeypatch.setenv("SPEEDRUN_HOME", str(tmp_path))
    assert first_time_on_machine("bytecode") is True
    assert first_time_on_machine("bytecode") is False
    assert first_time_on_machine("other") is True
