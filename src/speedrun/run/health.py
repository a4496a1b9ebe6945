"""Training health: what is measured, and how a bad step is recognised.

Why it is built this way:
- No host synchronisation on ordinary steps. Every step only appends its
  (device) loss to a list; the values are read, in one transfer, at *check
  points* (health steps, validation, checkpoints, the end), which synchronise
  anyway. A checkpoint is always preceded by a check, so a bad state is never
  committed.
- Every `health_every` steps one step is a *health step*: forward hooks on the
  blocks record each layer's output RMS (hooks exist only during that step;
  under torch.compile this is a second cached graph, built during warm-up),
  the gradient norm is taken before the optimisers step and the update norm
  as the norm of the parameter change (one parameter copy, on health steps
  only), then the weight norms per optimiser group. With W > 1 the gradient
  norm is this rank's *local* gradient (the optimisers average gradients
  inside step()); losses are averaged over ranks at the check point, so every
  rank takes the same decision.
- Spikes: a loss above `spike_factor` x the median of the last `WINDOW` good
  losses (once `MIN_HISTORY` are known). The median ignores the odd noisy
  step; the history is part of the checkpoint so a resumed run judges alike.
"""

from __future__ import annotations

import math
import statistics
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

WINDOW = 16
MIN_HISTORY = 4


@dataclass
class Fault:
    """A bad step found at a check point."""

    step: int  # the training step (0-based) that showed it
    reason: str
    batches: list[int]  # data batches to skip when recovering
    value: float | None = None


class LossJudge:
    """Non-finite and spike detection on host loss values, in step order."""

    def __init__(self, spike_factor: float):
        self.spike_factor = spike_factor
        self.history: list[float] = []

    def judge(self, step: int, batch: int, loss: float) -> Fault | None:
        if not math.isfinite(loss):
            # a non-finite gradient at the previous step shows up as this loss: skip both batches
            return Fault(step, f"training loss is {loss} at step {step}", [batch - 1, batch], loss)
        if self.spike_factor and len(self.history) >= MIN_HISTORY:
            ref = statistics.median(self.history)
            if loss > self.spike_factor * ref:
                return Fault(step, f"loss spike at step {step}: {loss:.4g} > {self.spike_factor:g} x median "
                                   f"{ref:.4g} of the last {len(self.history)} losses", [batch], loss)
        self.history = (self.history + [loss])[-WINDOW:]
        return None


def _norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Per-tensor L2 norms in float32 (one foreach kernel per dtype)."""
    if not tensors:
        return torch.zeros(0)
    return torch.stack([n.float() for n in torch._foreach_norm(tensors)])


class HealthMonitor:
    """Health-step measurements kept on the device until the next check point."""

    def __init__(self, model: nn.Module, every: int):
        from speedrun.optim.groups import split_parameters

        self.model, self.every = model, every
        self.groups = {k: v for k, v in split_parameters(model).items() if v}
        self.params = [p for ps in self.groups.values() for p in ps]
        self.force = False  # warm-up: compile the hooked graph before the clock starts
        self._before: list[torch.Tensor] | None = None
        self._grad: torch.Tensor | None = None
        self.pending: dict | None = None  # {"step": s, "values": device vector}
        self.on = False
        self._install_hooks()

    def is_health_step(self, step: int) -> bool:
        return self.force or bool(self.every and (step + 1) % self.every == 0)

    def _install_hooks(self) -> None:
        """Permanent forward hooks that record only while `self.on`: registered before the
        first forward, they are part of what torch.compile traces (hooks added later are
        not seen by a compiled module), and the flag makes health steps a second cached
        graph. They add into one device tensor (last slot: forward count), never into
        Python lists, so nothing in the trace depends on how many micro-steps ran."""
        blocks = list(getattr(self.model, "blocks", []))
        device = next(self.model.parameters()).device
        self._acc = torch.zeros(len(blocks) + 1, device=device)
        for i, block in enumerate(blocks):
            block.register_forward_hook(self._hook(i))

    @contextmanager
    def watch(self, step: int):
        """Record activation RMS during this step if it is a health step."""
        self.on = self.is_health_step(step)
        if self.on:
            self._acc.zero_()
        try:
            yield
        finally:
            self.on = False

    def _hook(self, i: int):
        def hook(module, args, out):
            if self.on:
                self._acc[i] += out.detach().float().square().mean().sqrt()
                if i == 0:
                    self._acc[-1] += 1
        return hook

    @torch.no_grad()
    def before_update(self, step: int) -> None:
        if not self.is_health_step(step):
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        self._grad = _norms(grads).square().sum().sqrt() if grads else torch.zeros(())
        self._before = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def after_update(self, step: int, loss: torch.Tensor) -> None:
        if not self.is_health_step(step) or self._before is None:
            return
        delta = torch._foreach_sub(self._before, [p.detach() for p in self.params])
        update = _norms(delta).square().sum().sqrt()
        weights = [_norms([p.detach() for p in ps]).square().sum().sqrt() for ps in self.groups.values()]
        acts = self._acc[:-1] / self._acc[-1]  # mean over micro-steps (NaN if no forward ran)
        dev = loss.device
        parts = [loss.float().reshape(1), self._grad.to(dev).reshape(1), update.to(dev).reshape(1),
                 torch.stack(weights).to(dev), acts.to(dev)]
        self.pending = {"step": step, "values": torch.cat(parts)}
        self._before, self._grad = None, None

    def take(self) -> dict | None:
        """The last health step's measurements as a metrics record (host sync), or None."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        v = pending["values"].tolist()
        names = list(self.groups)
        weights = dict(zip(names, v[3:3 + len(names)]))
        weights["total"] = math.sqrt(sum(w * w for w in weights.values()))
        return {"step": pending["step"] + 1, "health": {
            "loss": v[0], "grad_norm": v[1], "update_norm": v[2], "weight_norm": weights,
            "act_rms": v[3 + len(names):]}}

    def discard(self) -> None:
        self.pending, self._before, self._grad = None, None, None


def weights_finite(params: list[torch.Tensor]) -> torch.Tensor:
    """Device bool: every weight finite (one pass; used before committing a checkpoint)."""
    return _norms([p.detach() for p in params]).sum().isfinite()
