"""DistAdam: Adam (bias-corrected, optional decoupled weight decay), ZeRO-1 sharded.

The record uses Adam (betas 0.8, 0.95; eps 1e-10) for the embeddings, the
head and the scalars. Those tensors are large (embeddings ~50k × 768), so the
optimiser state is sharded like ZeRO-1:

* each gradient is reduce-scattered along dim 0 (averaged over ranks);
* rank r updates rows [r·n/W, (r+1)·n/W) of the parameter, keeping
  exp_avg / exp_avg_sq only for that slice;
* the parameter is all-gathered back in place.

A parameter whose dim 0 does not divide by W (a scalar vector of odd length,
say) is all-reduced instead and updated in full on every rank: the same math,
just without the memory saving. One process: plain Adam, and the update is
written to match torch.optim.Adam's single-tensor code op for op, so the two
agree to the last bit in float32. On CUDA the same operations run as one
fused kernel per tensor (`kernel`, optim_kernels.py).

Collectives are asynchronous like Muon's: `launch_reduce()` right after
backward issues every reduction; `step()` waits for each in turn, updates,
issues the all-gather, and waits for the gathers at the end. The all-reduce
fallback (and gloo's stand-in for reduce-scatter) averages p.grad in place,
as DDP would. The step count is a Python
number, so there is no host synchronisation inside `step()`. Schedules write
group["lr"] = group["initial_lr"] · multiplier.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from speedrun.optim.kernels import IMPLS, adam_step
from speedrun.optim.muon import Collectives, Pending, ShardedOptimizer, done


@dataclass
class _Reduction:
    param: Tensor
    group: dict
    sharded: bool  # True: reduce-scatter along dim 0; False: all-reduce, full update
    grad: Pending


def adam_update(p: Tensor, g: Tensor, state: dict, group: dict, kernel: str = "torch") -> None:
    """In-place Adam(W) step on p (a parameter or a slice of one) with gradient g.

    kernel: "torch" (optim_kernels.adam_reference, the eager operations) | "triton" | "auto" (one
    fused kernel on CUDA: the same operations and roundings, optim_kernels.adam_step)."""
    if not state:
        state["step"] = 0.0
        state["exp_avg"] = torch.zeros_like(p)
        state["exp_avg_sq"] = torch.zeros_like(p)
    state["step"] += 1
    adam_step(p, g, state["exp_avg"], state["exp_avg_sq"], state["step"], group["lr"],
              group["betas"], group["eps"], group["weight_decay"], impl=kernel)


class DistAdam(ShardedOptimizer):
    """Adam with ZeRO-1 sharding over dim 0 (plain Adam in one process).

    Args:
        params: parameters or param groups (each group gets "initial_lr").
        lr: learning rate.
        betas: (0.8, 0.95) in the record.
        eps: 1e-10 in the record.
        weight_decay: decoupled (AdamW), p *= 1 − lr·wd; 0 by default.
        process_group: the group to shard over (None = default). Construct the
            optimiser after init_process_group.
        kernel: "torch" | "triton" | "auto": the update as eager operations or one
            fused kernel per tensor (optim_kernels; "auto": the kernel on CUDA).
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.8, 0.95),
                 eps: float = 1e-10, weight_decay: float = 0.0, process_group=None, kernel: str = "torch"):
        if not 0.0 <= eps:
            raise ValueError(f"DistAdam eps must be >= 0, got {eps}")
        if kernel not in IMPLS:
            raise ValueError(f"DistAdam kernel must be one of {IMPLS}, got {kernel!r}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.comm = Collectives(process_group)
        self.kernel = kernel

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self.param_groups[-1].setdefault("initial_lr", self.param_groups[-1]["lr"])

    def _sharded(self, p: Tensor) -> bool:
        return self.comm.active and p.ndim > 0 and p.shape[0] % self.comm.world_size == 0 and p.is_contiguous()

    def _reduce(self, p: Tensor, group: dict) -> _Reduction:
        if p.grad is None:
            p.grad = torch.zeros_like(p)  # every rank must take part in the collective
        g = p.grad
        if not self.comm.active:
            return _Reduction(p, group, False, done(g))
        if self._sharded(p):
            return _Reduction(p, group, True, self.comm.reduce_scatter_avg(g.contiguous()))
        return _Reduction(p, group, False, self.comm.all_reduce_avg(g))

    def _launch(self) -> list[_Reduction]:
        """Every gradient's reduce-scatter / all-reduce, issued (async)."""
        return [
            self._reduce(p, group)
            for group in self.param_groups for p in group["params"]
            if p.grad is not None or self.comm.active
        ]

    def _step_unit(self, red: _Reduction) -> Pending | None:
        g = red.grad.wait()
        p = red.param.detach()
        if not red.sharded:
            adam_update(p, g, self.state[red.param], red.group, self.kernel)
            return None
        rows = p.shape[0] // self.comm.world_size
        mine = p[self.comm.rank * rows:(self.comm.rank + 1) * rows]
        adam_update(mine, g, self.state[red.param], red.group, self.kernel)
        return self.comm.all_gather(p, mine)
