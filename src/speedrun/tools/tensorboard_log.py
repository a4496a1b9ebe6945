"""TensorBoard mirror of metrics.jsonl, and `speedrun tensorboard RUN_DIR`.

metrics.jsonl stays the source of truth: TensorBoard is a viewer, optional,
and never read back. So the writer only mirrors records (each numeric field
but `step` becomes a scalar at that step: `train_loss`, `val_loss`,
`train_time_ms`, `tokens`), the same function converts a finished run after
the fact, and tensorboard is imported only when asked for (it is an extra:
`pip install tensorboard`), with a one-line error when it is missing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from speedrun.errors import ConfigError, DataError

SUBDIR = "tensorboard"


def _summary_writer():
    try:
        import tensorboard  # noqa: F401  (torch's writer needs the package)
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("--tensorboard: the tensorboard package is not installed; pip install tensorboard") from None
    return SummaryWriter


class TensorBoardWriter:
    """`log(record)` takes the dicts written to metrics.jsonl; files go to RUN_DIR/tensorboard."""

    def __init__(self, run_dir: Path):
        self.log_dir = Path(run_dir) / SUBDIR
        self._writer = _summary_writer()(log_dir=str(self.log_dir))

    def log(self, record: dict) -> None:
        step = record.get("step")
        if step is None:
            return
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(key, value, global_step=int(step))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def convert(run_dir: Path, overwrite: bool = False) -> tuple[Path, int]:
    """Write RUN_DIR/metrics.jsonl as TensorBoard events; (log dir, records)."""
    from speedrun.run.rundir import read_metrics

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: run folder not found")
    records = read_metrics(run_dir)
    old = sorted((run_dir / SUBDIR).glob("events.out.tfevents.*"))
    if old and not overwrite:
        raise ConfigError(f"{run_dir / SUBDIR}: already holds event files; pass --overwrite to replace them")
    with TensorBoardWriter(run_dir) as w:
        for path in old:
            path.unlink()
        for record in records:
            w.log(record)
    return w.log_dir, len(records)


def register(subparsers) -> None:
    p = subparsers.add_parser("tensorboard", help="convert a run's metrics.jsonl to TensorBoard event files")
    p.add_argument("run", metavar="RUN_DIR", help="run folder")
    p.add_argument("--overwrite", action="store_true", help="replace event files written before")
    p.set_defaults(func=cli_tensorboard)


def cli_tensorboard(args: argparse.Namespace) -> int:
    log_dir, n = convert(Path(args.run), args.overwrite)
    print(f"wrote {n} records to {log_dir}; view with: tensorboard --logdir {log_dir}")
    return 0
