"""Fault injection (for tests only) and the errors a faulty run ends with.

`train.inject_fault` is a comma-separated list of KIND@BATCH, BATCH being the
index of a data batch in the order the loader serves them (= the step, until
a recovery skips batches). A fault is tied to the *batch*, like real bad data,
so a recovery that skips the batch gets past it; `KIND@BATCH+` fires on that
batch and every later one (a fault that keeps coming back). Kinds:

    nan       the batch's loss (and so its gradients) become NaN
    grad_inf  one gradient is multiplied by inf after backward (an overflow)
    spike     the batch's loss is multiplied by SPIKE (gradients scale alike)
    oom       the step raises torch.cuda.OutOfMemoryError
    sigterm / sigint   the process signals itself before the step

It is a config field rather than an environment variable so that it is
visible in config.json and usable through `--set`; it may change on resume.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

import torch

from speedrun.config import RunConfig
from speedrun.errors import ConfigError, SpeedrunError

KINDS = ("nan", "grad_inf", "spike", "oom", "sigterm", "sigint")
SPIKE = 50.0


class TrainingFault(SpeedrunError):
    """The run met a non-finite loss/gradient or a spike and stopped (policy, or too many recoveries)."""

    exit_code = 3


class Interrupted(SpeedrunError):
    """SIGTERM/SIGINT: a checkpoint was written; exit 128 + signal number."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class OutOfMemory(SpeedrunError):
    exit_code = 4


@dataclass(frozen=True)
class Injection:
    kind: str
    batch: int
    onwards: bool

    def hits(self, batch: int) -> bool:
        return batch == self.batch or (self.onwards and batch > self.batch)


def parse_faults(spec: str) -> list[Injection]:
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        kind, _, where = item.partition("@")
        onwards = where.endswith("+")
        try:
            batch = int(where.rstrip("+"))
        except ValueError:
            batch = -1
        if kind not in KINDS or batch < 0:
            raise ConfigError(f"train.inject_fault: {item!r} is not KIND@BATCH[+] with KIND in {', '.join(KINDS)}")
        out.append(Injection(kind, batch, onwards))
    return out


class FaultInjector:
    """Applies `train.inject_fault` to the step that draws a given batch."""

    def __init__(self, spec: str):
        self.faults = parse_faults(spec)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def _hit(self, kind: str, batch: int) -> bool:
        return any(f.kind == kind and f.hits(batch) for f in self.faults)

    def before_step(self, batch: int) -> None:
        if self._hit("oom", batch):
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (injected at batch {batch})")
        for kind, sig in (("sigterm", signal.SIGTERM), ("sigint", signal.SIGINT)):
            if self._hit(kind, batch):
                signal.raise_signal(sig)

    def loss(self, batch: int, loss: torch.Tensor) -> torch.Tensor:
        if self._hit("nan", batch):
            return loss * float("nan")
        if self._hit("spike", batch):
            return loss * SPIKE
        return loss

    @torch.no_grad()
    def grads(self, batch: int, model: torch.nn.Module) -> None:
        if self._hit("grad_inf", batch):
            p = next(p for p in model.parameters() if p.grad is not None)
            p.grad.mul_(float("inf"))


def out_of_memory(cfg: RunConfig, world_size: int, phase: str) -> OutOfMemory:
    """The one-line error for a CUDA out-of-memory, naming what lowers memory."""
    t, block = cfg.train, cfg.attention.block_size
    tips = []
    half = t.seq_len // 2 // block * block
    if half >= block:
        tips.append(f"--set train.seq_len={half} (tokens per micro-step, now {t.seq_len})")
    val_half = t.val_seq_len // 2 // block * block
    if val_half >= block and t.val_tokens:
        tip = f"--set train.val_seq_len={val_half} (validation tokens per forward, now {t.val_seq_len})"
        tips.insert(0 if phase == "validation" else len(tips), tip)
    more = [w for w in (2, 4, 8) if w > world_size and t.batch_seqs % w == 0]
    if more:
        tips.append(f"more GPUs (torchrun --nproc_per_node={more[-1]}: optimiser state is sharded over them)")
    if cfg.train.compile == "off":
        tips.append("--set train.compile=auto (compiled kernels hold fewer activations)")
    if not tips:
        tips.append("a smaller model (--set model.model_dim=..., model.num_layers=...)")
    return OutOfMemory(f"CUDA out of memory during {phase} ({world_size} GPU(s)); lower memory with "
                       + "; or ".join(tips))
