"""`speedrun plot`: validation loss against training time and against tokens.

Two panels because the speedrun's question (loss per second) and the
modelling question (loss per token) have different answers: a change that
costs time but saves tokens shows up as a shift in one panel only. Runs are
read from metrics.jsonl (the source of truth; an unfinished run still plots).
Reference curves come from a CSV with the header
`step,val_loss,train_time_ms[,tokens][,label]` (one curve per label; rows
without tokens appear in the time panel only), e.g. docs/reference-proxy212.csv.
The Agg backend is chosen inside `plot_runs`, not at import, so importing this
module never changes the backend of a caller's interactive session. The
y-axis ignores the step-0 loss (~10.8, the same for every run) so that the
part where runs differ fills the panel. `--out` is checked before any run is
read: its suffix names a format matplotlib writes (none: .png, as matplotlib
itself would add) and its place takes a new file.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from speedrun.errors import ConfigError, DataError

REQUIRED = ("step", "val_loss", "train_time_ms")


def run_curve(run: Path) -> dict:
    """{label, step, val_loss, time_ms, tokens} lists from one run's metrics.jsonl."""
    from speedrun.run.rundir import read_metrics

    run = Path(run)
    if not run.is_dir():
        raise DataError(f"{run}: run folder not found")
    rows = [r for r in read_metrics(run) if "val_loss" in r]
    if not rows:
        raise DataError(f"{run / 'metrics.jsonl'}: no validation records (val_loss lines) to plot")
    return {"label": run.name or str(run), "step": [r["step"] for r in rows],
            "val_loss": [r["val_loss"] for r in rows], "time_ms": [r["train_time_ms"] for r in rows],
            "tokens": [r.get("tokens") for r in rows]}


def _number(path: Path, line: int, col: str, text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise DataError(f"{path}:{line}: column {col} is {text!r}, not a number") from None


def read_reference(path: Path) -> list[dict]:
    """Curves from a reference CSV, one per label (in order of appearance)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: reference CSV not found")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"{path}: header lacks {', '.join(missing)} (need step,val_loss,train_time_ms[,tokens][,label])")
        curves: dict[str, dict] = {}
        for line, row in enumerate(reader, 2):
            label = (row.get("label") or "").strip() or f"reference ({path.stem})"
            c = curves.setdefault(label, {"label": label, "step": [], "val_loss": [], "time_ms": [], "tokens": []})
            c["step"].append(_number(path, line, "step", row["step"]))
            c["val_loss"].append(_number(path, line, "val_loss", row["val_loss"]))
            c["time_ms"].append(_number(path, line, "train_time_ms", row["train_time_ms"]))
            tok = (row.get("tokens") or "").strip()
            c["tokens"].append(_number(path, line, "tokens", tok) if tok else None)
    if not curves:
        raise DataError(f"{path}: no data rows")
    return list(curves.values())


def _time_axis(curves: list[dict]) -> tuple[float, str]:
    longest = max(max(c["time_ms"]) for c in curves)
    return (60_000.0, "training time (minutes)") if longest > 180_000 else (1000.0, "training time (seconds)")


def _token_axis(curves: list[dict]) -> tuple[float, str]:
    longest = max((t for c in curves for t in c["tokens"] if t is not None), default=0)
    if longest >= 1e9:
        return 1e9, "tokens (billions)"
    return (1e6, "tokens (millions)") if longest >= 1e6 else (1e3, "tokens (thousands)")


def _y_limits(curves: list[dict]) -> tuple[float, float]:
    later = [v for c in curves for s, v in zip(c["step"], c["val_loss"]) if s > 0] or \
            [v for c in curves for v in c["val_loss"]]
    lo, hi = min(later), max(later)
    pad = 0.05 * (hi - lo) + 0.02
    return lo - pad, hi + pad


def _draw(ax, c: dict, x_key: str, scale: float, ref: int | None) -> None:
    pts = [(x / scale, y) for x, y in zip(c[x_key], c["val_loss"]) if x is not None]
    if not pts:
        return
    xs, ys = zip(*pts)
    style = dict(linestyle="--", color=("0.2", "0.55")[ref % 2], marker="s", markersize=3, linewidth=1.2) \
        if ref is not None else \
        dict(marker="o", markersize=3, linewidth=1.6)
    ax.plot(xs, ys, label=f"{c['label']} (final {c['val_loss'][-1]:.3f})", **style)


def output_path(out: str | Path) -> Path:
    """The file `--out` names, with the .png matplotlib would add to a name without a suffix; one line
    if matplotlib cannot write that format or the file cannot be created there."""
    from matplotlib.backend_bases import FigureCanvasBase

    from speedrun.run.outpaths import check_file

    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out}: is a folder, not a file")
    if out.name and not out.suffix:
        out = out.with_name(out.name + ".png")
    formats = FigureCanvasBase.get_supported_filetypes()
    if out.name and out.suffix[1:].lower() not in formats:
        raise ConfigError(f"--out {out}: matplotlib cannot write {out.suffix} files; use one of "
                          f"{', '.join('.' + f for f in sorted(formats))}")
    return check_file(out, "--out")


def plot_runs(runs: list[str], out: Path, references: list[dict] | None = None, target: float | None = None) -> Path:
    """Write the two-panel PNG and return its path."""
    import matplotlib

    out = output_path(out)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [run_curve(Path(r)) for r in runs]
    refs = references or []
    everything = curves + refs
    (t_scale, t_label), (k_scale, k_label) = _time_axis(everything), _token_axis(everything)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True, constrained_layout=True)
    for ax, key, scale, xlabel in ((axes[0], "time_ms", t_scale, t_label), (axes[1], "tokens", k_scale, k_label)):
        for c in curves:
            _draw(ax, c, key, scale, ref=None)
        for i, c in enumerate(refs):
            _draw(ax, c, key, scale, ref=i)
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        ax.set_xlim(left=0)
    lo, hi = _y_limits(everything)
    axes[0].set_ylim(lo, hi)
    for ax in axes:
        if target is not None and lo < target < hi:
            ax.axhline(target, color="crimson", linestyle=":", linewidth=1, label=f"target {target}")
    axes[0].set_ylabel("validation loss (nats per token)")
    axes[0].set_title("Validation loss vs training time")
    axes[1].set_title("Validation loss vs tokens seen")
    axes[1].legend(loc="upper right", fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser("plot", help="PNG of val loss vs training time and vs tokens")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (metrics.jsonl)")
    p.add_argument("--reference", action="append", default=[], metavar="CSV",
                   help="reference curves: CSV with step,val_loss,train_time_ms[,tokens][,label] (repeatable)")
    p.add_argument("--out", default="val_loss.png", help="PNG to write (default val_loss.png)")
    p.add_argument("--target", type=float, default=3.28, help="dotted target line when in range (default 3.28)")
    p.set_defaults(func=cli_plot)


def cli_plot(args: argparse.Namespace) -> int:
    refs = [c for path in args.reference for c in read_reference(Path(path))]
    out = plot_runs(args.runs, Path(args.out), refs, args.target)
    print(f"wrote {out}")
    return 0
