"""Gradient accumulation: the micro-steps' gradients added in place into buffers kept for the run.

A step of the record is eight micro-steps. Left to autograd, after each backward but the first every
parameter's new gradient is added into `.grad` by autograd's own eager kernel (AccumulateGrad): 390
read-read-write passes a step, 6.3 ms/step on an H200 (`aten::add_` in the profile), after the compiled
backward has already written each gradient once (the float32 weights' gradients as a bfloat16 -> float32
cast). AccumulateGrad stays only as the reference the tests hold this path to, bit for bit.

Here `SummedModel` hands the model, through `torch.func.functional_call`, each parameter wrapped in
`_AddInto`, an identity whose backward adds the parameter's gradient into a buffer kept for the run
(`GradBuffers`) in place and hands autograd nothing; the trainer makes the buffers `.grad` after the
last micro-step. AOTAutograd keeps a backward's data mutation of a forward input that needs no gradient,
and Inductor fuses the add into the kernel that writes the gradient, straight into the buffer. Adding
inside the backward measured -4.08 ms/step (b01c7eb, 2026-12-01), and adding in place rather than
returning the sums as the gradients 0.74 GiB less memory in the same time (007fa9a, 2026-12-02).

Same values, bit for bit: float32 addition of the same two numbers, which is commutative. For a
bfloat16 parameter (the embedding tables) the micro-step's gradient is rounded to bfloat16 explicitly
first (`round_bf16`): inside a fused kernel Inductor keeps the intermediate in float32, and would
otherwise add the unrounded value. The first micro-step adds to zeros, so that every micro-step runs one
graph. The same code runs uncompiled (a CPU run, `train.compile=off`), eagerly.

A parameter that no loss reaches keeps `.grad` None as with autograd: the model names it
(`GPT.unused_parameter_names`, held to autograd for every preset by the tests), since the buffers cannot
tell. The embedding tables the model only looks up get no wrapper: `GradBuffers` keeps a float32 scratch
table for each, and the model's lookups add their gradients into the buffers row by row
(`embed_rows.py`), with no dense table filled and read each micro-step.

The float32 matrices the model only reads cast to bfloat16 (`GPT.cast_only_names`) are cast once a step
(`StepCasts`) rather than in every micro-step's graph: -2.94 ms/step (343d3fa, 2026-12-01). `_AddInto`
hands the model the cast and adds `float32(grad)` into the parameter's buffer, what the cast's backward
followed by the add gives. The cast is the same rounding (to nearest, ties to even) either way."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def round_bf16(x: Tensor) -> Tensor:
    """float32 x rounded to the nearest bfloat16 (ties to even), kept in float32, in integer arithmetic
    that a fused kernel cannot skip. NaN stays NaN; overflow goes to inf, as the cast does."""
    bits = x.view(torch.int32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return torch.where(x.isnan(), x, rounded.view(torch.float32))


def add_gradient(total: Tensor, grad: Tensor) -> Tensor:
    """`total + grad` with AccumulateGrad's value: for bfloat16, one float32 add of the two bfloat16
    values, rounded once."""
    if grad.dtype == torch.bfloat16:
        return (total.float() + round_bf16(grad.float())).to(torch.bfloat16)
    return total + grad


class _AddInto(torch.autograd.Function):
    """Identity on p (or its step cast, where one is given); its backward adds p's gradient into `total`
    in place, as `add_gradient` would, and gives p none (the trainer hands p the buffer, GradBuffers)."""

    @staticmethod
    def forward(ctx, p: Tensor, total: Tensor, cast: Tensor | None) -> Tensor:
        ctx.save_for_backward(total)
        return p.view_as(p) if cast is None else cast.view_as(cast)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (total,) = ctx.saved_tensors
        total.copy_(add_gradient(total, grad.to(total.dtype)))  # a cast's gradient: exact to float32
        return None, None, None


def allow_caching() -> None:
    """Let AOTAutograd's cache (and so Dynamo's packages, `dynamo_cache.py`) keep graphs that hold
    `_AddInto`: torch bypasses custom autograd Functions by default because it does not hash their
    code. Safe here: every cache speedrun uses is keyed by speedrun's sources (`compile_cache.key_parts`,
    `key_local_caches`), so a changed Function never meets an old entry."""
    import torch._functorch.config as cfg

    if hasattr(cfg, "autograd_cache_allow_custom_autograd_functions"):
        cfg.autograd_cache_allow_custom_autograd_functions = True


def trained_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def compile_step_model(model: nn.Module, compiled: bool) -> nn.Module:
    """The module the trainer calls: `SummedModel` over the model, whole-model compiled where `compiled`
    (one graph with every block inlined: the compiler sees across blocks), else eager."""
    allow_caching()
    step_model = SummedModel(model)
    if not compiled:
        return step_model
    return torch.compile(step_model, dynamic=False, fullgraph=True)


class SummedModel(nn.Module):
    """The step model: `forward(tokens, targets, long_blocks, dtype, sums, casts, scratch)` is the model's
    forward whose backward adds the gradients into `sums` in place (one tensor per trained parameter, in
    `trained_parameters` order), reading a parameter as its entry of `casts` where that is not None
    (`StepCasts.aligned`). A parameter whose entry of `scratch` is not None (`GradBuffers.scratch`) is an
    embedding table the model looks up row by row (`embed_rows`): the model gets its (sum, scratch) pair
    as `table_sums`. Without sums (validation) the model's forward as is. Keyword arguments go to the
    model's forward."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, targets: Tensor, long_blocks: Tensor, dtype: torch.dtype = torch.float32,
                sums: list[Tensor] | None = None, casts: list[Tensor | None] | None = None,
                scratch: list[Tensor | None] | None = None, **kwargs) -> Tensor:
        if sums is None:
            return self.model(tokens, targets, long_blocks, dtype, **kwargs)
        named = trained_parameters(self.model)
        casts = [None] * len(named) if casts is None else casts
        scratch = [None] * len(named) if scratch is None else scratch
        if not len(named) == len(sums) == len(casts) == len(scratch):
            raise ValueError(f"SummedModel: {len(sums)} sums, {len(casts)} casts and {len(scratch)} scratch "
                             f"tables for {len(named)} trained parameters")
        params, tables = {}, {}
        for (name, p), s, c, r in zip(named, sums, casts, scratch):
            if r is None:
                params[name] = _AddInto.apply(p, s, c)
            else:  # the model's own table, looked up by embed_rows.lookup_into
                tables[name] = (s, r)
        if tables:
            kwargs["table_sums"] = [tables.get(name) for name in self.model.lookup_table_names()]
        return torch.func.functional_call(self.model, params, (tokens, targets, long_blocks, dtype), kwargs)


