"""Muon: momentum, then Newton–Schulz orthogonalisation, for the block matrices.

The math is the record's (see docs/optimizers.md):

    buf    = lerp(buf, g, 1 − μ)            # momentum, (1 − μ)-scaled EMA
    update = lerp(g, buf, μ)                # Nesterov look-ahead
    O      = NS5(update)                    # orthogonalise each trailing matrix
    p     -= lr · √max(1, rows/cols) · O    # (and p *= 1 − lr·wd if wd > 0)

Why it is built this way:

* Parameters are bucketed by shape, and each bucket is stacked and
  orthogonalised in one batched call: one kernel launch per step per shape
  instead of one per matrix. A (4, 768, 768) parameter is four matrices.
* Distributed, rank r owns parameters r, r+W, r+2W, … of every bucket (the
  bucket is padded with zeros to a multiple of W). The stacked gradients are
  laid out owner-major so one reduce-scatter hands each rank exactly its own
  (averaged) gradients; each rank runs NS only for those, and one all-gather
  brings every rank the new parameters. Optimiser state exists only for the
  owned parameters.
* Every collective is asynchronous. `launch_reduce()` (call it right after
  backward, or let `step()` do it) issues all reduce-scatters at once;
  `step()` then waits for bucket i's gradients, computes, and issues its
  all-gather while later buckets' gradients are still travelling, so NS
  compute overlaps communication. Nothing in `step()` synchronises the host.
* Gloo (CPU tests) lacks some collectives; `Collectives` detects the backend
  and uses all_reduce + slicing there, which is the same math.
* Hyper-parameters are read from `param_groups` every step, so schedules
  just write group["lr"] (= group["initial_lr"] · multiplier) and
  group["momentum"].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from speedrun.optim import kernels as optim_kernels
from speedrun.optim.newton_schulz import IMPLS, newton_schulz

# ---------------------------------------------------------------------------
# Asynchronous collectives with a gloo fallback (shared with DistAdam).
# ---------------------------------------------------------------------------

@dataclass
class Pending:
    """An issued collective: `wait()` finishes it and returns its result."""

    work: object | None
    finish: Callable[[], Tensor]

    def wait(self) -> Tensor:
        if self.work is not None:
            self.work.wait()
        return self.finish()


def done(value: Tensor) -> Pending:
    """A Pending that needs no communication."""
    return Pending(None, lambda: value)


class Collectives:
    """Averaging reduce-scatter / all-reduce and all-gather, all async_op=True.

    NCCL on CUDA tensors uses the native tensor collectives (ReduceOp.AVG);
    other backends (gloo) use all_reduce(SUM) + slice + divide and a list
    all_gather, which gives the same result. Built once, from the process
    group (None = the default group) as it is at construction.
    """

    def __init__(self, group=None):
        self.group = group
        self.active = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
        self.world_size = dist.get_world_size(group) if self.active else 1
        self.rank = dist.get_rank(group) if self.active else 0
        self.backend = str(dist.get_backend(group)) if self.active else ""

    def _native(self, t: Tensor) -> bool:
        return "nccl" in self.backend and t.is_cuda

    def reduce_scatter_avg(self, full: Tensor) -> Pending:
        """Average `full` (W·k, …) over ranks; this rank gets rows [rank·k, (rank+1)·k). `full` is not kept."""
        W = self.world_size
        k = full.shape[0] // W
        if self._native(full):
            out = full.new_empty((k, *full.shape[1:]))
            work = dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.AVG, group=self.group, async_op=True)
            return Pending(work, lambda: out)
        work = dist.all_reduce(full, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        return Pending(work, lambda: full[self.rank * k:(self.rank + 1) * k].div_(W))

    def all_reduce_avg(self, t: Tensor) -> Pending:
        """Average `t` over ranks, in place."""
        if self._native(t):
            work = dist.all_reduce(t, op=dist.ReduceOp.AVG, group=self.group, async_op=True)
            return Pending(work, lambda: t)
        work = dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        return Pending(work, lambda: t.div_(self.world_size))

    def all_gather(self, out: Tensor, local: Tensor) -> Pending:
        """out (W·k, …) ← every rank's `local` (k, …) in rank order. `local` may alias out's own chunk."""
        if self._native(out):
            work = dist.all_gather_into_tensor(out, local, group=self.group, async_op=True)
            return Pending(work, lambda: out)
        chunks = list(out.chunk(self.world_size))
        work = dist.all_gather(chunks, local.clone(), group=self.group, async_op=True)
        return Pending(work, lambda: out)


# ---------------------------------------------------------------------------
# Ownership layout inside a shape bucket.
# ---------------------------------------------------------------------------

def owner_major_order(n: int, world_size: int) -> list[int]:
    """Parameter index at each row of the padded, owner-major stack (-1 = padding).

    Rank r owns parameters r, r+W, r+2W, …; its k = ceil(n/W) rows are
    [r·k, (r+1)·k), so one reduce-scatter / all-gather serves all ranks.
    """
    k = -(-n // world_size)
    order = []
    for r in range(world_size):
        for j in range(k):
            i = j * world_size + r
            order.append(i if i < n else -1)
    return order


def lr_scale(shape: torch.Size) -> float:
    """√max(1, rows/cols) over the last two dims: keeps the update RMS shape-independent."""
    rows, cols = shape[-2], shape[-1]
    return math.sqrt(max(1.0, rows / cols))


@dataclass
class _Bucket:
    group: dict
    params: list  # every parameter of this shape in the group (grad present, when single-process)
    reduced: Pending  # → this rank's averaged, stacked gradients (owned rows first)


class ShardedOptimizer(torch.optim.Optimizer):
    """The step protocol Muon and DistAdam share.

    `launch_reduce()` issues this step's gradient collectives (asynchronous,
    idempotent until the next step; the loop may call it right after
    backward). `step()` then takes each unit as its reduction lands, updates
    what this rank owns, starts the unit's all-gather, and finally waits for
    the gathers. Subclasses say what a unit is (`_launch`) and how one is
    updated (`_step_unit`).
    """

    _pending: list | None = None

    def _launch(self) -> list:
        raise NotImplementedError

    def _step_unit(self, unit) -> Pending | None:
        raise NotImplementedError

    @torch.no_grad()
    def launch_reduce(self) -> None:
        if self._pending is None:
            self._pending = self._launch()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.launch_reduce()
        units, self._pending = self._pending, None
        gathers = [self._step_unit(u) for u in units]
        for g in gathers:
            if g is not None:
                g.wait()
        return loss


class Muon(ShardedOptimizer):
    """Muon with shape-batched Newton–Schulz and owner-sharded distribution.

    Args:
        params: ≥2-D parameters (or param groups); the last two dims are the matrix.
        lr: learning rate (0.05 in the record). Each group also gets "initial_lr".
        momentum: μ (0.95; schedules write group["momentum"] each step).
        weight_decay: decoupled, p *= 1 − lr·wd (0 in the record).
        ns_steps: Newton–Schulz steps (5).
        ns_impl: "auto" | "triton" | "torch" | "reference" (see newton_schulz).
        process_group: the group to shard over (None = default). Construct the
            optimiser after init_process_group.
        kernel: "torch" | "triton" | "auto": momentum and look-ahead as eager
            operations or one fused kernel per bucket that writes Newton–Schulz's
            bfloat16 input (optim_kernels; "auto": the kernel on CUDA). The
            float32 "reference" Newton–Schulz always takes the eager form.
    """

    def __init__(self, params, lr: float = 0.05, momentum: float = 0.95, weight_decay: float = 0.0,
                 ns_steps: int = 5, ns_impl: str = "auto", process_group=None, kernel: str = "torch"):
        if ns_impl not in IMPLS:
            raise ValueError(f"Muon ns_impl must be one of {IMPLS}, got {ns_impl!r}")
        if kernel not in optim_kernels.IMPLS:
            raise ValueError(f"Muon kernel must be one of {optim_kernels.IMPLS}, got {kernel!r}")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, ns_steps=ns_steps)
        super().__init__(params, defaults)
        self.ns_impl = ns_impl
        self.kernel = kernel if ns_impl != "reference" else "torch"
        self.comm = Collectives(process_group)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        group.setdefault("initial_lr", group["lr"])
        for p in group["params"]:
            if p.ndim < 2:
                raise ValueError(f"Muon needs parameters with >= 2 dims, got shape {tuple(p.shape)}")

    # -- communication -----------------------------------------------------

    def _shape_buckets(self, group: dict) -> list[list]:
        buckets: dict[tuple, list] = {}
        for p in group["params"]:
            if p.grad is None and not self.comm.active:
                continue  # single process: like torch, skip parameters without a gradient
            buckets.setdefault((p.shape, p.dtype, p.device), []).append(p)
        return list(buckets.values())

    def _reduce(self, params: list) -> Pending:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if not self.comm.active:
            return done(torch.stack(grads))
        order = owner_major_order(len(params), self.comm.world_size)
        pad = torch.zeros_like(grads[0]) if -1 in order else None
        full = torch.stack([grads[i] if i >= 0 else pad for i in order])
        return self.comm.reduce_scatter_avg(full)

    def _launch(self) -> list[_Bucket]:
        """Every shape bucket, its gradient reduce-scatter issued (async)."""
        return [_Bucket(group, params, self._reduce(params))
                for group in self.param_groups for params in self._shape_buckets(group)]

    # -- update ------------------------------------------------------------

    def _stacked_buffers(self, owned: list) -> Tensor:
        """The owned parameters' momentum buffers as one stacked tensor, state[p] holding its rows.

        Kept stacked so the momentum runs on the bucket at once. A loaded state dict brings separate
        tensors; they are copied into a new stack once (missing ones start at zero)."""
        bufs = [self.state[p].get("momentum_buffer") for p in owned]
        base = bufs[0]._base if bufs[0] is not None else None
        if base is not None and base.shape == (len(owned), *owned[0].shape) and all(
                b is not None and b._base is base and b.data_ptr() == base[i].data_ptr()
                for i, b in enumerate(bufs)):
            return base
        stack = torch.zeros((len(owned), *owned[0].shape), dtype=owned[0].dtype, device=owned[0].device)
        for i, (p, b) in enumerate(zip(owned, bufs)):
            if b is not None:
                stack[i].copy_(b)
            self.state[p]["momentum_buffer"] = stack[i]
        return stack

    def _momentum_update(self, group: dict, owned: list, grads: Tensor) -> Tensor:
        """Momentum + Nesterov on this rank's stacked gradients; returns the update (float32, or
        bfloat16 from the kernel: Newton–Schulz's input)."""
        bufs = self._stacked_buffers(owned)
        return optim_kernels.momentum_step(grads, bufs, group["momentum"], impl=self.kernel)

    def _step_unit(self, bucket: _Bucket) -> Pending | None:
        """Wait for this bucket's gradients, update the owned parameters, start the all-gather."""
        group, params = bucket.group, bucket.params
        owned = params[self.comm.rank::self.comm.world_size]
        grads = bucket.reduced.wait()
        if not self.comm.active:
            self._update(group, owned, grads, owned)
            return None
        local = torch.zeros_like(grads, dtype=params[0].dtype)  # padding rows stay zero
        if owned:
            local[:len(owned)] = torch.stack(owned)
            self._update(group, owned, grads[:len(owned)], list(local[:len(owned)].unbind(0)))
        return self._gather(params, local)

    def _update(self, group: dict, owned: list, grads: Tensor, targets: list) -> None:
        """targets[i] ← decay · targets[i] − lr · scale · NS(nesterov momentum of grads[i])."""
        update = self._momentum_update(group, owned, grads)
        ortho = newton_schulz(update, steps=group["ns_steps"], impl=self.ns_impl)
        step_lr = group["lr"] * lr_scale(owned[0].shape)
        decay = 1 - group["lr"] * group["weight_decay"]
        self._apply_in_place(targets, ortho, step_lr, decay)

    @staticmethod
    def _apply_in_place(params: list, ortho: Tensor, step_lr: float, decay: float) -> None:
        """params[i] = decay · params[i] − step_lr · ortho[i]."""
        if decay != 1:
            torch._foreach_mul_(params, decay)
        torch._foreach_add_(params, list(ortho.unbind(0)), alpha=-step_lr)  # bfloat16 read as it is

    def _gather(self, params: list, local: Tensor) -> Pending:
        """All-gather every rank's new values; waiting copies them into the parameters."""
        order = owner_major_order(len(params), self.comm.world_size)
        full = local.new_empty((len(order), *local.shape[1:]))
        gathered = self.comm.all_gather(full, local)
        row_of = {i: pos for pos, i in enumerate(order) if i >= 0}

        def finish() -> Tensor:
            out = gathered.wait()
            torch._foreach_copy_([p.detach() for p in params], [out[row_of[i]] for i in range(len(params))])
            return out

        return Pending(None, finish)
