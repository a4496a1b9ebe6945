"""`speedrun stats`: is a set of runs a record under the speedrun's rules?

The rules accept a record when the runs' final validation losses show, with a
one-sided t-test, that the mean loss is below the target (3.28): H0 mean >= target
against H1 mean < target, `scipy.stats.ttest_1samp(..., alternative="less")`.
One run has no standard deviation, so its p-value is undefined rather than 0
or 1. "Runs needed" answers the practical question (how many more runs to
launch): with the observed mean and standard deviation held fixed, the
smallest n whose t statistic reaches the asked p, found by scanning n with
scipy's t distribution. Only finished runs (summary.json) count.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from speedrun.errors import DataError

MAX_RUNS_SCANNED = 100_000


def read_result(run: Path) -> dict:
    """Final val loss and training time of one finished run folder."""
    run = Path(run)
    if not run.is_dir():
        raise DataError(f"{run}: run folder not found")
    path = run / "summary.json"
    if not path.exists():
        raise DataError(f"{path}: missing (the run did not finish; only finished runs count)")
    try:
        s = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e.msg})") from None
    if s.get("final_val_loss") is None:
        raise DataError(f"{path}: no final_val_loss (the run had train.val_tokens=0)")
    return {"run": str(run), "val_loss": float(s["final_val_loss"]), "train_time_ms": float(s["train_time_ms"])}


def p_value(losses: np.ndarray, target: float) -> float | None:
    """One-sided p of H0 mean >= target; None when undefined (n < 2)."""
    from scipy import stats

    if len(losses) < 2:
        return None
    if np.std(losses) == 0:  # scipy gives nan here; the limit is 0 or 1
        return 0.0 if losses[0] < target else 1.0
    return float(stats.ttest_1samp(losses, target, alternative="less").pvalue)


def runs_needed(mean: float, std: float, target: float, p: float) -> int | None:
    """Smallest n >= 2 with one-sided p <= `p` at this mean and std; None if never."""
    from scipy import stats

    if mean >= target:
        return None
    if std == 0:
        return 2
    n = np.arange(2, MAX_RUNS_SCANNED + 1)
    t = (mean - target) / (std / np.sqrt(n))
    ok = np.nonzero(stats.t.cdf(t, df=n - 1) <= p)[0]
    return int(n[ok[0]]) if ok.size else None


def summarise(runs: list[str], target: float, p: float) -> dict:
    results = [read_result(Path(r)) for r in runs]
    losses = np.array([r["val_loss"] for r in results])
    times = np.array([r["train_time_ms"] for r in results]) / 1000
    n = len(results)
    std = float(np.std(losses, ddof=1)) if n > 1 else None
    return {
        "n": n, "target": target, "p_asked": p, "runs": results,
        "val_loss_mean": float(losses.mean()), "val_loss_std": std,
        "train_time_s_mean": float(times.mean()), "train_time_s_std": float(np.std(times, ddof=1)) if n > 1 else None,
        "p_value": p_value(losses, target),
        "runs_needed": runs_needed(float(losses.mean()), std, target, p) if std is not None else None,
    }


def _fmt(x: float | None, spec: str) -> str:
    return "undefined (n = 1)" if x is None else format(x, spec)


def _needed_text(s: dict) -> str:
    if s["val_loss_std"] is None:
        return "undefined (needs >= 2 runs for a standard deviation)"
    if s["runs_needed"] is None:
        if s["val_loss_mean"] >= s["target"]:
            return "never (mean is not below the target)"
        return f"more than {MAX_RUNS_SCANNED:,}"
    return str(s["runs_needed"])


def to_markdown(s: dict) -> str:
    lines = ["| run | final val loss | training time (s) |", "|---|---|---|"]
    lines += [f"| {r['run']} | {r['val_loss']:.4f} | {r['train_time_ms'] / 1000:.1f} |" for r in s["runs"]]
    p = s["p_value"]
    verdict = "" if p is None else (" (below the target)" if p <= s["p_asked"] else " (not significant)")
    lines += ["", "| statistic | value |", "|---|---|", f"| n | {s['n']} |",
              f"| val loss mean | {s['val_loss_mean']:.4f} |",
              f"| val loss std | {_fmt(s['val_loss_std'], '.4f')} |",
              f"| training time mean (s) | {s['train_time_s_mean']:.1f} |",
              f"| training time std (s) | {_fmt(s['train_time_s_std'], '.1f')} |",
              f"| p-value, H1: mean < {s['target']} (one-sided t-test) | {_fmt(p, '.3g')}{verdict} |",
              f"| runs needed for p <= {s['p_asked']} at this mean and std | {_needed_text(s)} |"]
    return "\n".join(lines)


def register(subparsers) -> None:
    p = subparsers.add_parser("stats", help="mean, std and record p-value of several finished runs")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="finished run folders (with summary.json)")
    p.add_argument("--target", type=float, default=3.28, help="val loss to beat (default 3.28)")
    p.add_argument("--p", type=float, default=0.01, help="significance for 'runs needed' (default 0.01)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    p.set_defaults(func=cli_stats)


def cli_stats(args: argparse.Namespace) -> int:
    from speedrun.errors import ConfigError

    if not 0 < args.p < 1 or not math.isfinite(args.target):
        raise ConfigError(f"--p {args.p} / --target {args.target}: p must be in (0, 1) and target finite")
    s = summarise(args.runs, args.target, args.p)
    print(json.dumps(s, indent=2) if args.json else to_markdown(s))
    return 0
