"""Where a run's cold start goes: named phases from process start to the first timed step.

The speedrun's cold start (process start to the first timed step) is one
number in summary.json, and a user who wants it smaller needs to know which
part to attack: Python imports, building the model, loading the compile
cache, compiling (the first warm-up step), the remaining warm-up steps, the
restore, the wait for the precompile child and the first validation (which
compiles the evaluation graph; the reference's clock also starts after its
step-0 validation), saving Dynamo's packages. Each
`mark` closes a phase; on a GPU it first waits for the device, so queued
kernels are charged to the phase that launched them. Marks are only placed
before the training clock starts, so the waits cost the timed run nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch


class StartupPhases:
    """Consecutive phases since `t_start` (seconds since the epoch, e.g. process start)."""

    def __init__(self, t_start: float, device: torch.device | None = None):
        self.t_start = self._last = t_start
        self.device = device
        self.phases: dict[str, float] = {}

    def mark(self, name: str) -> None:
        """End the phase `name` now (a repeated name adds to it)."""
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.time()
        self.phases[name] = self.phases.get(name, 0.0) + (now - self._last)
        self._last = now

    def total(self) -> float:
        return self._last - self.t_start

    def as_dict(self) -> dict[str, float]:
        return {name: round(s, 3) for name, s in self.phases.items()}

    def describe(self) -> str:
        """One line: 'total 35.1 s = imports 3.0 + model 2.1 + ...'."""
        parts = " + ".join(f"{name} {s:.1f}" for name, s in self.phases.items())
        return f"{self.total():.1f} s = {parts}"


def first_time_on_machine(name: str) -> bool:
    """True the first time a note called `name` is asked for on this machine (a marker file under
    `$SPEEDRUN_HOME/notes`), so advice about the machine's set-up is read once, not at every start."""
    from speedrun.data.paths import cache_root

    marker = cache_root() / "notes" / name
    if marker.exists():
        return False
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass  # an unwritable cache: the note shows again, which is only noise
    return True


def compiled_graphs() -> int:
    """How many graphs Dynamo has compiled in this process so far (its own counter).

    Taken when the training clock starts and again at the end, the difference is
    the number of recompilations in the timed run, which should be 0: every
    graph the run needs is compiled during warm-up. A torch without the counter
    reports 0.
    """
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["stats"].get("unique_graphs", 0))



def bytecode_note(dont_write_bytecode: bool, pycache_prefix: str | None) -> str | None:
    """A note for a start whose imports cannot use Python's bytecode cache, else None.

    With PYTHONDONTWRITEBYTECODE set and no bytecode installed beside the
    sources (an image built that way), every start compiles torch's, Dynamo's
    and Inductor's modules from source: measured on an H200 machine, 11-13 s
    of imports instead of 4 (measured 2026-11-30 at 7801012). It is the
    user's setting, so it is reported, not overridden.
    """
    if not dont_write_bytecode:
        return None
    where = f" (PYTHONPYCACHEPREFIX={pycache_prefix} is only read)" if pycache_prefix else ""
    return ("PYTHONDONTWRITEBYTECODE is set: Python keeps no bytecode of the modules it compiles" + where
            + ", so where none was installed every start compiles torch's from source (about 8 s on an H200 "
            "machine); unset it, with PYTHONPYCACHEPREFIX=<a writable folder> if site-packages is read-only")


def process_start_time() -> float:
    """Wall-clock time at which this process started (Linux /proc), else now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return time.time()
