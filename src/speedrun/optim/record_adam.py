"""The 2026-07 record's Adam: per-parameter β and multipliers, cautious lr² decay, odd steps, tied head.

Spec: record-2026-07.md, "Optimisation" ("Adam (every other parameter)" and
"Embed / head tying"), and "Systems notes" for the sharding. One update of a
parameter P with the gradient g summed over the steps 2k and 2k+1:

    m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²               fp32, t += 1
    lr = base·s(step)·lr_mul
    u = lr·√(1−β2^t)/(1−β1^t) · m/(√v + eps)
    u ← u + lr²·weight_decay·wd_mul·P   where u·P > 0 (strict)
    P ← P − u                                                  in P's dtype

Why it is built this way:

* Every parameter is its own param group carrying its own β, lr_mul and
  wd_mul (the table RECORD_ADAM_TABLE, by the spec's parameter names). The
  caller writes group["lr"] = base·s(step) into every group each step, as
  for NorMuon; lr_mul is applied here, so the lr² of the decay is the
  parameter's own lr, multiplier included.
* Adam runs on odd steps only, so `step()` takes the step number. At an even
  step it moves each gradient into the state entry "pending_grad" (the
  rank's own, unreduced gradient, in the parameter's dtype) and clears
  .grad; at the odd step the new gradient is added to it in that dtype and
  the sum is what is reduced and applied. Keeping the sum in the state
  rather than in .grad makes a checkpoint taken after an even step resume
  exactly, and makes the step independent of whether the loop clears
  gradients. Only the odd step communicates, as in the record.
* The tie: while tied, embed (V, d) has no state and is never stepped on
  its own. At each odd step embed's summed gradient, transposed, is added
  to lm_head's (d, V) summed gradient in bf16 before the reduction, lm_head
  is updated, and embed is overwritten with lm_headᵀ. At the split step,
  after that tied update, `untie()` gives embed lm_head's moments transposed
  and lm_head's step count. The flag is saved in the state_dict.
* Distributed, a parameter whose dim 0 divides by the world size is
  reduce-scattered along dim 0 and rank r keeps only its rows' moments and
  updates only those rows, then all-gathers (as DistAdam); any other
  parameter is all-reduced and updated whole on every rank. The update is
  element-wise, so any world size gives the one-process result on the
  averaged gradient. `untie()` all-gathers lm_head's moment rows and gives
  each rank its own rows of the transpose.
* A parameter with neither a gradient nor a pending sum is skipped (every
  rank must agree on that, as with NorMuon).
* The update is about nineteen eager passes over a tensor; `kernel` ("auto"
  from `train.kernels`) runs the same arithmetic as one Triton pass per
  tensor on CUDA (optim/kernels.py), held to the eager form by tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import torch
from torch import Tensor

from speedrun.optim.kernels import IMPLS, pick_impl, record_adam_fits, record_adam_kernel_step
from speedrun.optim.muon import Collectives, Pending, done
from speedrun.optim.saved_state import restore_as_saved

MOMENT_KEYS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class AdamParamHyper:
    """One row of the spec's Adam table: the moments' decays and the parameter's multipliers."""

    beta1: float
    beta2: float
    lr_mul: float
    wd_mul: float


# The spec's table ("Optimisation / Adam (every other parameter)"), by the spec's parameter names.
RECORD_ADAM_TABLE: tuple[tuple[str, AdamParamHyper], ...] = (
    ("scalars", AdamParamHyper(0.9, 0.99, 5.0, 0.0)),
    ("smear_gate", AdamParamHyper(0.9, 0.99, 0.01, 0.0)),
    ("ve_gate_bank", AdamParamHyper(0.9, 0.99, 1.0, 1.0)),
    ("lm_head", AdamParamHyper(0.5, 0.95, 1.0, 150.0)),
    ("embed", AdamParamHyper(0.5, 0.95, 1.0, 150.0)),
    ("bigram_embed", AdamParamHyper(0.75, 0.95, 75.0, 5.0)),
    ("value_embeds", AdamParamHyper(0.75, 0.95, 75.0, 5.0)),
    ("post_lambdas", AdamParamHyper(0.9, 0.95, 1.0, 0.0)),
    ("resid_lambdas", AdamParamHyper(0.9, 0.95, 5.0, 0.0)),
    ("mudd_w1", AdamParamHyper(0.9, 0.99, 0.25, 1.0)),
    ("mudd_w2", AdamParamHyper(0.9, 0.99, 0.25, 1.0)),
    ("mudd_b2", AdamParamHyper(0.9, 0.99, 0.25, 0.0)),
    ("mudd_gate_w1", AdamParamHyper(0.9, 0.99, 0.1, 1.0)),
    ("mudd_gate_w2", AdamParamHyper(0.9, 0.99, 0.1, 1.0)),
    ("mudd_gate_b2", AdamParamHyper(0.9, 0.99, 0.1, 0.0)),
    ("mudd_gate_scale", AdamParamHyper(0.9, 0.99, 0.1, 0.0)),
)


