"""`speedrun compare`: the A/B statistics against scipy's own tests, and the command on bench and run files."""

import json

import pytest
from scipy import stats

from speedrun.tools import compare
from speedrun.cli.main import main

A = [593.07, 593.87, 594.46, 594.08]
B = [595.89, 596.29, 597.77, 597.49]


def test_welch_is_scipys_unequal_variance_test():
    got = compare.welch(A, B, 0.95)
    want = stats.ttest_ind(B, A, equal_var=False)
    assert got["diff"] == pytest.approx(sum(B) / 4 - sum(A) / 4)
    assert got["p"] == pytest.approx(want.pvalue, rel=1e-9)
    assert got["ci"] == pytest.approx(tuple(want.confidence_interval(0.95)), rel=1e-9)
    wide = compare.welch(A, B, 0.99)["ci"]
    assert wide[0] < got["ci"][0] and wide[1] > got["ci"][1]


def test_paired_is_scipys_related_samples_test():
    got = compare.paired(A, B, 0.9)
    want = stats.ttest_rel(B, A)
    assert got["p"] == pytest.approx(want.pvalue, rel=1e-9)
    assert got["ci"] == pytest.approx(tuple(want.confidence_interval(0.9)), rel=1e-9)
    assert got["p"] < compare.welch(A, B, 0.9)["p"]  # the pairs share their drift: a sharper test here


def test_no_spread_gives_no_interval_or_p():
    assert compare.welch([1.0], [2.0, 3.0], 0.95) == {"diff": 1.5, "ci": None, "p": None}
    assert compare.welch([1.0, 1.0], [2.0, 2.0], 0.95) == {"diff": 1.0, "ci": (1.0, 1.0), "p": None}
    assert compare.paired([1.0], [3.0], 0.95) == {"diff": 2.0, "ci": None, "p": None}


def _bench(path, ms, energy=None, clock=1640.0, overrides=(), reserved=None):
    clocks = {"sm_clock_mhz_median": clock}
    if energy is not None:
        clocks["sm_clock_mhz_mean"] = clock
    d = {"preset": "proxy212", "overrides": list(overrides), "ms_per_step": ms, "ms_per_step_groups": [ms] * 3,
         "peak_memory_bytes": 27.13 * 2**30, "gpu_clocks": clocks, "energy_j_per_step": energy,
         "sm_mcycles_per_step": None if energy is None else clock * ms / 1e3, "peak_reserved_bytes": reserved}
    path.write_text(json.dumps(d))
    return str(path)


