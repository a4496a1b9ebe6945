"""`speedrun data ...` and `speedrun info` through the real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from speedrun.cli import main as cli
from speedrun.run.env import environment
from speedrun.data.shards import read_shard, write_shard


def _fails_cleanly(capsys, argv, *needles):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().rsplit("\r", 1)[-1]  # what a terminal shows after the bar clears
    assert err.count("\n") == 0 and err.startswith("speedrun: error: ") and "Traceback" not in err
    for n in needles:
        assert n in err
    return err


def test_tokenize_end_to_end(tmp_path, capsys):
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": f"Doc {i}: " + "words " * 50}) + "\n" for i in range(40)))
    rc = cli.main(["data", "tokenize", str(src), "--out", str(tmp_path / "out"), "--val-tokens", "200",
                   "--shard-tokens", "1_000", "--workers", "2", "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "40 documents" in out and "MB/s" in out
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names[0] == "fineweb_train_000000.bin" and names[-1] == "fineweb_val_000000.bin"
    assert read_shard(tmp_path / "out" / "fineweb_val_000000.bin")[0] == 50256
    assert cli.main(["data", "validate", *[str(tmp_path / "out" / n) for n in names]]) == 0
    assert capsys.readouterr().out.count(": ok,") == len(names)


@pytest.mark.parametrize("make,needles", [
    (lambda p: write_shard(p, [1, 2, 3]).write_bytes(b"\0" * 1030), ["bad.bin", "wrong magic"]),
    (lambda p: p.write_bytes(write_shard(p, [1, 2, 3]).read_bytes()[:-2]), ["bad.bin", "shorter than"]),
    (lambda p: write_shard(p, [1, 60000]), ["bad.bin", "token id 60000", "outside the vocabulary"]),
    (lambda p: None, ["bad.bin", "not found"]),
])
def test_validate_bad_shards(tmp_path, capsys, make, needles):
    make(tmp_path / "bad.bin")
    assert cli.main(["data", "validate", str(tmp_path / "bad.bin")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in "".join(lines)  # the fault, then the summary
    assert all(n in lines[0] for n in needles) and "1 of 1 shard(s) failed" in lines[1]


def test_validate_a_folder_checks_every_shard_in_it(tmp_path, capsys):
    write_shard(tmp_path / "a_000000.bin", [1, 2, 3])
    write_shard(tmp_path / "b_000001.bin", [4, 5])
    (tmp_path / "notes.txt").write_text("not a shard")
    assert cli.main(["data", "validate", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{tmp_path / 'a_000000.bin'}: ok, 3 tokens", f"{tmp_path / 'b_000001.bin'}: ok, 2 tokens"]
    write_shard(tmp_path / "c_000002.bin", [60000])
    assert cli.main(["data", "validate", str(tmp_path)]) == 2
    assert "1 of 3 shard(s) failed validation" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    _fails_cleanly(capsys, ["data", "validate", str(tmp_path / "empty")], "empty: folder holds no shard files (*.bin)")


def test_tokenize_bad_inputs(tmp_path, capsys):
    _fails_cleanly(capsys, ["data", "tokenize", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")],
                   "none.jsonl", "not found")
    (tmp_path / "x.jsonl").write_text("{oops\n")
    _fails_cleanly(capsys, ["data", "tokenize", str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "o")],
                   "x.jsonl:1", "not valid JSON")
    (tmp_path / "y.jsonl").write_text('{"text": "tiny"}\n')
    _fails_cleanly(capsys, ["data", "tokenize", str(tmp_path / "y.jsonl"), "--out", str(tmp_path / "o"),
                            "--workers", "1", "--quiet"], "needed for the validation split")


def test_fineweb_offline_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _fails_cleanly(capsys, ["data", "fineweb", "--train-shards", "1", "--dir", str(tmp_path)],
                   "fineweb_val_000000.bin", "HF_HUB_OFFLINE", "speedrun data fineweb --variant 10B")


def test_help_and_usage_errors(capsys):
    for argv in (["data", "tokenize", "--help"], ["data", "fineweb", "--help"], ["data", "validate", "-h"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 0
        assert "usage: speedrun data" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(["data", "tokenize", "a.txt", "--out", "o", "--shard-tokens", "lots"])
    assert e.value.code == 2 and "'lots' is not a number" in capsys.readouterr().err
    assert cli.main(["data"]) == 2


def test_info(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SPEEDRUN_DATA", str(tmp_path))
    write_shard(tmp_path / "10B" / "fineweb_val_000000.bin", [1])
    env = environment()
    json.dumps(env)
    assert env["torch"] and env["python"] == sys.version.split()[0]
    assert env["data"]["fineweb"]["10B"] == {"dir": str(tmp_path / "10B"), "present": True, "train_shards": 0}
    assert env["data"]["fineweb"]["100B"]["present"] is False
    assert len(env["data"]["demo"]["embedded_shards"]) == 2
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and str(tmp_path / "10B") in out and "present" in out
    assert cli.main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["torch"] == env["torch"]
    import speedrun.recipes.registry
    monkeypatch.setattr(speedrun.recipes.registry, "describe", lambda name: f"PRESET<{name}>")
    assert cli.main(["info", "--preset", "demo"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PRESET<demo>")


def test_subprocess_clean_error(tmp_path):
    bad = write_shard(tmp_path / "bad.bin", np.arange(10))
    bad.write_bytes(bad.read_bytes()[:-4])
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    res = subprocess.run([sys.executable, "-m", "speedrun", "data", "validate", str(bad)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert res.stderr.splitlines()[0].startswith(f"speedrun: error: {bad}: file is 1040 bytes, shorter than the 1044")