@dataclass(frozen=True)
class RecordAdamConfig:
    """The record's Adam constants (spec: "Optimisation / Adam (every other parameter)").

    lr is the base rate (a step's rate is lr·s(step)·lr_mul); weight_decay
    multiplies lr² and the parameter's wd_mul in the cautious decay; table
    holds each parameter's (β1, β2, lr_mul, wd_mul) by name.
    """

    lr: float = 0.008
    eps: float = 1e-10
    weight_decay: float = 0.005
    table: tuple[tuple[str, AdamParamHyper], ...] = RECORD_ADAM_TABLE

    def hyper(self, name: str) -> AdamParamHyper:
        for key, row in self.table:
            if key == name:
                return row
        raise KeyError(f"no Adam hyperparameters for parameter {name!r}")


# ---------------------------------------------------------------------------
# The update of one tensor (a parameter or this rank's rows of it).
# ---------------------------------------------------------------------------

def update_moments(exp_avg: Tensor, exp_avg_sq: Tensor, grad: Tensor, beta1: float, beta2: float) -> None:
    """m ← β1·m + (1−β1)·g and v ← β2·v + (1−β2)·g², in place in fp32 (a bf16 g is read exactly)."""
    g = grad.to(exp_avg.dtype)
    exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)


def step_size(lr: float, beta1: float, beta2: float, t: int) -> float:
    """lr·√(1−β2^t)/(1−β1^t): both bias corrections folded into one scalar."""
    return lr * (1 - beta2**t) ** 0.5 / (1 - beta1**t)


def cautious_decay(update: Tensor, param: Tensor, decay: float) -> Tensor:
    """u + decay·P where u·P > 0: a strict mask, so a zero update (or a zero weight) is never decayed."""
    p = param.to(update.dtype)
    return update + decay * p * ((update * p) > 0)


def adam_update(param: Tensor, grad: Tensor, state: dict, *, lr: float, beta1: float, beta2: float,
                eps: float, weight_decay: float, wd_mul: float, impl: str = "torch") -> None:
    """One step on `param` in place: moments in fp32, the update in fp32, P − u rounded once to P's dtype.

    state: "step" (int, counted here), "exp_avg", "exp_avg_sq" (fp32, param's shape).
    lr is the parameter's own rate (lr_mul included); the decay is lr²·weight_decay·wd_mul.
    impl: "torch" (the eager operations below, the reference) | "triton" | "auto" (the same
    arithmetic in one kernel pass, optim/kernels.py, on CUDA tensors that fit it).
    """
    state["step"] += 1
    m, v = state["exp_avg"], state["exp_avg_sq"]
    size, decay = step_size(lr, beta1, beta2, state["step"]), lr * lr * weight_decay * wd_mul
    if pick_impl(param, impl) == "triton" and record_adam_fits(param, grad, m, v):
        record_adam_kernel_step(param, grad, m, v, beta1=beta1, beta2=beta2, eps=eps, step_size=size, decay=decay)
        return
    update_moments(m, v, grad, beta1, beta2)
    u = cautious_decay(m / (v.sqrt() + eps) * size, param, decay)
    param.copy_(param.to(u.dtype) - u)


def new_state(like: Tensor) -> dict:
    """Zero moments (fp32) of `like`'s shape and a step count of 0."""
    zeros = dict(dtype=torch.float32, device=like.device)
    return {"step": 0, "exp_avg": torch.zeros(like.shape, **zeros), "exp_avg_sq": torch.zeros(like.shape, **zeros)}


# ---------------------------------------------------------------------------
# The optimiser.
# ---------------------------------------------------------------------------

