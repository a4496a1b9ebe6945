"""Runs that survive: checkpoints, resume, signals, fault policy.

`RunGuard` is the training loop's one contact with all of this: the loop asks
it for the next batch, hands it each step's loss, and calls `boundary(step)`
before every step. Why it is built this way:
- Decisions are taken at *check points* only (see health.py), so ordinary
  steps never wait on the host. With several ranks every decision (a fault,
  a time-based checkpoint, a signal) goes through one all-reduce at a check
  point, so all ranks act at the same step; one rank alone never can. With
  one rank, time-based checkpoints and signals are handled at the next step.
- The policy on a fault is the user's: `stop` keeps the last good checkpoint
  (the bad state is never written), logs the fault and exits 3; `recover`
  rolls back to the last good checkpoint, marks the offending batch(es) to be
  skipped, turns the FP8 head off, multiplies the learning rate by
  `recover_lr_factor`, logs it all and writes a checkpoint at once so the
  decisions survive a crash; after `max_recoveries` it stops.
- metrics.jsonl reads as one consistent run: after a resume or a roll-back
  to step c, step records after c are dropped (events are kept, and the
  fault event carries the bad values).
"""

from __future__ import annotations

import math
import signal
import threading
import time
from pathlib import Path

import torch

from speedrun import __version__
from speedrun.run import checkpoint as ck
from speedrun.config import AnyConfig, all_field_paths, apply_overrides, config_class, diff, from_dict
from speedrun.errors import ConfigError
from speedrun.run.faults import FaultInjector, Interrupted, TrainingFault
from speedrun.run.health import Fault, HealthMonitor, LossJudge, weights_finite

# Fields that may differ between a checkpoint and the command that resumes it:
# none of them changes what is trained.
MAY_CHANGE = tuple(f"train.{n}" for n in (
    "checkpoint_every_steps", "checkpoint_every_minutes", "health_every", "spike_factor", "on_fault",
    "max_recoveries", "recover_lr_factor", "inject_fault", "log_every", "sample_tokens", "val_every",
    "warmup_steps", "warmup_steps_warm", "compile",
    # how the step is compiled and launched, not what it computes (config.py: "Speed only")
    "precompile", "dynamo_cache", "kernels", "warmup")) + ("data.data_dir", "attention.backend", "stages.val_every")


# ---------------------------------------------------------------- command line

def checkpoint_every_overrides(value: str | None) -> list[str]:
    """--checkpoint-every 100 (steps) | 10m (minutes) -> --set overrides."""
    if value is None:
        return []
    v = value.strip().lower()
    try:
        if v.endswith("m") or v.endswith("min"):
            minutes = float(v.rstrip("min") or "x")
            if minutes > 0:
                return [f"train.checkpoint_every_minutes={minutes}"]
        elif int(v) > 0:
            return [f"train.checkpoint_every_steps={int(v)}"]
    except ValueError:
        pass
    raise ConfigError(f"--checkpoint-every {value}: expected a number of steps (e.g. 100) or minutes (e.g. 10m)")


def _describe(d: dict, limit: int = 4) -> str:
    items = [f"{k}: checkpoint {a!r}, now {b!r}" for k, (a, b) in d.items()]  # model fields first
    more = f" (and {len(items) - limit} more)" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more


