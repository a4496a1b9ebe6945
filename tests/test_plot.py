"""`speedrun plot`: a PNG from run folders and reference CSVs; bad input is a one-line error."""

import json

import matplotlib
import pytest

from speedrun.cli.main import main
from speedrun.tools.plot import read_reference, run_curve

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_run(folder, final):
    folder.mkdir(parents=True)
    lines = [{"step": s, "val_loss": 10.8 - (10.8 - final) * s / 20, "train_time_ms": 500.0 * s,
              "tokens": 2048 * s} for s in (0, 10, 20)]
    lines.insert(1, {"step": 1, "train_loss": 10.0, "train_time_ms": 50.0, "tokens": 2048})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return str(folder)


def test_run_curve_keeps_validation_lines_only(tmp_path):
    fake_run(tmp_path / "a", 6.0)
    c = run_curve(tmp_path / "a")
    assert c["step"] == [0, 10, 20] and c["val_loss"][-1] == pytest.approx(6.0) and c["label"] == "a"


def test_reference_csv_labels_and_optional_tokens(tmp_path):
    csv = tmp_path / "ref.csv"
    csv.write_text("step,val_loss,train_time_ms,label\n0,10.8,0,A\n10,5,100,A\n0,10.8,0,B\n")
    curves = read_reference(csv)
    assert [c["label"] for c in curves] == ["A", "B"] and curves[0]["tokens"] == [None, None]


def test_shipped_reference_csv_reads():
    from pathlib import Path

    curves = read_reference(Path(__file__).parent.parent / "docs" / "reference-proxy212.csv")
    assert len(curves) == 2 and curves[0]["val_loss"][-1] == pytest.approx(3.9274)


def test_plot_writes_png_without_touching_backend_at_import(tmp_path, capsys):
    backend = matplotlib.get_backend()
    import speedrun.tools.plot  # noqa: F401

    assert matplotlib.get_backend() == backend
    csv = tmp_path / "ref.csv"
    csv.write_text("step,val_loss,train_time_ms,tokens,label\n0,10.8,0,0,ref\n20,5.5,9000,40960,ref\n")
    out = tmp_path / "plots" / "loss.png"
    runs = [fake_run(tmp_path / "a", 6.0), fake_run(tmp_path / "b", 6.2)]
    assert main(["plot", *runs, "--reference", str(csv), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 20_000
    assert str(out) in capsys.readouterr().out


@pytest.mark.parametrize("content, needle", [
    ("step,val_loss\n0,1\n", "train_time_ms"),
    ("step,val_loss,train_time_ms\n0,abc,1\n", "ref.csv:2"),
    ("step,val_loss,train_time_ms\n", "no data rows"),
])
def test_bad_csv_is_one_line_error(tmp_path, capsys, content, needle):
    (tmp_path / "ref.csv").write_text(content)
    run = fake_run(tmp_path / "a", 6.0)
    assert main(["plot", run, "--reference", str(tmp_path / "ref.csv"), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err and not (tmp_path / "x.png").exists()


def test_missing_run_and_run_without_validation(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "nope"), "--out", str(tmp_path / "x.png")]) == 2
    assert "nope" in capsys.readouterr().err
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "metrics.jsonl").write_text('{"step": 1, "train_loss": 3.0}\n')
    assert main(["plot", str(tmp_path / "t"), "--out", str(tmp_path / "x.png")]) == 2
    assert "no validation records" in capsys.readouterr().err