def test_command_on_bench_files(tmp_path, capsys):
    a = [_bench(tmp_path / f"a{i}.json", ms, 410.0 + i) for i, ms in enumerate(A)]
    b = [_bench(tmp_path / f"b{i}.json", ms, 412.0 + i, 1620.0, ["model.ce_kernel=torch"]) for i, ms in enumerate(B)]
    assert main(["compare", *a, "--vs", *b]) == 0
    out = capsys.readouterr().out
    assert "A: 4 x proxy212, overrides (none)" in out and "B: 4 x proxy212, overrides model.ce_kernel=torch" in out
    ms_row = next(line for line in out.splitlines() if line.startswith("| ms/step"))
    p = stats.ttest_ind(B, A, equal_var=False).pvalue
    assert "| +2.99 |" in ms_row and f"| {p:.3g} |" in ms_row and "+0.50%" in ms_row
    assert "| energy a step (J) | 411.5 (1.3) | 413.5 (1.3) | +2.0 |" in out
    assert "| SM clock (MHz) | 1640 (0) | 1620 (0) | -20 |" in out and "final val loss" not in out
    assert "peak reserved" not in out  # no file has it

    assert main(["compare", *a, "--vs", *b, "--paired", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["paired"] and r["kind"] == "bench" and [row["metric"] for row in r["rows"]][:3] == [
        "ms_per_step", "energy_j_per_step", "sm_mcycles_per_step"]
    assert r["rows"][0]["p"] == pytest.approx(stats.ttest_rel(B, A).pvalue)


def test_reserved_memory_is_compared_where_both_arms_have_it(tmp_path, capsys):
    """CUDA graphs' pools count in reserved memory only: the row that shows what graphs cost."""
    a = [_bench(tmp_path / f"a{i}.json", ms, reserved=29.9 * 2**30) for i, ms in enumerate(A)]
    b = [_bench(tmp_path / f"b{i}.json", ms, reserved=27.2 * 2**30) for i, ms in enumerate(B)]
    assert main(["compare", *a, "--vs", *b]) == 0
    assert "| peak reserved (GiB) | 29.90 (0.00) | 27.20 (0.00) | -2.70 |" in capsys.readouterr().out

def test_a_figure_one_file_lacks_is_left_out(tmp_path, capsys):
    a = [_bench(tmp_path / "a0.json", 593.0, 410.0), _bench(tmp_path / "a1.json", 594.0)]  # no energy: older file
    b = [_bench(tmp_path / "b0.json", 596.0, 412.0), _bench(tmp_path / "b1.json", 597.0, 413.0)]
    assert main(["compare", *a, "--vs", *b]) == 0
    out = capsys.readouterr().out
    assert "| ms/step |" in out and "energy" not in out and "SM cycles" not in out


def test_command_on_run_folders(tmp_path, capsys):
    runs = []
    for name, ms, loss in (("a", 578.47, 3.9170), ("b", 578.85, 3.9179)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(
            {"preset": "proxy212", "ms_per_step": ms, "final_val_loss": loss, "peak_memory_bytes": 2**34,
             "gpu_clocks": None, "energy_j_per_step": None, "sm_mcycles_per_step": None}))
        runs.append(str(tmp_path / name))
    assert main(["compare", runs[0], "--vs", str(tmp_path / "b" / "summary.json")]) == 0
    out = capsys.readouterr().out
    assert "| run figure |" in out and "| final val loss | 3.9170 (-) | 3.9179 (-) | +0.0009 |" in out
    assert "needs 2 or more in each arm" in out and "| peak allocated (GiB) | 16.00 (-)" in out
    assert "A: 1 x proxy212\n" in out and "config differs" not in out  # no config.json beside them


def test_runs_name_the_config_fields_their_arms_differ_in(tmp_path, capsys):
    """Runs record no overrides: their config.json files say what differs between the arms."""
    from speedrun.recipes.presets import proxy212

    runs = {}
    for name, ms, bos, seed in (("a0", 588.4, False, 0), ("a1", 589.0, False, 1), ("b0", 587.2, True, 0),
                                ("b1", 589.9, True, 0)):
        cfg = proxy212()
        cfg.train.bos_align, cfg.train.seed = bos, seed
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg.to_dict()))
        (tmp_path / name / "summary.json").write_text(json.dumps(
            {"preset": "proxy212", "ms_per_step": ms, "final_val_loss": 3.9175, "peak_memory_bytes": 2**34}))
        runs[name] = str(tmp_path / name)
    assert main(["compare", runs["a0"], runs["a1"], "--vs", runs["b0"], runs["b1"], "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["config_differences"] == ["train.bos_align: A false, B true", "train.seed: A 0 | 1, B 0"]
    assert all("config" not in m for m in r["a"] + r["b"])
    assert main(["compare", runs["a0"], "--vs", runs["b0"]]) == 0
    assert "config differs: train.bos_align: A false, B true\n" in capsys.readouterr().out


@pytest.mark.parametrize("case, message", [
    ("mixed", "is a bench result and"),
    ("missing", "nope.json: not found"),
    ("not-json", "bad.json: not valid JSON"),
    ("no-ms", "other.json: no ms_per_step"),
    ("pairs", "--paired: A has 2 measurements and B 1"),
    ("level", "--confidence 1.5: must be between 0 and 1"),
])
def test_bad_input_is_one_line(tmp_path, capsys, case, message):
    a = [_bench(tmp_path / "a0.json", 593.0), _bench(tmp_path / "a1.json", 594.0)]
    b = [_bench(tmp_path / "b0.json", 596.0)]
    extra = []
    if case == "mixed":
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "summary.json").write_text(json.dumps({"ms_per_step": 580.0}))
        b = [str(tmp_path / "run")]
    elif case == "missing":
        b = [str(tmp_path / "nope.json")]
    elif case == "not-json":
        (tmp_path / "bad.json").write_text("{")
        b = [str(tmp_path / "bad.json")]
    elif case == "no-ms":
        (tmp_path / "other.json").write_text(json.dumps({"steps": 3}))
        b = [str(tmp_path / "other.json")]
    elif case == "pairs":
        extra = ["--paired"]
    elif case == "level":
        extra = ["--confidence", "1.5"]
    assert main(["compare", *a, "--vs", *b, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("speedrun: error: ") and message in err and "\n" not in err