class StepCasts:
    """The compute-dtype copies of the parameters named in `names` (`GPT.cast_only_names`), made once a
    step by `refresh` (one foreach copy) and handed to `SummedModel` by `aligned`. The trainer refreshes
    them before each step's first micro-step: the parameters change only between steps (optimiser,
    recovery, loading), so the copies are never stale inside one. Float32 parameters only, and only
    where the compute dtype is another: otherwise there is nothing to cast."""

    def __init__(self, model: nn.Module, names, dtype: torch.dtype):
        named = trained_parameters(model)
        wanted = set(names)
        unknown = wanted - {name for name, _ in named}
        if unknown:
            raise ValueError(f"StepCasts: no trained parameter named {sorted(unknown)[0]!r}")
        self.slots = [i for i, (name, p) in enumerate(named)
                      if name in wanted and p.dtype == torch.float32 and dtype != torch.float32]
        self.params = [named[i][1] for i in self.slots]
        self.copies = [torch.empty_like(p, dtype=dtype) for p in self.params]
        self.count = len(named)

    @torch.no_grad()
    def refresh(self) -> None:
        if self.copies:
            torch._foreach_copy_(self.copies, self.params)

    def aligned(self) -> list[Tensor | None]:
        out: list[Tensor | None] = [None] * self.count
        for i, c in zip(self.slots, self.copies):
            out[i] = c
        return out


class GradBuffers:
    """The trainer's side of the sums: one buffer per trained parameter (`buffers`, handed to
    `SummedModel` as its sums), kept for the whole run, zeroed before a step's first micro-step (`start`),
    added into by each micro-step's backward, and made the parameters' `.grad` after the last one
    (`finish`). A parameter named in `unused` (one no loss reaches, `GPT.unused_parameter_names`) keeps
    `.grad` None, as with autograd. A parameter named in `rows` (an embedding table only looked up,
    `GPT.lookup_table_names`) also gets a float32 scratch table of its shape (`scratch`, None for the
    others), zero now and after every micro-step (`embed_rows`)."""

    def __init__(self, model: nn.Module, unused=(), rows=()):
        named = trained_parameters(model)
        self.params = [p for _, p in named]
        self.buffers = [torch.zeros_like(p) for p in self.params]
        skip, by_rows = set(unused), set(rows)
        unknown = by_rows - {name for name, _ in named}
        if unknown:
            raise ValueError(f"GradBuffers: no trained parameter named {sorted(unknown)[0]!r}")
        self.scratch = [torch.zeros_like(p, dtype=torch.float32) if name in by_rows else None for name, p in named]
        self.handed = [(p, b) for (name, p), b in zip(named, self.buffers) if name not in skip]

    @torch.no_grad()
    def start(self) -> None:
        torch._foreach_zero_(self.buffers)
        for p in self.params:
            p.grad = None

    def finish(self) -> None:
        for p, b in self.handed:
            p.grad = b