def resume_config(run: Path, preset: str | None, asked: AnyConfig | None, overrides: list[str]) -> AnyConfig:
    """The config to resume `run` with, or a one-line refusal saying what differs.

    With --preset, `asked` (that preset plus the flags) must equal the
    checkpoint's config; without, the flags apply on top of the checkpoint's
    (an injected test fault is not carried over). Only MAY_CHANGE fields may
    differ.
    """
    run = Path(run)
    if (run / "summary.json").exists():
        raise ConfigError(f"--resume {run}: the run already finished (summary.json); nothing to resume")
    folder = ck.latest_checkpoint(run)
    if folder is None:
        raise ConfigError(f"--resume {run}: no checkpoint in {run / ck.CHECKPOINTS} "
                          "(was it run with --checkpoint-every?)")
    meta = ck.read_trainer(folder)
    if meta.get("speedrun_version") != __version__ or meta.get("format") != ck.FORMAT:
        raise ConfigError(f"--resume {run}: checkpoint written by speedrun {meta.get('speedrun_version')} "
                          f"(format {meta.get('format')}), this is speedrun {__version__} (format {ck.FORMAT})")
    written = ck.load_config_dict(folder)
    if ck.config_hash(written) != meta.get("config_hash"):
        raise ConfigError(f"--resume {run}: {folder / ck.CONFIG} does not match the checkpoint (edited?)")
    _refuse_fields_added_since(run, written)
    saved = from_dict(written)
    if preset is not None and preset != saved.name:
        what = _describe(diff(saved, asked)) if type(saved) is type(asked) else "a different record's model"
        raise ConfigError(f"--resume {run}: checkpoint is preset '{saved.name}', command line asks '{preset}'; "
                          f"{what}")
    cfg = asked if preset is not None else apply_overrides(ck.load_config(folder), ["train.inject_fault="] + overrides)
    differs = {k: v for k, v in diff(saved, cfg).items() if k not in MAY_CHANGE}
    if differs:
        raise ConfigError(f"--resume {run}: the command line changes the run: {_describe(differs)}")
    return cfg


def _refuse_fields_added_since(run: Path, written: dict) -> None:
    """A checkpoint from an earlier speedrun of the same version may lack fields added since. Those in
    MAY_CHANGE take their defaults; any other could change what the run computes, so the resume stops."""
    absent = [p for p in all_field_paths(config_class(written))
              if p.split(".", 1)[1] not in written.get(p.split(".", 1)[0], {})]
    absent = [p for p in absent if p not in MAY_CHANGE]
    if absent:
        more = f" (and {len(absent) - 4} more)" if len(absent) > 4 else ""
        raise ConfigError(f"--resume {run}: the checkpoint's config has no {', '.join(absent[:4])}{more}: it was "
                          "written by earlier speedrun code; resume it with that code")


def tensorboard_writer(run: Path):
    try:
        from speedrun.tools.tensorboard_log import TensorBoardWriter
    except ImportError as e:
        raise ConfigError(f"--tensorboard: not available ({e}); pip install 'speedrun[tensorboard]'") from None
    return TensorBoardWriter(run)


# ---------------------------------------------------------------- the loop's guard

class StepCursor:
    """`for step in cursor`, which a roll-back can move back."""

    def __init__(self, start: int, last: int):
        self.next, self.last = start, last

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.next > self.last:
            raise StopIteration
        self.next += 1
        return self.next - 1


