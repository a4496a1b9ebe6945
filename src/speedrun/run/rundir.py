"""A run's output folder: config, environment, metrics, summary.

`metrics.jsonl` (one JSON object per line, appended and flushed as the run
goes) is the source of truth; `summary.json` is written once, atomically, at
the end, and its presence marks a finished run. A folder that already holds
a run, finished or not, is never trained into again unless asked: an
unfinished one is continued with `--resume`, either is replaced with
`--overwrite`. A folder this process created and left without a single
record (a run that failed while setting up) is removed again, so failures
leave no empty run folders behind.
"""

from __future__ import annotations

import json
import os
import shutil
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


# What a run writes besides config.json and env.json: removed by --overwrite, so that nothing of the
# replaced run (its checkpoints above all) stays beside the new one
RUN_FILES = ("metrics.jsonl", "summary.json", "model.safetensors", "compile_times.txt", "precompile.log")
RUN_FOLDERS = ("checkpoints", "tensorboard")


def _holds_records(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


class RunDir:
    def __init__(self, path: Path, overwrite: bool = False, resume: bool = False):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"--out {self.path}: exists and is not a folder")
        if not (overwrite or resume):
            self._refuse_earlier_run()
        self.created = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            if overwrite and not resume:
                self._clear()
            self._metrics = open(self.path / "metrics.jsonl", "a")
        except OSError as e:
            raise ConfigError(f"--out {self.path}: cannot write the run folder ({e.strerror or e})") from None

    def _refuse_earlier_run(self) -> None:
        if (self.path / "summary.json").exists():
            raise ConfigError(
                f"--out {self.path}: already holds a finished run (summary.json); "
                "choose another --out or pass --overwrite")
        if _holds_records(self.path / "metrics.jsonl") or (self.path / "checkpoints").is_dir():
            raise ConfigError(
                f"--out {self.path}: holds an unfinished run; continue it with --resume {self.path}, "
                "or start it again with --overwrite")

    def _clear(self) -> None:
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        for old in self.path.glob("env.resume-*.json"):
            old.unlink()
        for name in RUN_FOLDERS:
            shutil.rmtree(self.path / name, ignore_errors=True)

    def abandon(self) -> None:
        """After a failure: remove the folder if this process made it and nothing worth keeping (a
        metrics record, a checkpoint, a model) was written into it."""
        self.close()
        keep = (_holds_records(self.path / "metrics.jsonl") or (self.path / "checkpoints").is_dir()
                or (self.path / "model.safetensors").exists())
        if self.created and not keep:
            shutil.rmtree(self.path, ignore_errors=True)

    def write_json(self, name: str, obj) -> None:
        atomic_write_text(self.path / name, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")

    def log(self, record: dict) -> None:
        self._metrics.write(json.dumps(record, sort_keys=True) + "\n")
        self._metrics.flush()

    def close(self) -> None:
        if not self._metrics.closed:
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
