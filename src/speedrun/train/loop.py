"""The training loop: the `Trainer` that `speedrun train` and `torchrun ... -m speedrun.train` run.

It follows the speedrun's timing rules: `warmup_steps` untimed steps compile
and warm the kernels, then model, optimisers and data position are restored
to their initial values; the clock runs only over training steps and stops
during validation. The global batch is fixed: with W ranks each runs
batch_seqs / W micro-steps and the optimisers average the gradients.

Nothing in a training step waits on the host: losses stay on the device and
are written to metrics.jsonl at the next validation (which synchronises
anyway).

The loop runs steps, evaluation, warm-up and the loop itself. The compiler's
caches and precompile child (compile/session.py) and whatever watches the
timed run (the GPU's clocks, bench/gpu_clocks.py) come in from the command
that composes them (cli/train.py), and are called at their moments: before
the first validation, at the first timed step, at the end.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from speedrun.train import schedules
from speedrun.config import RunConfig
from speedrun.train.dist import DistInfo, all_reduce_mean
from speedrun.model.gpt import count_parameters
from speedrun.optim.groups import build_optimizers
from speedrun.run.rundir import RunDir, git_commit, git_dirty
from speedrun.data.shards import check_vocab
from speedrun.compile.session import CompileSession
from speedrun.train.setup import build_model, pick_dtype, resolve_data
from speedrun.compile.startup import StartupPhases, bytecode_note, compiled_graphs, first_time_on_machine


# ------------------------------------------------------------------ trainer


def env_file_name(run: Path, resuming: bool) -> str:
    """env.json for the run's first process; a resumed process, which may run other code on another
    machine, writes env.resume-<k>.json beside it (k = 1, 2, ...) and leaves the first one as it was."""
    if not resuming or not (run / "env.json").exists():
        return "env.json"
    return f"env.resume-{len(list(run.glob('env.resume-*.json'))) + 1}.json"


@torch.no_grad()
def grad_norm(model: torch.nn.Module) -> torch.Tensor:
    """L2 norm of the gradient this rank's micro-steps summed (device scalar; no host wait). With several
    ranks each logs its own, before the optimisers average them."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.stack([n.float() for n in torch._foreach_norm(grads)]).square().sum().sqrt()


@dataclass
class Clock:
    """Training time: runs between `start` and `stop`, synchronising the device."""

    device: torch.device
    elapsed: float = 0.0
    _t0: float | None = None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        self._sync()
        self._t0 = time.perf_counter()

    @property
    def running(self) -> bool:
        return self._t0 is not None

    def stop(self) -> None:
        self._sync()
        if self._t0 is not None:
            self.elapsed += time.perf_counter() - self._t0
        self._t0 = None

    def approx_ms(self) -> float:
        """Without synchronising (for logging between validations)."""
        extra = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        return 1000 * (self.elapsed + extra)


@dataclass
class PendingLosses:
    """Per-step training losses and gradient norms kept on the device until the next sync point, with
    the step's learning-rate multiplier (known on the host)."""

    steps: list = field(default_factory=list)
    values: list = field(default_factory=list)  # (loss, grad_norm) device pairs
    times: list = field(default_factory=list)
    lr_mults: list = field(default_factory=list)

    def add(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, ms: float, lr_mult: float) -> None:
        self.steps.append(step)
        self.values.append(torch.stack([loss.float().reshape(()), grad_norm.float().reshape(()).to(loss.device)]))
        self.times.append(ms)
        self.lr_mults.append(lr_mult)

    def flush(self) -> list[tuple[int, float, float, float, float]]:
        if not self.values:
            return []
        values = torch.stack(self.values).tolist()
        out = [(s, v[0], v[1], ms, lr) for s, v, ms, lr in zip(self.steps, values, self.times, self.lr_mults)]
        self.steps, self.values, self.times, self.lr_mults = [], [], [], []
        return out