class RunGuard:
    def __init__(self, trainer, resume: Path | None = None):
        self.tr, self.resume_dir = trainer, Path(resume) if resume else None
        t = trainer.cfg.train
        self.t, self.info = t, trainer.info
        self.faults = FaultInjector(t.inject_fault)
        self.health = HealthMonitor(trainer.model, t.health_every)
        self.judge = LossJudge(t.spike_factor)
        self.writer = ck.CheckpointWriter(trainer.out_path, self.info.rank, self.info.world_size)
        self.copier = ck.HostCopier()
        self.saving = bool(t.checkpoint_every_steps or t.checkpoint_every_minutes or t.on_fault == "recover")
        self.active = False  # off during warm-up
        self.batches = 0  # data batches drawn (incl. skipped ones)
        self.skip: set[int] = set()
        self.recoveries, self.lr_factor = 0, 1.0
        self.start_step, self.train_time_s = 0, 0.0
        self.window: list[tuple[int, int, torch.Tensor]] = []  # (step, batch, loss) since the last check
        self.batch = -1
        self.cursor: StepCursor | None = None
        self.save_at: int | None = None  # a checkpoint is due at this boundary (start, after a roll-back)
        self.last_save_time = time.monotonic()
        self.last_saved: int | None = None
        self.signum: int | None = None
        self._old_handlers: dict = {}
        self._warm_steps = 0
        from speedrun.compile.cache import source_hash

        self.sources = source_hash()  # in each checkpoint: a resume by other code says so

    # ------------------------------------------------------------ hooks in train_step

    def next_batches(self):
        """This step's batches, past any marked bad; applies injected faults."""
        loader = self.tr.loader
        if not self.active:  # warm-up: its last step runs the health hooks, so both graphs compile untimed
            self._warm_steps += 1
            self.health.force = bool(self.t.health_every) and self._warm_steps == self.tr.warmup_count
            return loader.next_step()
        while self.batches in self.skip:
            loader.next_step()
            self.batches += 1
        self.batch = self.batches
        if self.faults:
            self.faults.before_step(self.batch)
        self.batches += 1
        return loader.next_step()

    def loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.faults.loss(self.batch, loss) if self.active and self.faults else loss

    def before_update(self, step: int) -> None:
        if self.active and self.faults:
            self.faults.grads(self.batch, self.tr.model)
        self.health.before_update(step)

    def after_update(self, step: int, loss: torch.Tensor) -> None:
        self.health.after_update(step, loss)
        if self.active:
            self.window.append((step, self.batch, loss))

    # ------------------------------------------------------------ start / end

    def start(self) -> None:
        """After warm-up: restore a checkpoint when resuming; install signal handlers."""
        self.health.force, self.health.pending = False, None
        if self.info.is_main and self.resume_dir is None:
            ck.remove_partial(self.tr.out_path)
        if self.resume_dir is not None:
            folder = ck.latest_checkpoint(self.resume_dir)
            written_by = self._restore(folder, resume=True).get("source_sha256")
            if self.info.is_main:
                print(f"speedrun: resumed from step {self.start_step} ({folder})", flush=True)
            self.tr._log({"event": "resume", "step": self.start_step, "checkpoint": folder.name,
                          "speedrun_version": __version__, "source_sha256": self.sources,
                          "checkpoint_source_sha256": written_by})
            if written_by not in (None, self.sources) and self.info.is_main:
                print(f"speedrun: note: {folder.name} was written by other speedrun sources (sha256 "
                      f"{written_by[:12]}, these are {self.sources[:12]}); the run goes on, but is not step for "
                      "step the run either code would make alone", flush=True)
        elif self.saving:
            self.save_at = 0
        from speedrun.train.dist import barrier

        barrier()
        self.active = True
        self._install_signals()

    def steps(self, last: int) -> StepCursor:
        self.cursor = StepCursor(self.start_step, last)
        return self.cursor

    def close(self) -> None:
        """Finish an in-flight write and put the signal handlers back (idempotent)."""
        self._report(self.writer.wait())
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers = {}

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.signum = signum

    # ------------------------------------------------------------ boundaries

    def boundary(self, step: int, clock, pending, last: bool) -> bool:
        """Before step `step`. True: rolled back (the loop continues from the restored step)."""
        single = self.info.world_size == 1
        due = self._save_due(step, last)
        check = (last or due or step == self.save_at or self.health.pending is not None
                 or self.tr.validates(step))
        if single:
            check = check or self.signum is not None or self._time_due(last)
        if not check:
            return False
        fault, health, time_due, signalled = self._check(step, due)
        if fault is not None:
            self._on_fault(fault, pending)
            return True
        self.tr._flush_losses(pending)
        if health:
            self.tr._log(health)
        if not last and (due or time_due or signalled or step == self.save_at):
            self.save(step, clock)
        if signalled and not last:  # at the last step the run is about to finish anyway
            self._interrupt(step)
        return False

    def _save_due(self, step: int, last: bool) -> bool:
        n = self.t.checkpoint_every_steps
        return bool(n and not last and step % n == 0 and step != self.last_saved)

    def _time_due(self, last: bool) -> bool:
        m = self.t.checkpoint_every_minutes
        return bool(m and not last and time.monotonic() - self.last_save_time >= 60 * m)

    def _check(self, step: int, due: bool) -> tuple[Fault | None, dict | None, bool, bool]:
        """One host transfer (and, W > 1, one all-reduce): the window's losses and the flags."""
        dev = self.tr.device
        losses = [w[2].float().reshape(1) for w in self.window]
        flags = torch.tensor([float(self._time_due(False)), float(self.signum is not None)], device=dev)
        weights_ok = weights_finite(self.health.params).float().reshape(1) if due else torch.ones(1, device=dev)
        vec = torch.cat([*losses, weights_ok.to(dev), flags])
        if self.info.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(vec)
            vec[:len(losses) + 1] /= self.info.world_size
        host = vec.tolist()
        health = self.health.take()
        fault = self._judge(host[:len(losses)], health, host[len(losses)] == 1.0)
        return fault, health, host[-2] > 0, host[-1] > 0

    def _judge(self, losses: list[float], health: dict | None, weights_ok: bool) -> Fault | None:
        window, self.window = self.window, []
        for (step, batch, _), value in zip(window, losses):
            fault = self.judge.judge(step, batch, value)
            if fault:
                return fault
        if health is not None and not math.isfinite(health["health"]["grad_norm"]):
            s, g = health["step"] - 1, health["health"]["grad_norm"]
            batch = next((b for st, b, _ in window if st == s), self.batch)
            return Fault(s, f"gradient norm is {g} at step {s}", [batch], g)
        if not weights_ok and window:
            s, batch, _ = window[-1]
            return Fault(s, f"weights became non-finite by step {s + 1}", [batch - 1, batch])
        return None

    # ------------------------------------------------------------ checkpoints

    def snapshot(self, step: int, train_time_s: float) -> ck.Snapshot:
        tr = self.tr
        rank_state = {"optimizers": [o.state_dict() for o in tr.optimizers], "loader": tr.loader.state_dict(),
                      "extra": tr.extra_state()}
        rank_state = self.copier.copy(rank_state, tr.device)
        rank_state["rng"] = ck.rng_state()
        model = self.copier.copy(tr.model.state_dict(), tr.device) if self.info.is_main else None
        meta = {
            "format": ck.FORMAT, "speedrun_version": __version__, "source_sha256": self.sources, "preset": tr.cfg.name,
            "config_hash": ck.config_hash(tr.cfg), "world_size": self.info.world_size, "step": step,
            "train_time_s": train_time_s, "batches_drawn": self.batches, "skip_batches": sorted(self.skip),
            "recoveries": self.recoveries, "lr_factor": self.lr_factor, "fp8_head": bool(tr.model.use_fp8),
            "loss_history": self.judge.history, "loader": tr.loader.state_dict(), "saved_at": time.time(),
        }
        return ck.Snapshot(ck.checkpoint_name(step, self.recoveries), tr.cfg, meta, rank_state, model)

    def save(self, step: int, clock) -> None:
        """Snapshot to the host (blocking, measured), then write in the background."""
        t0 = time.perf_counter()
        self._report(self.writer.wait())
        snap = self.snapshot(step, clock.approx_ms() / 1000)
        self.writer.start(snap)
        blocked = time.perf_counter() - t0
        self.last_saved, self.last_save_time, self.save_at = step, time.monotonic(), None
        self.tr._log({"event": "checkpoint", "step": step, "name": snap.name, "blocked_ms": 1000 * blocked})

    def _report(self, result: ck.WriteResult | None) -> None:
        if result is None or not self.info.is_main:
            return
        if result.error is None:
            self.tr._log({"event": "checkpoint_written", "name": result.name, "write_ms": 1000 * result.seconds})
            return
        msg = f"checkpoint {result.name} could not be written ({result.error}); the previous one is kept"
        print(f"speedrun: warning: {msg}", flush=True)
        self.tr._log({"event": "checkpoint_failed", "name": result.name, "reason": str(result.error)})

    def _latest(self) -> Path | None:
        self._report(self.writer.wait())
        return ck.latest_checkpoint(self.tr.out_path)

    # ------------------------------------------------------------ restore, faults, signals

    def _restore(self, folder: Path, resume: bool) -> dict:
        """Load the checkpoint in `folder` into the trainer; its trainer.json."""
        tr = self.tr
        data = ck.load_checkpoint(folder, self.info.rank)
        meta = data.trainer
        if meta["world_size"] != self.info.world_size:
            raise ConfigError(f"--resume: checkpoint {folder} was written by {meta['world_size']} rank(s); "
                              f"resume with as many processes (this run has {self.info.world_size})")
        tr.model.load_state_dict(data.model)
        for opt, state in zip(tr.optimizers, data.rank_state["optimizers"], strict=True):
            opt.load_state_dict(state)
        tr.loader.load_state_dict(data.rank_state["loader"])
        tr.load_extra_state(data.rank_state.get("extra", {}))
        ck.set_rng_state(data.rank_state["rng"])
        self.batches, self.judge.history = meta["batches_drawn"], list(meta["loss_history"])
        self.start_step, self.last_saved = meta["step"], meta["step"]
        self.window, self.last_save_time = [], time.monotonic()
        self.health.discard()
        if resume:
            self.skip, self.recoveries, self.lr_factor = set(meta["skip_batches"]), meta["recoveries"], meta["lr_factor"]
            self.train_time_s = meta["train_time_s"]
            tr.model.use_fp8 = tr.model.use_fp8 and meta["fp8_head"]
        if self.info.is_main:
            truncate_metrics(tr.out_path / "metrics.jsonl", meta["step"])
        return meta

    def _on_fault(self, fault: Fault, pending) -> None:
        t, tr = self.t, self.tr
        pending.flush()  # the bad window's losses are not logged as steps; the event carries the value
        self.health.discard()
        tr._log({"event": "fault", "step": fault.step, "reason": fault.reason, "value": fault.value,
                 "policy": t.on_fault})
        folder = self._latest()
        where = f"last good checkpoint: {folder}" if folder else "no checkpoint was written (see --checkpoint-every)"
        if t.on_fault == "stop":
            raise TrainingFault(f"{fault.reason}; stopped (--on-fault stop); {where}")
        if self.recoveries >= t.max_recoveries or folder is None:
            why = f"gave up after {self.recoveries} recoveries" if folder else "cannot recover"
            raise TrainingFault(f"{fault.reason}; {why} (train.max_recoveries={t.max_recoveries}); {where}")
        self._recover(fault, folder)

    def _recover(self, fault: Fault, folder: Path) -> None:
        tr = self.tr
        self._restore(folder, resume=False)
        self.skip |= {b for b in fault.batches if b >= self.batches}
        self.recoveries += 1
        self.lr_factor *= self.t.recover_lr_factor
        fp8_was = bool(tr.model.use_fp8)
        tr.model.use_fp8 = False
        actions = [f"rolled back to {folder.name}", f"skipping batch(es) {sorted(self.skip)}",
                   f"lr x {self.lr_factor:g}", "FP8 head -> bfloat16" if fp8_was else "FP8 head already off"]
        tr._log({"event": "recover", "step": self.start_step, "reason": fault.reason, "actions": actions,
                 "recoveries": self.recoveries, "lr_factor": self.lr_factor, "skip_batches": sorted(self.skip)})
        if self.info.is_main:
            print(f"speedrun: {fault.reason}; recovery {self.recoveries}/{self.t.max_recoveries}: "
                  + ", ".join(actions), flush=True)
        self.cursor.next, self.save_at, self.last_saved = self.start_step, self.start_step, None

    def _interrupt(self, step: int) -> None:
        name = signal.Signals(self.signum).name
        self.close()
        folder = ck.latest_checkpoint(self.tr.out_path)
        raise Interrupted(f"stopped by {name} at step {step}; checkpoint {folder}; continue with: "
                          f"speedrun train --resume {self.tr.out_path}", self.signum)


def truncate_metrics(path: Path, step: int) -> None:
    """Drop step records after `step` (and validation at `step`, which is re-run); keep events."""
    if not path.exists():
        return

    def keep(line: str) -> bool:
        import json

        try:
            r = json.loads(line)
        except ValueError:
            return False
        if "event" in r:
            return True
        s = r.get("step", 0)
        return s < step or (s == step and "val_loss" not in r)

    with open(path, "r+") as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
        kept = [ln for ln in lines if keep(ln)]
        if len(kept) != len(lines):
            f.seek(0)
            f.write("".join(ln + "\n" for ln in kept))
            f.truncate()
            f.flush()
