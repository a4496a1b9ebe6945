"""Hostile input: each mistake ends as one line on stderr and a non-zero exit.

docs/reliability.md lists every case with the message it prints.
"""

import json

import pytest

from reliability_helpers import main, train
from speedrun import __version__
from speedrun.config import validate
from speedrun.errors import ConfigError
from speedrun.recipes.registry import get_preset


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


@pytest.mark.parametrize("args, needle", [
    (["--set", "train.step=5"], "did you mean 'train.steps'"),
    (["--set", "model.num_layer=2"], "did you mean 'model.num_layers'"),
    (["--set", "train.steps=many"], "'many' is not a valid int"),
    (["--set", "model.qk_norm=maybe"], "is not a valid bool"),
    (["--steps", "0"], "train.steps: must be > 0, got 0"),
    (["--steps", "-3"], "train.steps: must be > 0"),
    (["--set", "train.seq_len=100"], "train.seq_len: must be a positive multiple of attention.block_size=128"),
    (["--set", "train.on_fault=ignore"], "train.on_fault: must be stop or recover"),
    (["--set", "train.recover_lr_factor=2"], "train.recover_lr_factor: must be in (0, 1]"),
    (["--set", "train.inject_fault=boom@x"], "train.inject_fault: 'boom@x' is not KIND@BATCH"),
    (["--checkpoint-every", "often"], "--checkpoint-every often: expected a number of steps"),
    (["--preset", "recrod"], "did you mean 'record'"),
])
def test_bad_config_is_refused(tmp_path, capsys, args, needle):
    err = _one_line_error(capsys, train(tmp_path / "run", *args))
    assert needle in err


def test_world_size_the_preset_cannot_divide():
    with pytest.raises(ConfigError, match=r"world size 3: preset 'record_2025_08' splits train.batch_seqs=8 .*\[1, 2, 4, 8\]"):
        validate(get_preset("record_2025_08"), world_size=3)


CHOICES = [  # every option with a fixed set of values, and that set as validate() spells it
    ("model.activation", "relu2 or gelu"), ("model.positions", "rotary or learned"),
    ("model.rotary", "half_truncated or full"), ("model.norm", "rms or layer"),
    ("model.softcap_form", "sigmoid or tanh"), ("train.dtype", "auto, bfloat16 or float32"),
    ("attention.window", "none, fixed or growing"), ("attention.backend", "auto, flex, dense or gluon"),
    ("optim.kind", "muon or adamw"), ("train.compile", "auto, on or off"),
    ("train.kernels", "auto or reference"), ("train.on_fault", "stop or recover"),
]


@pytest.mark.parametrize("option, allowed", CHOICES)
def test_every_choice_refuses_a_value_outside_it(option, allowed):
    cfg = get_preset("record_2025_08")
    section, field = option.split(".")
    setattr(getattr(cfg, section), field, "bogus")
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert str(err.value) == f"{option}: must be {allowed}, got 'bogus'"


