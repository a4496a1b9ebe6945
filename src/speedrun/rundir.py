"""A run's output folder: config, environment, metrics, summary.

`metrics.jsonl` (one JSON object per line, appended and flushed as the run
goes) is the source of truth; `summary.json` is written once, atomically, at
the end, and its presence marks a finished run, which is never overwritten
unless asked.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from speedrun.errors import ConfigError


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def git_commit(start: Path | None = None) -> str | None:
    here = start or Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def git_dirty(start: Path | None = None) -> bool | None:
    """True when tracked files differ from HEAD (the run's code is not exactly `git_commit`)."""
    here = start or Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


def default_out_dir(preset: str) -> Path:
    return Path("runs") / f"{preset}-{time.strftime('%Y%m%d-%H%M%S')}"


class RunDir:
    def __init__(self, path: Path, overwrite: bool = False, resume: bool = False):
        self.path = Path(path)
        if (self.path / "summary.json").exists() and not (overwrite or resume):
            raise ConfigError(
                f"--out {self.path}: already holds a finished run (summary.json); "
                "choose another --out or pass --overwrite")
        self.path.mkdir(parents=True, exist_ok=True)
        if overwrite and not resume:
            for name in ("metrics.jsonl", "summary.json"):
                (self.path / name).unlink(missing_ok=True)
        self._metrics = open(self.path / "metrics.jsonl", "a")

    def write_json(self, name: str, obj) -> None:
        atomic_write_text(self.path / name, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")

    def log(self, record: dict) -> None:
        self._metrics.write(json.dumps(record, sort_keys=True) + "\n")
        self._metrics.flush()

    def close(self) -> None:
        self._metrics.close()


def read_metrics(run: Path) -> list[dict]:
    path = Path(run) / "metrics.jsonl"
    if not path.exists():
        raise ConfigError(f"{path}: no metrics.jsonl (is {run} a speedrun run folder?)")
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{i}: not valid JSON ({e.msg})") from None
    return out
