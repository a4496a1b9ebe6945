"""`speedrun stats`: the record rule's one-sided t-test and the runs-needed scan."""

import json

import numpy as np
import pytest
from scipy import stats as sps

from speedrun.cli.main import main
from speedrun.tools.stats import p_value, runs_needed, summarise, to_markdown


def fake_run(folder, loss, ms):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"final_val_loss": loss, "train_time_ms": ms, "steps": 10}))
    return str(folder)


def test_p_value_matches_textbook_t():
    losses = np.array([3.276, 3.279, 3.281, 3.274, 3.277])
    t = (losses.mean() - 3.28) / (losses.std(ddof=1) / np.sqrt(5))
    assert p_value(losses, 3.28) == pytest.approx(sps.t.cdf(t, df=4))
    assert p_value(losses, 3.28) < 0.05 < p_value(losses + 0.004, 3.28)
    assert p_value(np.array([3.2]), 3.28) is None


def test_runs_needed_is_the_smallest_n():
    mean, std = 3.278, 0.003
    n = runs_needed(mean, std, 3.28, 0.01)
    p_at = lambda k: sps.t.cdf((mean - 3.28) / (std / np.sqrt(k)), df=k - 1)  # noqa: E731
    assert p_at(n) <= 0.01 < p_at(n - 1)
    assert runs_needed(3.281, std, 3.28, 0.01) is None
    assert runs_needed(3.27, 0.0, 3.28, 0.01) == 2


def test_summary_and_markdown(tmp_path):
    runs = [fake_run(tmp_path / f"r{i}", v, 150_000 + 1000 * i) for i, v in enumerate([3.276, 3.279, 3.281])]
    s = summarise(runs, 3.28, 0.01)
    assert s["n"] == 3 and s["val_loss_mean"] == pytest.approx(3.278667, abs=1e-6)
    assert s["train_time_s_mean"] == pytest.approx(151.0)
    assert s["val_loss_std"] == pytest.approx(np.std([3.276, 3.279, 3.281], ddof=1))
    md = to_markdown(s)
    assert "| n | 3 |" in md and "one-sided" in md and f"| {s['runs_needed']} |" in md


def test_single_run_p_is_undefined(tmp_path, capsys):
    assert main(["stats", fake_run(tmp_path / "a", 3.27, 1000.0)]) == 0
    out = capsys.readouterr().out
    assert "undefined" in out and "p-value" in out


def test_json_output(tmp_path, capsys):
    runs = [fake_run(tmp_path / f"r{i}", v, 1000.0) for i, v in enumerate([3.5, 3.6])]
    assert main(["stats", *runs, "--json", "--target", "3.7"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["n"] == 2 and s["target"] == 3.7 and 0 < s["p_value"] < 0.5


@pytest.mark.parametrize("case", ["missing_dir", "unfinished", "no_val"])
def test_errors_are_one_line(tmp_path, capsys, case):
    run = tmp_path / "run"
    if case == "unfinished":
        run.mkdir()
        (run / "metrics.jsonl").write_text("")
    if case == "no_val":
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({"final_val_loss": None, "train_time_ms": 1.0}))
    assert main(["stats", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(run) in err