def test_finished_run_is_not_overwritten(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    err = _one_line_error(capsys, train(run, steps=1))
    assert "already holds a finished run" in err and "--overwrite" in err
    assert train(run, "--overwrite", steps=1) == 0


def test_resume_from_another_preset(stopped_run, capsys):
    err = _one_line_error(capsys, main(["train", "--resume", str(stopped_run), "--preset", "record_2025_08"]))
    assert "checkpoint is preset 'demo_2025_08', command line asks 'record_2025_08'" in err
    assert "model.num_layers: checkpoint 2, now 12" in err


def test_resume_with_a_changed_field(stopped_run, capsys):
    err = _one_line_error(capsys, main(["train", "--resume", str(stopped_run), "--set", "model.model_dim=64"]))
    assert "changes the run: model.model_dim: checkpoint 32, now 64" in err


def test_resume_from_another_version(stopped_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "old"
    shutil.copytree(stopped_run, run)
    latest = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    meta = json.loads((latest / "trainer.json").read_text())
    meta["speedrun_version"] = "0.0.1"
    (latest / "trainer.json").write_text(json.dumps(meta))
    err = _one_line_error(capsys, main(["train", "--resume", str(run)]))
    assert f"written by speedrun 0.0.1 (format 1), this is speedrun {__version__}" in err


def _older_checkpoint(stopped_run, tmp_path, drop: list[str], edit=None):
    """A copy of the stopped run whose latest checkpoint's config.json lacks the fields in `drop`, as
    earlier code (the same speedrun version) would have written it, with its hash to match; `edit` then
    changes the file without the hash."""
    import shutil

    from speedrun.run import checkpoint as ck

    run = tmp_path / "older"
    shutil.copytree(stopped_run, run)
    latest = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    written = json.loads((latest / "config.json").read_text())
    for path in drop:
        section, name = path.split(".")
        del written[section][name]
    meta = json.loads((latest / "trainer.json").read_text())
    meta["config_hash"] = ck.config_hash(written)
    (latest / "trainer.json").write_text(json.dumps(meta))
    if edit:
        edit(written)
    (latest / "config.json").write_text(json.dumps(written))
    return run


def test_resume_of_a_checkpoint_without_speed_only_fields(stopped_run, tmp_path, capsys):
    """Fields added since the checkpoint that only change how the step runs take their defaults."""
    run = _older_checkpoint(stopped_run, tmp_path, ["train.kernels", "train.dynamo_cache"])
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert json.loads((run / "summary.json").read_text())["final_val_loss"] > 0
    assert "other speedrun sources" not in capsys.readouterr().out  # the same sources wrote the checkpoint


def test_resume_by_other_sources_says_so_and_keeps_the_first_env(stopped_run, tmp_path, capsys):
    """The checkpoint names the sources that wrote it: a resume by other code prints a note and logs both;
    the first process's env.json stays, the resumed one's goes beside it."""
    from speedrun.compile.cache import source_hash
    from speedrun.run.rundir import read_metrics

    run = _older_checkpoint(stopped_run, tmp_path, [])
    latest = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    meta = json.loads((latest / "trainer.json").read_text())
    assert meta["source_sha256"] == source_hash()
    meta["source_sha256"] = "0" * 64
    (latest / "trainer.json").write_text(json.dumps(meta))
    first_env = (run / "env.json").read_text()
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert f"written by other speedrun sources (sha256 000000000000, these are {source_hash()[:12]})" in \
        capsys.readouterr().out
    assert (run / "env.json").read_text() == first_env
    assert json.loads((run / "env.resume-1.json").read_text())["source_sha256"] == source_hash()
    event = [r for r in read_metrics(run) if r.get("event") == "resume"][-1]
    assert (event["checkpoint_source_sha256"], event["source_sha256"]) == ("0" * 64, source_hash())


def test_resume_of_a_checkpoint_without_a_field_of_the_math(stopped_run, tmp_path, capsys):
    run = _older_checkpoint(stopped_run, tmp_path, ["model.logit_softcap", "train.kernels"])
    err = _one_line_error(capsys, main(["train", "--resume", str(run)]))
    assert "the checkpoint's config has no model.logit_softcap: it was written by earlier speedrun code" in err


def test_resume_of_an_edited_config(stopped_run, tmp_path, capsys):
    run = _older_checkpoint(stopped_run, tmp_path, [], edit=lambda d: d["model"].update(logit_softcap=15.0))
    err = _one_line_error(capsys, main(["train", "--resume", str(run)]))
    assert "config.json does not match the checkpoint (edited?)" in err


def test_resume_without_checkpoint(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    err = _one_line_error(capsys, main(["train", "--resume", str(tmp_path / "empty")]))
    assert "no checkpoint in" in err


def test_resume_into_another_out(stopped_run, tmp_path, capsys):
    err = _one_line_error(capsys, main(["train", "--resume", str(stopped_run), "--out", str(tmp_path / "x")]))
    assert "--resume continues in" in err


def test_cuda_out_of_memory_names_the_settings(tmp_path, capsys):
    err = _one_line_error(capsys, train(tmp_path / "run", "--set", "train.seq_len=256",
                                        "--set", "train.inject_fault=oom@1", steps=3), expected_code=4)
    assert "CUDA out of memory during training" in err
    assert "--set train.seq_len=128 (tokens per micro-step, now 256)" in err and "nproc_per_node=2" in err


def test_out_of_memory_in_validation_puts_val_seq_len_first():
    from speedrun.run.faults import out_of_memory

    msg = str(out_of_memory(get_preset("record_2025_08"), 8, "validation"))
    assert msg.startswith("CUDA out of memory during validation (8 GPU(s)); lower memory with "
                          "--set train.val_seq_len=131072")
    assert "--set train.seq_len=24576" in msg and "nproc_per_node" not in msg


def test_tensorboard_missing_is_one_line(tmp_path, capsys, monkeypatch):
    import speedrun.tools.tensorboard_log as tb

    monkeypatch.delattr(tb, "TensorBoardWriter")  # as if the module were missing
    err = _one_line_error(capsys, train(tmp_path / "run", "--tensorboard", steps=1))
    assert err.startswith("speedrun: error: --tensorboard: not available")


def test_each_resumed_process_gets_its_own_env_file(tmp_path):
    from speedrun.train.loop import env_file_name

    assert env_file_name(tmp_path, resuming=False) == "env.json"
    assert env_file_name(tmp_path, resuming=True) == "env.json"  # the first process's file is missing
    (tmp_path / "env.json").write_text("{}")
    assert env_file_name(tmp_path, resuming=False) == "env.json"  # a fresh run (--overwrite) replaces it
    assert env_file_name(tmp_path, resuming=True) == "env.resume-1.json"
    (tmp_path / "env.resume-1.json").write_text("{}")
    assert env_file_name(tmp_path, resuming=True) == "env.resume-2.json"