class Trainer:
    def __init__(self, cfg: RunConfig, info: DistInfo, out: Path, overwrite: bool = False,
                 progress: bool = True, t_start: float | None = None, resume: Path | None = None,
                 keep_checkpoints: bool = False, session: CompileSession | None = None, watchers: tuple = ()):
        self.cfg, self.info = cfg, info
        self.t_start = t_start or time.time()
        self.device = info.device
        self.startup = StartupPhases(self.t_start, self.device)
        self.startup.mark("imports")  # process start -> here: interpreter, imports, arguments, process group
        note = bytecode_note(bool(sys.flags.dont_write_bytecode), sys.pycache_prefix)
        if note and info.is_main and first_time_on_machine("bytecode"):
            print(f"speedrun: note: {note}", flush=True)
        self.dtype = pick_dtype(cfg.train.dtype, self.device)
        if self.device.type == "cpu":
            from speedrun.train.host_memory import keep_freed_blocks

            keep_freed_blocks()  # a CPU step reuses its freed tensors' pages instead of faulting in new ones
        self.progress = progress and info.is_main
        self.out = RunDir(out, overwrite=overwrite, resume=resume is not None) if info.is_main else None
        self.out_path, self.tb, self.phase = Path(out), None, "set-up"
        self.keep_checkpoints = keep_checkpoints
        self.lr_mult, self.grad_norm, self.last_train_loss = 1.0, None, None
        self._windows: dict[int, torch.Tensor] = {}
        # the compiler's caches and child process (compile/session.py), and whatever watches the timed
        # run (the GPU's clocks): the command composes them, the loop only calls them at their moments
        self.session = session or CompileSession(cfg, info)
        self.watchers = tuple(watchers)
        self._cold = True  # until the first timed step: marks go to the cold start's phases
        self._graphs_at_start, self._graphs_in_validation = 0, 0
        try:
            self._build()
        except BaseException:
            self.session.release()
            if self.out:
                self.out.abandon()
            raise
        from speedrun.run.resilience import RunGuard

        self.guard = RunGuard(self, resume)  # checkpoints, resume, health, fault policy, signals
        self.startup.mark("optimizers_data")

    # -------------------------------------------------------------- set-up

    def _build(self) -> None:
        cfg, info = self.cfg, self.info
        self.micro_steps = cfg.train.batch_seqs // info.world_size
        self.tokens_per_step = cfg.train.batch_seqs * cfg.train.seq_len
        self.compiled = self.session.compiled
        self.session.open(self.out.path if self.out else None)  # before the model: the child starts early
        self.compile_cache, self.warmup_count = self.session.cache_state, self.session.warmup_count
        self.startup.mark("compile_cache")
        self.model = build_model(cfg, self.device, info.world_size, self.dtype)
        self.startup.mark("model")
        from speedrun.train import grad_accum

        # the micro-steps' gradients add up in place in buffers kept for the run (grad_accum.py), the
        # tables the model only looks up row by row; the block matrices are cast once a step
        tables = [n for n in self.model.lookup_table_names() if n]
        self.grad_sums = grad_accum.GradBuffers(self.model, self.model.unused_parameter_names(), tables)
        self.step_casts = grad_accum.StepCasts(self.model, self.model.cast_only_names(), self.dtype)
        self.head_q = None
        self.step_model = self.session.compile(lambda: grad_accum.compile_step_model(self.model, self.compiled))
        self.optimizers = build_optimizers(self.model, cfg.optim, cfg.train.kernels)
        train_files, self.val_file = resolve_data(cfg)
        # an id past the embedding would stop the first step with an IndexError deep in the model
        check_vocab(train_files + ([self.val_file] if self.val_file else []), cfg.model.vocab_size)
        from speedrun.data.loader import TrainLoader

        self.loader = TrainLoader(train_files, cfg.train.seq_len, cfg.train.batch_seqs, info.rank,
                                  info.world_size, self.device, bos_align=cfg.train.bos_align)

    def describe(self) -> dict:
        return {
            "parameters": count_parameters(self.model), "world_size": self.info.world_size,
            "micro_steps": self.micro_steps, "dtype": str(self.dtype).replace("torch.", ""),
            "attention_backend": self.model.attention_backend, "fp8_head": self.model.use_fp8,
            "compile": self.compiled, "device": str(self.device),
            "embed_rows": any(r is not None for r in self.grad_sums.scratch),
        }

    def _write_run_header(self) -> None:
        if not self.out:
            return
        from speedrun.run.env import environment

        env = environment()
        from speedrun.compile.cache import source_hash

        env["git_commit"], env["git_dirty"] = git_commit(), git_dirty()
        env["source_sha256"] = source_hash()  # identifies the code even without git (a copied tree)
        env["run"] = self.describe()
        self.out.write_json("config.json", self.cfg.to_dict())
        self.out.write_json(env_file_name(self.out.path, self.guard.resume_dir is not None), env)

    # -------------------------------------------------------------- what the loop asks of a record

    @property
    def total_steps(self) -> int:
        return self.cfg.train.steps

    def validates(self, step: int) -> bool:
        """Whether the loop validates before step `step` (always at the end)."""
        every = self.cfg.train.val_every
        return step == self.total_steps or bool(every and step % every == 0)

    @property
    def val_enabled(self) -> bool:
        return bool(self.cfg.train.val_tokens)

    def tokens_at(self, step: int) -> int:
        """Training tokens of all ranks before step `step`."""
        return step * self.tokens_per_step

    def base_lrs(self) -> dict[str, float]:
        """The learning rates at multiplier 1, by group, for the log."""
        o = self.cfg.optim
        return {"muon": o.muon_lr, "adam_embed": o.embed_lr} if o.kind != "adamw" else {"adamw": o.adamw_lr}

    def extra_state(self) -> dict:
        """What a checkpoint keeps of this trainer besides model, optimisers, loader and RNG."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    # -------------------------------------------------------------- schedules

    def window(self, step: int) -> torch.Tensor:
        blocks = schedules.window_blocks(step / self.cfg.train.steps, self.cfg.attention)
        if blocks not in self._windows:
            self._windows[blocks] = torch.full((), blocks, dtype=torch.int32, device=self.device)
        return self._windows[blocks]

    def set_schedules(self, step: int) -> None:
        progress = step / self.cfg.train.steps
        mult = schedules.lr_multiplier(progress, self.cfg.schedule)
        self.lr_mult = mult * self.guard.lr_factor  # every group's lr over its initial lr, for the log
        o = self.cfg.optim
        momentum = schedules.muon_momentum(progress, self.cfg.schedule, o.muon_momentum_start, o.muon_momentum)
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * mult * self.guard.lr_factor
                if "momentum" in group:
                    group["momentum"] = momentum

    # -------------------------------------------------------------- steps

    def train_step(self, step: int) -> torch.Tensor:
        """One optimiser step over this rank's micro-steps; returns its mean loss (device)."""
        self.set_schedules(step)
        window = self.window(step)
        total = torch.zeros((), device=self.device)
        batches = self.guard.next_batches()  # skips batches marked bad after a recovery
        self.step_casts.refresh()  # the parameters as the optimiser (or a recovery) left them
        self.head_q = self.model.head_operands()  # the FP8 head's weight operands, once a step
        self.grad_sums.start()
        with self.guard.health.watch(step):  # activation hooks, on health steps only
            for inputs, targets in batches:
                loss = self.guard.loss(self.forward(inputs, targets, window))
                (loss / len(batches)).backward()
                total += loss.detach()
            self.grad_sums.finish()
        self.guard.before_update(step)
        self.grad_norm = grad_norm(self.model) if self._log_step(step) else None
        for opt in self.optimizers:
            opt.step()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        # the mean over the global batch (every rank's micro-steps): what the log, the spike detector
        # and every rank's fault policy see; an all-reduce on the device, no host synchronisation
        mean = all_reduce_mean(total / (len(batches) * self.cfg.train.seq_len))
        self.guard.after_update(step, mean)
        return mean

    def _log_step(self, step: int) -> bool:
        every = self.cfg.train.log_every
        return bool(every and step % every == 0)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
        """A training micro-step's loss; its backward adds the gradients into the step's sums
        (grad_accum.py)."""
        extra = {} if self.head_q is None else {"head_q": self.head_q}
        scratch = self.grad_sums.scratch  # the tables the model looks up row by row (embed_rows)
        if any(r is not None for r in scratch):
            extra["scratch"] = scratch
        return self.step_model(inputs, targets, window, self.dtype, self.grad_sums.buffers,
                               self.step_casts.aligned(), **extra)

    @torch.no_grad()
    def evaluate(self, step: int) -> float:
        from speedrun.data.loader import val_batches

        t = self.cfg.train
        self.model.eval()
        window = self.window(step)
        total, n = torch.zeros((), device=self.device), 0
        for inputs, targets in val_batches(self.val_file, t.val_tokens, t.val_seq_len, self.info.rank,
                                           self.info.world_size, self.device):
            total += self.step_model(inputs, targets, window, self.dtype).float()
            n += 1
        self.model.train()
        return all_reduce_mean(total / max(n, 1)).item()

    def warm_up(self) -> None:
        """Compile and warm kernels, then restore model, optimisers and data."""
        n = self.warmup_count
        if n == 0:
            return
        model_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        loader_state = self.loader.state_dict()
        for step in range(n):
            self.train_step(step * self.cfg.train.steps // max(n, 1))
            self.startup.mark("first_step" if step == 0 else "warmup_steps")  # the first one compiles
        self.model.load_state_dict(model_state)
        self.optimizers = build_optimizers(self.model, self.cfg.optim, self.cfg.train.kernels)
        self.loader.load_state_dict(loader_state)
        self.startup.mark("restore")

    def _begin_timed_run(self) -> float:
        """Just before the first timed step: end the cold start and return it (seconds)."""
        self.session.timed_start(self.startup, self.out.path if self.out else None)
        self.startup.mark("to_first_step")  # since the last mark: the step's checks before it
        self._cold = False
        self._graphs_at_start = compiled_graphs()
        if self.info.is_main:
            print(f"speedrun: cold start {self.startup.describe()}", flush=True)
        for watcher in self.watchers:
            watcher.timed_start()
        return self.startup.total()

    # -------------------------------------------------------------- loop

    def _log(self, record: dict) -> None:
        if self.out:
            self.out.log(record)
            if self.tb is not None:
                self.tb.log(record)

    def _flush_losses(self, pending: PendingLosses) -> None:
        base = self.base_lrs()
        for step, loss, gnorm, ms, mult in pending.flush():
            self._log({"step": step, "train_loss": loss, "grad_norm": gnorm, "lr_mult": mult,
                       "lr": {k: v * mult for k, v in base.items()}, "train_time_ms": ms,
                       "tokens": self.tokens_at(step)})
            self.last_train_loss = loss

    def _validate(self, step: int, clock: Clock, pending: PendingLosses, bar) -> float | None:
        clock.stop()
        self._flush_losses(pending)
        if not self.val_enabled:
            return None
        self.phase = "validation"
        self.session.before_validation(self.startup)
        graphs = compiled_graphs()
        loss = self.evaluate(step)
        self.session.after_validation()
        if self._cold:
            self.startup.mark("first_validation")  # compiles the evaluation graph (a cache hit after precompile)
        else:  # a graph compiled here is outside the clock: not a recompile of the timed run
            self._graphs_in_validation += compiled_graphs() - graphs
        self.phase = "training"
        ms = clock.elapsed * 1000
        self._log({"step": step, "val_loss": loss, "train_time_ms": ms, "tokens": self.tokens_at(step)})
        if self.info.is_main:
            msg = f"step {step}/{self.total_steps}  val_loss {loss:.4f}  train_time {ms / 1000:.1f}s"
            (bar.write if bar else print)(msg)
        return loss

    def headline(self) -> str:
        d = self.describe()
        return (f"speedrun: {self.cfg.name}: {d['parameters']:,} parameters, {self.info.world_size} rank(s) x "
                f"{self.micro_steps} micro-step(s), {d['dtype']}, attention={d['attention_backend']}, "
                f"fp8_head={d['fp8_head']}, compile={d['compile']}")

    def run(self) -> dict:
        self._write_run_header()
        if self.info.is_main:
            print(self.headline(), flush=True)
        self.warm_up()
        self.guard.start()  # resuming: restore the checkpoint (after warm-up, which resets state)
        self.startup.mark("resume" if self.guard.resume_dir is not None else "start")
        self.phase = "training"
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        clock, pending, val_loss = Clock(self.device, self.guard.train_time_s), PendingLosses(), None
        from tqdm import tqdm

        bar = tqdm(total=self.total_steps, initial=self.guard.start_step, disable=not self.progress, unit="step",
                   dynamic_ncols=True)
        try:
            val_loss, cold_start = self._loop(clock, pending, bar)
        finally:  # a closed bar ends its line, so an error message starts on a line of its own
            bar.close()
        return self._finish(val_loss, clock, cold_start)

    def _loop(self, clock: Clock, pending: PendingLosses, bar) -> tuple[float | None, float]:
        val_loss, total = None, self.total_steps
        cold_start = None  # process start -> first timed step, the first validation included
        for step in self.guard.steps(total):
            last = step == total
            if self.guard.boundary(step, clock, pending, last):
                continue  # rolled back to the last good checkpoint; the loop goes on from there
            if self.validates(step):
                val_loss = self._validate(step, clock, pending, bar)
            if last:
                break
            if cold_start is None:
                cold_start = self._begin_timed_run()
            if not clock.running:
                clock.start()
            loss = self.train_step(step)
            if self._log_step(step):
                pending.add(step + 1, loss, self.grad_norm, clock.approx_ms(), self.lr_mult)
            self._show_progress(bar, step + 1, loss, clock)
        clock.stop()
        if cold_start is None:  # no step left to time (a resume at the end)
            cold_start = self._begin_timed_run()
        return val_loss, cold_start

    def _show_progress(self, bar, done: int, loss: torch.Tensor, clock: Clock) -> None:
        """The bar's loss and tokens per second. On a GPU the loss shown is the last one the log has
        already read (reading each step's would make every step wait for the device)."""
        bar.update(1)
        if bar.disable:
            return
        if self.device.type == "cpu":
            self.last_train_loss = loss.item()
        secs = clock.approx_ms() / 1000
        tokens = self.tokens_at(done) - self.tokens_at(self.guard.start_step)
        info = {"tok/s": f"{tokens / secs:,.0f}" if secs > 0 else "-"}
        if self.last_train_loss is not None:
            info = {"loss": f"{self.last_train_loss:.4f}", **info}
        bar.set_postfix(info, refresh=False)

    def _finish(self, val_loss: float | None, clock: Clock, cold_start: float) -> dict:
        steps = self.total_steps
        self.guard.close()  # the last checkpoint write, if one is in flight
        self.session.save_packages()  # graphs compiled since the first timed step (a late first validation)
        cuda = self.device.type == "cuda"
        peak = torch.cuda.max_memory_allocated(self.device) if cuda else None
        # reserved: the allocator's peak hold, its cached free blocks included (what the card must have)
        reserved = torch.cuda.max_memory_reserved(self.device) if cuda else None
        summary = {
            "preset": self.cfg.name, "steps": steps, "final_val_loss": val_loss,
            "train_time_ms": clock.elapsed * 1000, "ms_per_step": clock.elapsed * 1000 / steps,
            "peak_memory_bytes": peak, "peak_reserved_bytes": reserved, "cold_start_s": cold_start,
            "cold_start_phases_s": self.startup.as_dict(),
            "graphs_compiled_in_timed_run": compiled_graphs() - self._graphs_at_start - self._graphs_in_validation,
            "tokens": self.tokens_at(steps), "gpu_clocks": None, **self.describe(),
        }
        for watcher in self.watchers:
            watcher.finish(summary)
        if self.out:
            from speedrun.run.checkpoint import save_model_files

            save_model_files(self.model, self.cfg, self.out.path)
            self.out.write_json("summary.json", summary)
            self.out.close()
            if not self.keep_checkpoints:  # the final model supersedes them; only a resume needs them
                from speedrun.run.checkpoint import remove_checkpoints

                remove_checkpoints(self.out.path)
            if summary["graphs_compiled_in_timed_run"]:
                print(f"speedrun: warning: {summary['graphs_compiled_in_timed_run']} graph(s) were compiled after "
                      "warm-up, inside the timed run (TORCH_LOGS=recompiles says why)", flush=True)
            shown = "none (no validation)" if val_loss is None else f"{val_loss:.4f}"
            print(f"speedrun: final val_loss {shown}, training time {clock.elapsed:.1f}s "
                  f"({summary['ms_per_step']:.1f} ms/step), cold start {cold_start:.1f}s -> {self.out.path}")
        if self.cfg.train.sample_tokens and self.info.is_main:
            self._print_sample()
        return summary

    def _print_sample(self) -> None:
        from speedrun.tools.sample import generate_text

        text = generate_text(self.model, "It was a dark and stormy night", self.cfg.train.sample_tokens,
                             window_blocks=int(self.window(self.cfg.train.steps)), dtype=self.dtype)
        print(f"sample: {text}")
