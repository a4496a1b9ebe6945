"""`speedrun compare`: is B faster than A, and by how much? An A/B of measured runs with its statistics.

An idea is tested by timing the default (A) and the change (B) several times, best in turns on one
machine, since clocks drift between cards and over minutes. Each input is one measurement: a JSON from
`speedrun bench --json`, or a finished run of `speedrun train` (its folder or its summary.json). One file
is one sample, so each process's own start-up and clock count in the spread; the bench's groups inside one
file are not independent samples and are not used as such.

For every figure both arms have (ms/step; energy, SM cycles and mean SM clock a step where the clocks were
sampled, the clock's mean or, in files from before the mean was kept, its median; peak allocated and
reserved memory, CUDA graphs' pools counting in reserved only; final validation loss for training runs)
it gives each arm's mean and standard
deviation, the difference B - A with its confidence interval, and a two-sided t-test's p-value:
Welch's test (unequal variances) by default, or with `--paired` the one-sample test of the differences
B_i - A_i, which removes the drift shared by the i-th pair when the arms ran in turns (A1 B1 A2 B2 ...).
Intervals use the t distribution with Welch-Satterthwaite's degrees of freedom (n - 1 paired). With fewer
than two samples in an arm (or two pairs) there is no spread, so no interval and no p-value.

Why energy and cycles: on a card held at its power cap the step time follows the energy a step, and a
change that saves cycles but spends energy is slower there (gpu_clocks.py). Reading both says which.
A bench file names its `--set` overrides; a run does not, so for runs the fields of their config.json
files that differ between the arms are listed instead. Bench results and training runs are never mixed: a bench times fixed steps on random tokens, a run its
whole schedule on real data, and their ms/step differ by some 2-3%.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from speedrun.errors import ConfigError, DataError

# (key, label, format, scale): the figures compared, in the order printed
METRICS = (
    ("ms_per_step", "ms/step", ".2f", 1.0),
    ("energy_j_per_step", "energy a step (J)", ".1f", 1.0),
    ("sm_mcycles_per_step", "SM cycles a step (M)", ".1f", 1.0),
    ("sm_clock_mhz", "SM clock (MHz)", ".0f", 1.0),
    ("peak_memory_bytes", "peak allocated (GiB)", ".2f", 1 / 2**30),
    ("peak_reserved_bytes", "peak reserved (GiB)", ".2f", 1 / 2**30),  # CUDA graphs' pools count here only
    ("final_val_loss", "final val loss", ".4f", 1.0),
)


def load(path: str) -> dict:
    """One measurement: {"path", "kind" ("bench" | "run"), "preset", "overrides", and METRICS' keys or None}."""
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json"
    if not p.is_file():
        raise DataError(f"{path}: not found (want a `speedrun bench --json` file, a run folder or its summary.json)")
    try:
        d = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{p}: not valid JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(d, dict) or not isinstance(d.get("ms_per_step"), (int, float)):
        raise DataError(f"{p}: no ms_per_step (not a bench result or a finished run's summary)")
    kind = "bench" if "ms_per_step_groups" in d else "run"
    clocks = d.get("gpu_clocks") or {}
    clock = clocks.get("sm_clock_mhz_mean", clocks.get("sm_clock_mhz_median"))
    out = {"path": str(p), "kind": kind, "preset": d.get("preset"), "overrides": d.get("overrides"),
           "sm_clock_mhz": clock, "config": _run_config(p) if kind == "run" else {}}
    for key, *_ in METRICS:
        if key != "sm_clock_mhz":
            value = d.get(key)
            out[key] = float(value) if isinstance(value, (int, float)) else None
    return out


def _run_config(summary: Path) -> dict:
    """A run's config.json beside its summary, flattened to {"section.field": value}; {} where missing."""
    try:
        d = json.loads((summary.parent / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return {f"{section}.{k}": v for section, fields in d.items() if isinstance(fields, dict)
            for k, v in fields.items()}


def config_differences(arm_a: list[dict], arm_b: list[dict]) -> list[str]:
    """The run config fields whose values differ between the arms, "field: A x, B y" (a value list where
    an arm's runs differ among themselves); [] for bench results, which name their overrides."""
    if not all(m.get("config") for m in arm_a + arm_b):
        return []
    keys = sorted(set().union(*(m["config"] for m in arm_a + arm_b)))
    out = []
    for k in keys:
        va = sorted({json.dumps(m["config"].get(k)) for m in arm_a})
        vb = sorted({json.dumps(m["config"].get(k)) for m in arm_b})
        if va != vb:
            out.append(f"{k}: A {' | '.join(va)}, B {' | '.join(vb)}")
    return out


def _mean_sd(xs: list[float]) -> tuple[float, float | None]:
    m = sum(xs) / len(xs)
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else None)


def welch(a: list[float], b: list[float], confidence: float) -> dict:
    """B - A for independent samples: difference, interval and two-sided p (None without spread)."""
    from scipy import stats

    (ma, sa), (mb, sb) = _mean_sd(a), _mean_sd(b)
    diff = mb - ma
    if sa is None or sb is None:
        return {"diff": diff, "ci": None, "p": None}
    va, vb = sa**2 / len(a), sb**2 / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return {"diff": diff, "ci": (diff, diff), "p": None}
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = stats.t.ppf((1 + confidence) / 2, df) * se
    p = 2 * stats.t.sf(abs(diff) / se, df)
    return {"diff": diff, "ci": (diff - half, diff + half), "p": float(p)}


def paired(a: list[float], b: list[float], confidence: float) -> dict:
    """B - A for pairs (A_i, B_i): the mean difference, its interval and two-sided p."""
    from scipy import stats

    d = [y - x for x, y in zip(a, b)]
    m, s = _mean_sd(d)
    if s is None:
        return {"diff": m, "ci": None, "p": None}
    se = s / math.sqrt(len(d))
    if se == 0:
        return {"diff": m, "ci": (m, m), "p": None}
    half = stats.t.ppf((1 + confidence) / 2, len(d) - 1) * se
    return {"diff": m, "ci": (m - half, m + half), "p": float(2 * stats.t.sf(abs(m) / se, len(d) - 1))}


def _check(arm_a: list[dict], arm_b: list[dict], is_paired: bool) -> None:
    kinds = {m["kind"] for m in arm_a + arm_b}
    if len(kinds) > 1:
        first = {k: next(m["path"] for m in arm_a + arm_b if m["kind"] == k) for k in kinds}
        raise ConfigError(f"{first['bench']} is a bench result and {first['run']} a training run: compare like "
                          "with like (their ms/step measure different things)")
    if is_paired and len(arm_a) != len(arm_b):
        raise ConfigError(f"--paired: A has {len(arm_a)} measurements and B {len(arm_b)}; pairs need equal numbers")


def compare(a_paths: list[str], b_paths: list[str], is_paired: bool = False, confidence: float = 0.95) -> dict:
    """Every metric both arms have, each arm's mean and sd, and B - A (`welch` or `paired`)."""
    if not 0 < confidence < 1:
        raise ConfigError(f"--confidence {confidence}: must be between 0 and 1")
    arm_a, arm_b = [load(p) for p in a_paths], [load(p) for p in b_paths]
    _check(arm_a, arm_b, is_paired)
    test = paired if is_paired else welch
    rows = []
    for key, label, spec, scale in METRICS:
        a = [m[key] * scale for m in arm_a if m[key] is not None]
        b = [m[key] * scale for m in arm_b if m[key] is not None]
        if len(a) != len(arm_a) or len(b) != len(arm_b):
            continue  # a figure some measurement lacks (no clocks sampled, no validation) is left out
        (ma, sa), (mb, sb) = _mean_sd(a), _mean_sd(b)
        rows.append({"metric": key, "label": label, "format": spec, "a_mean": ma, "a_sd": sa, "b_mean": mb,
                     "b_sd": sb, "relative": (mb - ma) / ma if ma else None, **test(a, b, confidence)})
    differs = config_differences(arm_a, arm_b)
    for m in arm_a + arm_b:
        m.pop("config", None)
    return {"kind": arm_a[0]["kind"], "paired": is_paired, "confidence": confidence,
            "a": arm_a, "b": arm_b, "config_differences": differs, "rows": rows}


def _arm_text(name: str, arm: list[dict]) -> str:
    presets = sorted({str(m["preset"]) for m in arm})
    if all(m["overrides"] is None for m in arm):  # runs: their configs are compared instead
        return f"{name}: {len(arm)} x {', '.join(presets)}"
    overrides = sorted({" ".join(m["overrides"] or []) or "(none)" for m in arm})
    return f"{name}: {len(arm)} x {', '.join(presets)}, overrides {' | '.join(overrides)}"


def to_markdown(r: dict) -> str:
    level = f"{100 * r['confidence']:g}%"
    test = "paired t-test" if r["paired"] else "Welch's t-test"
    differs = r.get("config_differences") or []
    lines = [_arm_text("A", r["a"]), _arm_text("B", r["b"]),
             *([f"config differs: {'; '.join(differs)}"] if differs else []), "",
             f"| {r['kind']} figure | A mean (sd) | B mean (sd) | B - A | {level} interval | B/A - 1 | p ({test}) |",
             "|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        f = lambda x: "-" if x is None else format(x, row["format"])  # noqa: E731
        few = "needs 2 or more pairs" if r["paired"] else "needs 2 or more in each arm"
        ci = few if row["ci"] is None else f"{f(row['ci'][0])} to {f(row['ci'][1])}"
        rel = "-" if row["relative"] is None else f"{100 * row['relative']:+.2f}%"
        p = "-" if row["p"] is None else f"{row['p']:.3g}"
        lines.append(f"| {row['label']} | {f(row['a_mean'])} ({f(row['a_sd'])}) | {f(row['b_mean'])} "
                     f"({f(row['b_sd'])}) | {row['diff']:+{row['format']}} | {ci} | {rel} | {p} |")
    return "\n".join(lines)


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="A/B of bench results or runs: differences, intervals, p-values")
    p.add_argument("a", nargs="+", metavar="A", help="arm A: `speedrun bench --json` files, or run folders")
    p.add_argument("--vs", nargs="+", required=True, metavar="B", help="arm B, the same kind of measurement")
    p.add_argument("--paired", action="store_true", help="pair A_i with B_i (the arms ran in turns)")
    p.add_argument("--confidence", type=float, default=0.95, help="the intervals' level (default 0.95)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    p.set_defaults(func=cli_compare)


def cli_compare(args: argparse.Namespace) -> int:
    r = compare(args.a, args.vs, args.paired, args.confidence)
    print(json.dumps(r, indent=2) if args.json else to_markdown(r))
    return 0
