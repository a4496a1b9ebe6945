"""What a run does around its compiler: the portable cache, Dynamo's packages, the warm note, the
precompile child and how many warm-up steps the caches leave to run.

Why it is an object of its own: the trainer needs four moments from it (before the first step is
compiled, the first validation, the first timed step, the end) and nothing of how the caches work.
`speedrun train` and `speedrun bench` build one and hand it to the `Trainer`; a `Trainer` built
without one makes the same default, so every caller gets the same caches. Each moment keeps its
place in the cold start's phases (startup.py), where it was measured.
"""

from __future__ import annotations

from pathlib import Path

from speedrun.compile import dynamo_cache, precompile
from speedrun.compile.cache import key_local_caches, load_for_run
from speedrun.compile.startup import StartupPhases, compiled_graphs
from speedrun.config import RunConfig
from speedrun.run.rundir import atomic_write_text
from speedrun.train.dist import DistInfo, all_ranks, barrier
from speedrun.train.setup import use_compile


class CompileSession:
    def __init__(self, cfg: RunConfig, info: DistInfo):
        self.cfg, self.info, self.device = cfg, info, info.device
        self.compiled = use_compile(cfg.train.compile, self.device)
        self.cache_state = "not compiled"  # what the portable cache did: "loaded ...", "none ..."
        self.packages, self.warm_note, self.precompiler = None, None, None
        self.warmup_count = cfg.train.warmup_steps  # fewer on a warm start (open)
        self.first_validation_pending = True  # it waits for the precompile child and meets the other ranks
        self._graphs_saved = 0  # Dynamo's graph count when its packages were last saved

    def _log(self, text: str) -> None:
        if self.info.is_main:
            print(text, flush=True)

    def open(self, log_dir: Path | None) -> None:
        """Before the model is built: load the portable cache (finding none costs milliseconds; loaded,
        it holds the evaluation graph too, so no precompile child is needed), key torch's local caches,
        switch on Dynamo's package cache and, on a cold start, start the precompile child early."""
        if not self.compiled:
            return
        cfg, info = self.cfg, self.info
        self.cache_state = load_for_run(cfg, self.device, info.world_size, print if info.is_main else None)
        portable = self.cache_state.startswith("loaded")
        key_local_caches()  # torch's local caches miss after any change to speedrun's sources
        self.packages = packages = dynamo_cache.enable(cfg, self.device, info.world_size, info.rank)
        if packages is not None:
            self._log(f"speedrun: dynamo cache: {'found' if packages.found else 'none'} ({packages.path})")
        self.warm_note = precompile.warm_note(cfg, info)
        warm = (packages is not None and packages.found) or self.warm_note.exists()
        self._log("speedrun: local compile caches: " + ("warm (no precompile child)" if warm else
              "cold, filled from the portable cache (no precompile child)" if portable else "cold"))
        log_path = log_dir / "precompile.log" if log_dir is not None else None
        self.precompiler = precompile.start(cfg, info, log_path, warm=warm or portable)
        if all_ranks(warm, self.device):  # every rank must run the same number of warm-up steps
            t = cfg.train
            self.warmup_count = min(t.warmup_steps, max(t.warmup_steps_warm, 2 if t.health_every else 1))

    def compile(self, build):
        """The step model `build()` makes, traced under Dynamo's package cache when it is on."""
        return dynamo_cache.compile_with(self.packages, build)

    def before_validation(self, startup: StartupPhases) -> None:
        """Before the first validation: let this rank's precompile child finish filling the caches
        (compiling the evaluation graph twice at once would only slow both), then meet every rank."""
        if not self.first_validation_pending:
            return
        self.first_validation_pending = False
        proc, self.precompiler = self.precompiler, None
        if proc is not None:
            note = precompile.wait(proc)
            startup.mark("precompile_wait")
            self._log(f"speedrun: precompile {note}")
        if self.compiled:
            barrier()

    def after_validation(self) -> None:
        """The caches now hold both graphs: later runs of this key start warm."""
        if self.warm_note is not None and not self.warm_note.exists():
            self.warm_note.parent.mkdir(parents=True, exist_ok=True)
            self.warm_note.touch()

    def timed_start(self, startup: StartupPhases, run_dir: Path | None) -> None:
        """Just before the first timed step: stop a child nothing waited for, save Dynamo's packages and
        write where the compile time went, by compiler stage."""
        self.stop_precompile()
        self.first_validation_pending = False
        if self.save_packages():
            startup.mark("dynamo_save")
        if self.compiled and run_dir is not None:
            from torch._dynamo.utils import compile_times

            atomic_write_text(run_dir / "compile_times.txt", str(compile_times(repr="str", aggregate=True)))

    def save_packages(self) -> bool:
        """Save Dynamo's packages when this process compiled a graph since the last save."""
        graphs = compiled_graphs()
        if graphs <= self._graphs_saved or not dynamo_cache.save(self.packages):
            return False
        self._graphs_saved = graphs
        return True

    def stop_precompile(self) -> None:
        precompile.stop(self.precompiler)
        self.precompiler = None

    def release(self) -> None:
        """Stop the precompile child and switch Dynamo's package cache off again, so that whatever
        this process compiles next (a notebook, a test, another run) is neither packaged into this
        run's folder nor left with torch's switch on."""
        self.stop_precompile()
        dynamo_cache.disable(self.packages)
        self.packages = None


class PlainSession:
    """The session of a model the portable cache and the precompile child do not serve (the 2026
    record): the same moments, torch's own local caches only. `compiled` says whether the step is."""

    def __init__(self, compiled: bool, info: DistInfo):
        self.compiled, self.info = compiled, info
        self.cache_state = "local caches only" if compiled else "not compiled"

    def open(self, log_dir: Path | None) -> None:
        pass

    def compile(self, build):
        return build()

    def before_validation(self, startup: StartupPhases) -> None:
        pass

    def after_validation(self) -> None:
        pass

    def timed_start(self, startup: StartupPhases, run_dir: Path | None) -> None:
        pass

    def save_packages(self) -> bool:
        return False

    def release(self) -> None:
        pass
