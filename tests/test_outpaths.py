"""Output paths are checked before the work: one line naming the option, the path and the reason."""

from __future__ import annotations

import os

import pytest

from speedrun.bench import step as bench
from speedrun.cli.main import main
from speedrun.errors import ConfigError
from speedrun.run.outpaths import check_file, check_folder

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0  # permission bits do not stop root


@pytest.fixture
def blocker(tmp_path):
    """A regular file: no path below it can be created, whoever asks."""
    f = tmp_path / "file.txt"
    f.write_text("x")
    return f


def _one_line(capsys, code, *needles):
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("speedrun: error: ") and "\n" not in err and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


# ---------------------------------------------------------------- the checks


def test_a_path_below_a_file_cannot_be_created(blocker):
    with pytest.raises(ConfigError, match=rf"^--out {blocker}/sub: cannot create \({blocker} is not a folder\)$"):
        check_folder(blocker / "sub", "--out")
    with pytest.raises(ConfigError, match=rf"^--json {blocker}/a/b.json: cannot create \({blocker} is not a folder\)$"):
        check_file(blocker / "a" / "b.json", "--json")


def test_wrong_kind_and_invalid_names(tmp_path, blocker):
    with pytest.raises(ConfigError, match=r"--out .*file.txt: exists and is not a folder"):
        check_folder(blocker, "--out")
    with pytest.raises(ConfigError, match=r"--json .*: is a folder, not a file"):
        check_file(tmp_path, "--json")
    with pytest.raises(ConfigError, match=r"cannot create \(File name too long\)"):
        check_folder(tmp_path / ("x" * 300), "--out")
    with pytest.raises(ConfigError, match="NUL"):
        check_file(str(tmp_path / "a\0b"), "--json")
    with pytest.raises(ConfigError, match="--out: empty path"):
        check_folder("", "--out")


def test_checks_leave_nothing_behind(tmp_path, blocker):
    assert check_folder(tmp_path / "a" / "b", "--out") == tmp_path / "a" / "b"
    assert check_file(tmp_path / "c" / "d.json", "--json") == tmp_path / "c" / "d.json"
    assert check_file(blocker, "--json") == blocker  # an existing file may be replaced
    assert check_folder(tmp_path, "--out") == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"] and blocker.read_text() == "x"


@pytest.mark.skipif(ROOT, reason="root writes into read-only folders")
def test_a_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match=r"--out .*ro/new: cannot create \(Permission denied\)"):
            check_folder(ro / "new", "--out")
        with pytest.raises(ConfigError, match=r"--out .*ro: cannot write into it \(Permission denied\)"):
            check_folder(ro, "--out")
        with pytest.raises(ConfigError, match=r"--json .*ro/x.json: cannot create \(Permission denied\)"):
            check_file(ro / "x.json", "--json")
    finally:
        ro.chmod(0o700)


# ---------------------------------------------------------------- every command that writes


def test_plot_out(tmp_path, blocker, capsys):
    from test_plot import fake_run

    run = fake_run(tmp_path / "run", 6.0)
    _one_line(capsys, main(["plot", run, "--out", str(blocker / "loss.png")]),
              f"--out {blocker}/loss.png: cannot create", "is not a folder")
    _one_line(capsys, main(["plot", run, "--out", str(tmp_path)]), f"--out {tmp_path}: is a folder")
    _one_line(capsys, main(["plot", run, "--out", str(tmp_path / "loss.xyz")]),
              "loss.xyz: matplotlib cannot write .xyz files", ".png")


def test_plot_names_the_file_it_writes(tmp_path, capsys):
    from test_plot import fake_run

    run = fake_run(tmp_path / "run", 6.0)
    assert main(["plot", run, "--out", str(tmp_path / "loss")]) == 0  # matplotlib adds .png
    assert (tmp_path / "loss.png").is_file() and f"wrote {tmp_path / 'loss.png'}" in capsys.readouterr().out


def test_export_hf_out_before_loading_the_model(tmp_path, blocker, capsys):
    missing = str(tmp_path / "no-such-ckpt")  # the --out line comes first: nothing is loaded
    _one_line(capsys, main(["export", "hf", "--ckpt", missing, "--out", str(blocker / "hf")]),
              f"--out {blocker}/hf: cannot create ({blocker} is not a folder)")
    _one_line(capsys, main(["export", "hf", "--ckpt", missing, "--out", str(blocker)]),
              f"--out {blocker}: exists and is not a folder")


def test_data_tokenize_out(tmp_path, blocker, capsys):
    src = tmp_path / "a.txt"
    src.write_text("hello world\n")
    _one_line(capsys, main(["data", "tokenize", str(src), "--out", str(blocker / "shards"), "--quiet"]),
              f"--out {blocker}/shards: cannot create")
    _one_line(capsys, main(["data", "tokenize", str(src), "--out", str(blocker), "--quiet"]),
              f"--out {blocker}: exists and is not a folder")


def test_data_fineweb_dir(blocker, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _one_line(capsys, main(["data", "fineweb", "--train-shards", "0", "--dir", str(blocker / "fw")]),
              f"--dir {blocker}/fw: cannot create")


@pytest.mark.parametrize("option", ["--json", "--profile"])
def test_bench_outputs_are_checked_before_the_benchmark(tmp_path, blocker, capsys, monkeypatch, option):
    def no_bench(args):
        raise AssertionError("the benchmark ran before its output path was checked")

    monkeypatch.setattr(bench, "run_bench", no_bench)
    _one_line(capsys, main(["bench", option, str(blocker / "out.json")]), f"{option} {blocker}/out.json: cannot create")
    _one_line(capsys, main(["bench", option, str(tmp_path)]), f"{option} {tmp_path}: is a folder")
