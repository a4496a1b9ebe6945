"""NorMuon: the 2026-07 record's optimiser for the attention and MLP banks.

Spec: record-2026-07.md, "Optimisation / NorMuon + Polar Express" (and
"Systems notes" for the sharding). One step for each matrix of a bank:

    m ← μ·m + (1−μ)·g;  u = (1−μ)·g + μ·m           momentum, Nesterov (fp32)
    X = PolarExpress(u)                              bfloat16
    q = mean of X² per row (rows ≥ cols) or per column (rows < cols)
    v ← β2·v + (1−β2)·q;  X ← X·v^−½, rescaled to keep ‖X‖_F        (NorMuon)
    η = lr·√max(1, rows/cols)·(2 for the MLP's W2)
    P ← P − η·X − η·(wd·lr)·P·[X·P ≥ 0]             cautious decay (fp32 P)

Why it is built this way:

* A parameter is a bank: a bfloat16 tensor whose trailing two dims are the
  matrix and whose leading dims, flattened, count the matrices (qk_bank
  (60 + pads, 256, 768); vo_bank (20 + pads, 768, 768); mlp_bank
  (12, 2, 3072, 768) read as 24 matrices). Every matrix is orthogonalised on
  its own, all of a bank's matrices in one batched call.
* The fp32 master weight is never stored whole: the bfloat16 parameter holds
  its high 16 bits and the uint16 state "mantissa" its low 16 bits. The
  forward therefore reads the master truncated, for free, and the update
  runs on the exact fp32 master. The split and the join are integer
  arithmetic on int32 values (no shift of a negative number, no overflow),
  so join(split(x)) is x bit for bit.
* Distributed, the bank's first axis is cut into W contiguous chunks (the
  banks are padded to a multiple of W): one reduce-scatter averages the
  gradients and hands rank r its chunk, rank r updates only those matrices
  (its state is that chunk's), and one all-gather brings every rank the new
  bfloat16 weights. Each matrix is computed on its own, whichever rank
  holds it, so any W gives the one-process result on the averaged gradient
  (bit for bit on CPU with gloo, as the tests check; on GPUs a batched
  kernel may tile another batch size differently). All reduce-scatters are
  issued before the first update, so communication overlaps compute. Without an
  initialised process group the whole bank is updated in one process.
* lr and momentum are read from the param group at every step; the caller
  writes group["lr"] = 0.023·s(step) and group["momentum"] = μ(step). The
  per-matrix factor (2 for W2) is the group entry "matrix_lr_mul", one value
  per matrix, because only the caller knows which matrices are W2.
* On a GPU (`kernel`, from `train.kernels`) the element-wise steps around
  Polar Express are two kernel passes (optim/kernels.py): the momentum with
  the cast to bfloat16, and everything after the variance factor (applied,
  the master joined, the cautious step, the split), which eagerly are 25
  passes over the banks. They round where the eager steps round, so the
  eager steps stay the reference they are tested against.
* Pads (zero weight, zero gradient) stay exactly zero: the momentum is 0,
  Polar Express maps 0 to 0 (the + 1e-6), the variance step keeps 0 (its
  norm ratio is clamped), and the decay of a zero weight is zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from speedrun.data.transfer import host_to_device
from speedrun.optim.kernels import IMPLS, momentum_step, normuon_apply_step, normuon_fits, pick_impl
from speedrun.optim.muon import Collectives, Pending, done
from speedrun.optim.polar_express import polar_express
from speedrun.optim.saved_state import restore_as_saved

STATE_KEYS = ("momentum_buffer", "second_momentum_buffer", "mantissa")


@dataclass(frozen=True)
class NorMuonConfig:
    """The record's NorMuon constants (spec: "Optimisation / NorMuon + Polar Express").

    lr is the base rate (the step's lr is lr·s(step)); weight_decay multiplies
    lr once more in the cautious decay; w2_lr_mul is the extra factor of the
    MLP's down projections; var_eps clamps the variance buffer before v^−½.
    """

    lr: float = 0.023
    weight_decay: float = 1.2
    beta2: float = 0.9
    w2_lr_mul: float = 2.0
    var_eps: float = 1e-10


# ---------------------------------------------------------------------------
# The fp32 master as a bfloat16 weight (high half) plus a uint16 mantissa (low half).
# ---------------------------------------------------------------------------

_HALF = 1 << 16


def split_master(master: Tensor) -> tuple[Tensor, Tensor]:
    """fp32 → (bfloat16 of its high 16 bits: the value truncated toward zero, uint16 of its low 16 bits)."""
    if master.dtype != torch.float32:
        raise TypeError(f"split_master needs float32, got {master.dtype}")
    bits = master.view(torch.int32)
    high = torch.div(bits, _HALF, rounding_mode="floor")  # the signed high half, in [-2^15, 2^15)
    low = bits - high * _HALF  # in [0, 2^16)
    return high.to(torch.int16).view(torch.bfloat16), low.to(torch.uint16)


def join_master(weight: Tensor, mantissa: Tensor) -> Tensor:
    """(bfloat16 high half, uint16 low half) → the fp32 whose bits they are."""
    if weight.dtype != torch.bfloat16 or mantissa.dtype != torch.uint16:
        raise TypeError(f"join_master needs bfloat16 and uint16, got {weight.dtype} and {mantissa.dtype}")
    high = weight.view(torch.int16).to(torch.int32)  # signed high half: high·2^16 + low stays in int32
    return (high * _HALF + mantissa.to(torch.int32)).view(torch.float32)


# ---------------------------------------------------------------------------
# The steps of one update, each on a stack (k, rows, cols) of matrices.
# ---------------------------------------------------------------------------

def variance_scale(X: Tensor, buffer: Tensor, beta2: float, eps: float = 1e-10) -> Tensor:
    """NorMuon's factor for X: v^−½ per row (rows ≥ cols) or per column, rescaled to keep X's Frobenius
    norm, in X's dtype, shaped to broadcast over X.

    buffer (fp32, (…, rows, 1) or (…, 1, cols)) ← β2·buffer + (1−β2)·q in
    place, q the mean of X² along the other axis. The factor is computed in
    fp32 and rounded to X's dtype (bfloat16 in the optimiser). The clamp of
    the new norm keeps a zero matrix zero instead of 0/0.
    """
    dim = -1 if X.shape[-2] >= X.shape[-1] else -2
    size = X.shape[dim]
    q = X.float().square().mean(dim=dim, keepdim=True)
    norm_before = (q.sum(dim=(-2, -1), keepdim=True) * size).sqrt()
    buffer.lerp_(q, 1 - beta2)
    scale = buffer.clamp_min(eps).rsqrt()
    norm_after = (q * size * scale.square()).sum(dim=(-2, -1), keepdim=True).sqrt()
    return (scale * (norm_before / norm_after.clamp_min(eps))).to(X.dtype)


def variance_reduce(X: Tensor, buffer: Tensor, beta2: float, eps: float = 1e-10) -> Tensor:
    """NorMuon's step: X times `variance_scale`, applied in X's dtype."""
    return X * variance_scale(X, buffer, beta2, eps)


def cautious_update(master: Tensor, update: Tensor, eta: Tensor | float, decay: Tensor | float) -> Tensor:
    """P − η·X − η·decay·P·[X·P ≥ 0] in fp32 (the mask is non-strict: X = 0 still decays P).

    eta broadcasts over the stack (one value per matrix); decay = wd·lr.
    """
    X = update.to(torch.float32)
    keep = (X * master) >= 0
    return master - master * keep * decay * eta - X * eta


def shape_lr_mul(rows: int, cols: int) -> float:
    """√max(1, rows/cols): the update RMS of a tall matrix matches a square one's."""
    return math.sqrt(max(1.0, rows / cols))


def mlp_matrix_lr_mul(n_matrices: int, w2_lr_mul: float = 2.0) -> tuple[float, ...]:
    """Per-matrix factors of the MLP bank read as (layers·2) matrices: W1 (even) 1, W2 (odd) w2_lr_mul."""
    return tuple(w2_lr_mul if i % 2 else 1.0 for i in range(n_matrices))


def matrix_step_sizes(lr: float, rows: int, cols: int, matrix_lr_mul: Sequence[float]) -> list[float]:
    """η of each matrix: lr·√max(1, rows/cols)·its own factor (Python floats, rounded to fp32 once used)."""
    base = lr * shape_lr_mul(rows, cols)
    return [base * m for m in matrix_lr_mul]


def normuon_update(weight: Tensor, grad: Tensor, state: dict, *, lr: float, momentum: float,
                   weight_decay: float, beta2: float, matrix_lr_mul: Sequence[float],
                   var_eps: float = 1e-10, impl: str = "torch") -> None:
    """One NorMuon step on a stack of k matrices, in place.

    weight: the bfloat16 (k, rows, cols) high halves (a view into the bank);
    grad: its (averaged) gradient; state: "momentum_buffer" fp32 (k, rows,
    cols), "second_momentum_buffer" fp32, "mantissa" uint16 (k, rows, cols);
    matrix_lr_mul: k per-matrix factors. impl: "torch" (the eager steps
    below, the reference) | "triton" | "auto": the momentum and the steps
    after Polar Express each as one kernel pass (optim/kernels.py) where
    the tensors fit them, the same arithmetic.
    """
    rows, cols = weight.shape[-2:]
    # m ← μ·m + (1−μ)·g in place (fp32), u = (1−μ)·g + μ·m: float32 eagerly, bfloat16 from the kernel
    u = momentum_step(grad, state["momentum_buffer"], momentum, impl)
    X = polar_express(u)
    scale = variance_scale(X, state["second_momentum_buffer"], beta2, var_eps)
    etas = matrix_step_sizes(lr, rows, cols, matrix_lr_mul)
    eta = host_to_device(etas, torch.float32, weight.device).view(-1, 1, 1)
    if pick_impl(weight, impl) == "triton" and normuon_fits(weight, state["mantissa"], X, scale):
        normuon_apply_step(weight, state["mantissa"], X, scale, eta, weight_decay * lr)
        return
    master = cautious_update(join_master(weight, state["mantissa"]), X * scale, eta, weight_decay * lr)
    high, low = split_master(master)
    weight.copy_(high)
    state["mantissa"].copy_(low)


def new_state(k: int, rows: int, cols: int, device: torch.device) -> dict:
    """Zero state of a chunk of k matrices; the variance buffer has one value per row (rows ≥ cols) or column."""
    var_shape = (k, rows, 1) if rows >= cols else (k, 1, cols)
    return {
        "momentum_buffer": torch.zeros((k, rows, cols), dtype=torch.float32, device=device),
        "second_momentum_buffer": torch.zeros(var_shape, dtype=torch.float32, device=device),
        "mantissa": torch.zeros((k, rows, cols), dtype=torch.uint16, device=device),
    }


def as_matrices(t: Tensor) -> Tensor:
    """The bank viewed as (matrices, rows, cols): every leading dim flattened (mlp (12, 2, m, n) → (24, m, n))."""
    return t.view(-1, t.shape[-2], t.shape[-1])


# ---------------------------------------------------------------------------
# The optimiser.
# ---------------------------------------------------------------------------

class NorMuon(torch.optim.Optimizer):
    """NorMuon over bfloat16 banks, sharded over ranks along each bank's first axis.

    Args:
        params: bfloat16 banks (or param groups). A group may carry
            "matrix_lr_mul": one factor per matrix of each of its banks.
        lr: the step's learning rate (0.023·s(step); the caller rewrites
            group["lr"], group["initial_lr"] keeps the first value).
        momentum: μ (the caller rewrites group["momentum"] each step).
        weight_decay: cautious decay factor (1.2); the decay per step is
            η·weight_decay·lr.
        beta2: the variance buffer's decay (0.9).
        var_eps: the variance buffer's clamp before v^−½.
        process_group: the group to shard over (None: the default group, if
            initialised). Construct the optimiser after init_process_group.
        kernel: "torch" | "triton" | "auto": the update's element-wise steps
            eagerly or as kernel passes (`normuon_update`; "auto": on CUDA).

    State per bank, for this rank's chunk only: "momentum_buffer" (fp32),
    "second_momentum_buffer" (fp32), "mantissa" (uint16). A bank without a
    gradient is skipped, as torch does (every rank has the same banks).
    Distributed over gloo, Collectives' fallback reduces in place, so the
    gradient tensor is consumed by the step; the training loop clears
    gradients after it anyway.
    """

    def __init__(self, params, lr: float = 0.023, momentum: float = 0.95, weight_decay: float = 1.2,
                 beta2: float = 0.9, var_eps: float = 1e-10, process_group=None, kernel: str = "torch"):
        if kernel not in IMPLS:
            raise ValueError(f"NorMuon kernel must be one of {IMPLS}, got {kernel!r}")
        self.kernel = kernel
        self.comm = Collectives(process_group)
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, beta2=beta2, var_eps=var_eps,
                        matrix_lr_mul=None)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        group.setdefault("initial_lr", group["lr"])
        for p in group["params"]:
            self._check_bank(p, group["matrix_lr_mul"])

    def _check_bank(self, p: Tensor, matrix_lr_mul: Sequence[float] | None) -> None:
        if p.ndim < 2 or p.dtype != torch.bfloat16:
            raise ValueError(f"NorMuon needs bfloat16 banks of matrices, got {p.dtype} {tuple(p.shape)}")
        n = as_matrices(p).shape[0]
        if n % self.comm.world_size:
            raise ValueError(f"a bank of {n} matrices cannot be split over {self.comm.world_size} ranks; pad it")
        if matrix_lr_mul is not None and len(matrix_lr_mul) != n:
            raise ValueError(f"matrix_lr_mul has {len(matrix_lr_mul)} entries for a bank of {n} matrices")

    def _chunk(self, p: Tensor) -> slice:
        """This rank's matrices of bank p."""
        k = as_matrices(p).shape[0] // self.comm.world_size
        return slice(self.comm.rank * k, (self.comm.rank + 1) * k)

    def _reduce(self, p: Tensor) -> Pending:
        """Issue the averaging reduce-scatter of p's gradient (nothing to do in one process)."""
        grad = p.grad.reshape(-1, *p.shape[-2:])
        if not self.comm.active:
            return done(grad)
        return self.comm.reduce_scatter_avg(grad.contiguous())

    def _update(self, group: dict, p: Tensor, reduced: Pending) -> Pending | None:
        """Wait for this chunk's gradients, update its matrices, start the all-gather."""
        bank = as_matrices(p.detach())
        chunk = self._chunk(p)
        weight = bank[chunk]
        if not self.state[p]:
            self.state[p].update(new_state(weight.shape[0], *weight.shape[-2:], p.device))
        lr_mul = group["matrix_lr_mul"] or (1.0,) * bank.shape[0]
        normuon_update(weight, reduced.wait(), self.state[p], lr=group["lr"], momentum=group["momentum"],
                       weight_decay=group["weight_decay"], beta2=group["beta2"],
                       matrix_lr_mul=lr_mul[chunk], var_eps=group["var_eps"], impl=self.kernel)
        return self.comm.all_gather(bank, weight) if self.comm.active else None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = [(group, p) for group in self.param_groups for p in group["params"] if p.grad is not None]
        reduced = [self._reduce(p) for _, p in work]  # every reduction in flight before the first update
        gathers = [self._update(group, p, r) for (group, p), r in zip(work, reduced)]
        for g in gathers:
            if g is not None:
                g.wait()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader, then the saved state tensors in their own dtypes.

        Optimizer.load_state_dict casts floating state to the parameter's
        dtype, which would round the fp32 buffers to bfloat16; each saved
        tensor is put back as saved (on the parameter's device).
        """
        super().load_state_dict(state_dict)
        restore_as_saved(self, state_dict)

    @torch.no_grad()
    def reset_state(self) -> None:
        """Zero every buffer and mantissa (the record's reset after the compile warm-up)."""
        for state in self.state.values():
            for key in STATE_KEYS:
                if key in state:
                    state[key].zero_()


def record_param_groups(qk_bank: Tensor, vo_bank: Tensor, mlp_bank: Tensor,
                        cfg: NorMuonConfig = NorMuonConfig()) -> list[dict]:
    """The record's three groups: Q/K head pairs, V/O, and the MLP bank with W2 at w2_lr_mul."""
    n_mlp = as_matrices(mlp_bank).shape[0]
    return [
        dict(params=[qk_bank]),
        dict(params=[vo_bank]),
        dict(params=[mlp_bank], matrix_lr_mul=mlp_matrix_lr_mul(n_mlp, cfg.w2_lr_mul)),
    ]


def build_normuon(qk_bank: Tensor, vo_bank: Tensor, mlp_bank: Tensor, cfg: NorMuonConfig = NorMuonConfig(),
                  momentum: float = 0.85, process_group=None, kernel: str = "torch") -> NorMuon:
    """NorMuon over the record's banks at cfg's constants (momentum: μ(0) until the schedule writes it;
    kernel as NorMuon's: a run passes `kernels.table.impl(train.kernels)`)."""
    return NorMuon(record_param_groups(qk_bank, vo_bank, mlp_bank, cfg), lr=cfg.lr, momentum=momentum,
                   weight_decay=cfg.weight_decay, beta2=cfg.beta2, var_eps=cfg.var_eps,
                   process_group=process_group, kernel=kernel)