class RecordAdam(torch.optim.Optimizer):
    """The record's Adam over the non-matrix parameters, odd steps only, lm_head/embed tied until the split.

    Args:
        params: param groups, each with "betas", "lr_mul" and "wd_mul" (and
            optionally "name"); `record_adam_groups` builds the record's.
        lr: the base rate times s(step) (the caller rewrites group["lr"]
            each step; group["initial_lr"] keeps the first value).
        eps, weight_decay: 1e-10 and 0.005 in the record.
        embed, lm_head: the tied pair ((V, d) and (d, V)), both in params;
            None for no tie.
        split_step: the odd step after whose update the pair unties (the
            stage-3 start | 1; `speedrun.train.stages.split_step`); None: never.
        process_group: the group to shard over (None: the default group, if
            initialised). Construct the optimiser after init_process_group.
        kernel: "torch" | "triton" | "auto": the update as eager operations or
            one kernel pass per tensor (`adam_update`; "auto": the kernel on CUDA).

    Call `step(step=n)` at every training step n. The gradients are consumed
    (set to None) at every step: an even step keeps them in the state.
    """

    def __init__(self, params, lr: float = 0.008, eps: float = 1e-10, weight_decay: float = 0.005, *,
                 embed: Tensor | None = None, lm_head: Tensor | None = None, split_step: int | None = None,
                 process_group=None, kernel: str = "torch"):
        if kernel not in IMPLS:
            raise ValueError(f"RecordAdam kernel must be one of {IMPLS}, got {kernel!r}")
        self.kernel = kernel
        self.comm = Collectives(process_group)
        defaults = dict(lr=lr, eps=eps, weight_decay=weight_decay, betas=None, lr_mul=None, wd_mul=None)
        super().__init__(params, defaults)
        self.embed, self.lm_head, self.split_step = embed, lm_head, split_step
        self.tied = embed is not None
        self._check_tie()

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        group.setdefault("initial_lr", group["lr"])
        missing = [key for key in ("betas", "lr_mul", "wd_mul") if group[key] is None]
        if missing:  # no silent default: each parameter's row of the table is explicit
            raise ValueError(f"a RecordAdam group lacks {missing} (see record_adam_groups)")

    def _check_tie(self) -> None:
        if (self.embed is None) != (self.lm_head is None):
            raise ValueError("the tie needs both embed and lm_head")
        if self.split_step is not None and self.split_step % 2 == 0:
            raise ValueError(f"the split step must be an odd (Adam) step, got {self.split_step}")
        if self.embed is None:
            return
        if self.embed.shape != self.lm_head.shape[::-1] or self.embed.ndim != 2:
            raise ValueError(f"embed {tuple(self.embed.shape)} is not lm_head {tuple(self.lm_head.shape)} transposed")
        ours = {id(p) for g in self.param_groups for p in g["params"]}
        if id(self.embed) not in ours or id(self.lm_head) not in ours:
            raise ValueError("embed and lm_head must be parameters of this optimiser")

    # --- gradients: the even step's pending sum -----------------------------

    def _stash(self, p: Tensor) -> None:
        """An even step: add p.grad to the pending sum in p's dtype, and clear it."""
        if p.grad is None:
            return
        pending = self.state[p].get("pending_grad")
        grad = p.grad.detach()
        self.state[p]["pending_grad"] = grad.clone() if pending is None else pending.add_(grad)
        p.grad = None

    def _take(self, p: Tensor) -> Tensor | None:
        """An odd step: the pending sum plus p.grad (in p's dtype), both cleared; None if neither exists."""
        pending = self.state[p].pop("pending_grad", None)
        grad = None if p.grad is None else p.grad.detach()
        p.grad = None
        if pending is None or grad is None:
            return grad if pending is None else pending
        return pending.add_(grad)

    @torch.no_grad()
    def restore_pending_grads(self) -> None:
        """Move every pending sum back into .grad (before the odd step's backward), so that autograd adds
        the micro-steps onto it one by one, as the record's surviving gradients do."""
        for group in self.param_groups:
            for p in group["params"]:
                pending = self.state[p].pop("pending_grad", None)
                if pending is not None:
                    p.grad = pending if p.grad is None else pending.add_(p.grad)

    # --- sharding ------------------------------------------------------------

    def _sharded(self, p: Tensor) -> bool:
        return self.comm.active and p.ndim > 0 and p.shape[0] % self.comm.world_size == 0

    def _mine(self, t: Tensor) -> Tensor:
        """This rank's rows of t, a parameter or a tensor of its shape (all of t unless it is sharded)."""
        if not self._sharded(t):
            return t
        k = t.shape[0] // self.comm.world_size
        return t[self.comm.rank * k:(self.comm.rank + 1) * k]

    def _reduce(self, p: Tensor, grad: Tensor) -> Pending:
        """Issue the averaging of grad over ranks: this rank's rows if p is sharded, else all of it."""
        if not self.comm.active:
            return done(grad)
        if self._sharded(p):
            return self.comm.reduce_scatter_avg(grad.contiguous())
        return self.comm.all_reduce_avg(grad)

    def _update(self, group: dict, p: Tensor, reduced: Pending) -> Pending | None:
        """Wait for p's averaged gradient rows, update them, start the all-gather."""
        full = p.detach()
        mine = self._mine(full)
        if "exp_avg" not in self.state[p]:
            self.state[p].update(new_state(mine))
        beta1, beta2 = group["betas"]
        adam_update(mine, reduced.wait(), self.state[p], lr=group["lr"] * group["lr_mul"], beta1=beta1,
                    beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"], wd_mul=group["wd_mul"],
                    impl=self.kernel)
        return self.comm.all_gather(full, mine) if self._sharded(p) else None

    # --- the step --------------------------------------------------------------

    def _odd_grads(self) -> list[tuple[dict, Tensor, Tensor]]:
        """(group, param, summed local gradient) of every parameter to update; embed's folded into lm_head's."""
        work = [(group, p, self._take(p)) for group in self.param_groups for p in group["params"]]
        if not self.tied:
            return [(group, p, g) for group, p, g in work if g is not None]
        grads = {id(p): g for _, p, g in work}
        g_embed, g_head = grads[id(self.embed)], grads[id(self.lm_head)]
        if g_embed is not None:
            grads[id(self.lm_head)] = g_embed.t().contiguous() if g_head is None else g_head.add_(g_embed.t())
        return [(group, p, grads[id(p)]) for group, p, _ in work
                if p is not self.embed and grads[id(p)] is not None]

    @torch.no_grad()
    def step(self, closure=None, *, step: int):
        """Training step `step`: even, keep the gradients; odd, update (and at the split step, untie)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for group in self.param_groups for p in group["params"]]
        if step % 2 == 0:
            for p in params:
                self._stash(p)
            return loss
        work = self._odd_grads()
        reduced = [self._reduce(p, g) for _, p, g in work]  # every reduction in flight before the first update
        gathers = [self._update(group, p, r) for (group, p, _), r in zip(work, reduced)]
        for g in gathers:
            if g is not None:
                g.wait()
        if self.tied:
            self.embed.detach().copy_(self.lm_head.detach().t())
            if step == self.split_step:
                self.untie()
        return loss

    @torch.no_grad()
    def untie(self) -> None:
        """embed's state ← lm_head's moments transposed (this rank's rows of the transpose) and step count."""
        if not self.tied:
            return
        head_state = self.state[self.lm_head]
        embed_state = {"step": head_state.get("step", 0)}
        for key in MOMENT_KEYS:
            moment = head_state.get(key)
            if moment is None:  # lm_head never stepped: embed starts from zero moments too
                moment = torch.zeros(self.lm_head.shape, dtype=torch.float32, device=self.lm_head.device)
            embed_state[key] = self._mine(self._whole(self.lm_head, moment).t()).contiguous()
        self.state[self.embed].update(embed_state)
        self.tied = False

    def _whole(self, p: Tensor, rows: Tensor) -> Tensor:
        """A state tensor of p for all of p's rows: all-gathered if p is sharded (a blocking collective)."""
        if not self._sharded(p) or rows.shape == p.shape:
            return rows
        full = torch.empty(p.shape, dtype=rows.dtype, device=rows.device)
        self.comm.all_gather(full, rows.contiguous()).wait()
        return full

    # --- checkpoints ------------------------------------------------------------

    def state_dict(self) -> dict:
        """torch's state dict (moments, step counts, pending sums) plus the tie flag."""
        return {**super().state_dict(), "tied": self.tied}

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader, then each saved state tensor in its own dtype, and the tie flag.

        Optimizer.load_state_dict casts floating state to the parameter's
        dtype, which would round the fp32 moments of a bf16 table to bf16; the
        saved tensors are put back as saved (on the parameter's device).
        """
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "tied"})
        restore_as_saved(self, state_dict)
        self.tied = bool(state_dict["tied"]) and self.embed is not None


# ---------------------------------------------------------------------------
# The record's groups.
# ---------------------------------------------------------------------------

def record_adam_groups(named_params: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]],
                       cfg: RecordAdamConfig = RecordAdamConfig()) -> list[dict]:
    """One group per parameter, with the table's β, lr_mul and wd_mul for its name (the spec's names)."""
    items = named_params.items() if isinstance(named_params, Mapping) else named_params
    groups = []
    for name, p in items:
        row = cfg.hyper(name)
        groups.append(dict(params=[p], name=name, betas=(row.beta1, row.beta2), lr_mul=row.lr_mul,
                           wd_mul=row.wd_mul))
    return groups


def build_record_adam(named_params: Mapping[str, Tensor], cfg: RecordAdamConfig = RecordAdamConfig(),
                      split_step: int | None = None, lr_multiplier: float = 1.0,
                      process_group=None, kernel: str = "torch") -> RecordAdam:
    """RecordAdam over the named parameters at cfg's constants, embed and lm_head tied if both are present.

    lr_multiplier is s at the first step (the caller rewrites group["lr"] = cfg.lr·s(step) every step);
    kernel as RecordAdam's (a run passes `kernels.table.impl(train.kernels)`).
    """
    tie = "embed" in named_params and "lm_head" in named_params
    return RecordAdam(record_adam_groups(named_params, cfg), lr=cfg.lr * lr_multiplier, eps=cfg.eps,
                      weight_decay=cfg.weight_decay, embed=named_params["embed"] if tie else None,
                      lm_head=named_params["lm_head"] if tie else None, split_step=split_step,
                      process_group=process_group, kernel=kernel)
