"""Gradient accumulation inside the compiled backward (`train.grad_accum`).

A step of the record is eight micro-steps. After each backward but the first, autograd adds every
parameter's new gradient into `.grad` with its own eager kernel (AccumulateGrad): 390 read-read-write
passes a step, 6.3 ms/step on an H200 (`aten::add_` in the profile), after the compiled backward has
already written each gradient once (the float32 weights' gradients as a bfloat16 -> float32 cast).

Here the running sums go into the compiled step as inputs, and each parameter's gradient leaves the
backward already added to its sum: `SummedModel` hands the model, through `torch.func.functional_call`,
each parameter wrapped in `_SumInto`, an identity whose backward returns `sum + grad`. Inductor fuses
that add into the kernel that writes the gradient, and autograd gives the result to `.grad` as it is
(`.grad` is cleared before each micro-step, `GradSums`), with no pass of its own.

Same values, bit for bit: float32 addition of the same two numbers, which is commutative. For a
bfloat16 parameter (the embedding tables) the micro-step's gradient is rounded to bfloat16 explicitly
first (`round_bf16`): inside a fused kernel Inductor keeps the intermediate in float32, and would
otherwise add the unrounded value. The CPU tests hold both paths to each other exactly, compiled.

The first micro-step adds to zeros (kept, one copy of the parameters, so that every micro-step runs
one graph). Where this cannot pay, `resolve` picks autograd: no compile, one micro-step, CUDA graphs
(whose replays would copy the sums into static inputs), regional compilation (the add would run
eagerly). Measured: -3.3 to -4.9 ms/step (docs/performance.md).

`inplace` (`_AddInto`, `GradBuffers`): the backward adds each gradient into a persistent buffer in place
and hands autograd nothing, and the trainer makes the buffers `.grad` after the last micro-step. The same
fused kernel (AOTAutograd keeps a backward's data mutation of a forward input that needs no gradient,
and Inductor writes the sum straight into the buffer) and the same values, but the buffers never move:
CUDA graphs' replays read them where they are (`torch._dynamo.mark_static_address`) rather than copying
them into static inputs, which is what kept `graph` and CUDA graphs apart. A parameter that no loss
reaches keeps `.grad` None as with autograd: the model names it (`GPT.unused_parameter_names`, held to
autograd for every preset by the tests), since the buffers cannot tell. With `model.embed_kernel=rows`
the embedding tables the model only looks up get no wrapper: `GradBuffers` keeps a float32 scratch
table for each, and the model's lookups add their gradients into the buffers row by row
(`embed_rows.py`), with no dense table filled and read each micro-step.

The float32 matrices the model only reads cast to bfloat16 (`GPT.cast_only_names`) are cast once a step
(`StepCasts`, `train.cast_once`) rather than in every micro-step's graph: `_CastSumInto` hands the model
the cast and returns `sum + float32(grad)` for the parameter, what the cast's backward followed by
`_SumInto` returns. The cast is the same rounding (to nearest, ties to even) either way."""

from __future__ import annotations

import torch
from torch import Tensor, nn

MODES = ("auto", "graph", "inplace", "autograd")


def resolve(mode: str, compile_mode: str, compiled: bool, cudagraphs: bool, micro_steps: int,
            rows: bool = False) -> str:
    """"graph", "inplace" or "autograd" for a run: `auto` is "graph" where the whole model is compiled
    and a step has more than one micro-step ("inplace" with CUDA graphs), else "autograd"; with `rows`
    (model.embed_kernel=rows, whose tables add into the buffers) "inplace" wherever that runs (not
    under regional compilation)."""
    if mode != "auto":
        return mode
    whole = compiled and compile_mode in ("auto", "on")
    if rows and (whole or not compiled):
        return "inplace"
    if not whole or micro_steps <= 1:
        return "autograd"
    return "inplace" if cudagraphs else "graph"


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


class _SumInto(torch.autograd.Function):
    """Identity on p; its backward returns the running sum plus p's gradient."""

    @staticmethod
    def forward(ctx, p: Tensor, total: Tensor) -> Tensor:
        ctx.save_for_backward(total)
        return p.view_as(p)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (total,) = ctx.saved_tensors
        return add_gradient(total, grad), None


class _CastSumInto(torch.autograd.Function):
    """p's value as `cast` (p cast to the compute dtype this step); its backward returns the running sum
    plus p's gradient in p's dtype, as `p.to(dtype)` followed by `_SumInto` would."""

    @staticmethod
    def forward(ctx, p: Tensor, total: Tensor, cast: Tensor) -> Tensor:
        ctx.save_for_backward(total)
        return cast.view_as(cast)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (total,) = ctx.saved_tensors
        return total + grad.to(total.dtype), None, None


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


def _wrap(p: Tensor, total: Tensor, cast: Tensor | None, inplace: bool = False) -> Tensor:
    if inplace:
        return _AddInto.apply(p, total, cast)
    return _SumInto.apply(p, total) if cast is None else _CastSumInto.apply(p, total, cast)


def allow_caching() -> None:
    """Let AOTAutograd's cache (and so Dynamo's packages, `dynamo_cache.py`) keep graphs that hold
    `_SumInto`: torch bypasses custom autograd Functions by default because it does not hash their
    code. Safe here: every cache speedrun uses is keyed by speedrun's sources (`compile_cache.key_parts`,
    `key_local_caches`), so a changed Function never meets an old entry."""
    import torch._functorch.config as cfg

    if hasattr(cfg, "autograd_cache_allow_custom_autograd_functions"):
        cfg.autograd_cache_allow_custom_autograd_functions = True


def trained_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


class SummedModel(nn.Module):
    """The step model with `train.grad_accum=graph` or `inplace`: `forward(tokens, targets, long_blocks,
    dtype, sums, casts, scratch)` is the model's forward whose backward adds the gradients into `sums`
    (one tensor per trained parameter, in `trained_parameters` order: returned as the parameters'
    gradients, or with `inplace` added into the tensors themselves), reading a parameter as its entry of
    `casts` where that is not None (`StepCasts.aligned`). With `inplace`, a parameter whose entry of
    `scratch` is not None (`GradBuffers.scratch`) is an embedding table the model looks up row by row
    (`embed_rows`): the model gets its (sum, scratch) pair as `table_sums`. Without sums (validation)
    the model's forward as is. Keyword arguments go to the model's forward."""

    def __init__(self, model: nn.Module, inplace: bool = False):
        super().__init__()
        self.model = model
        self.inplace = inplace

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
        if not self.inplace and any(r is not None for r in scratch):
            raise ValueError("SummedModel: scratch tables need the in-place sums (train.grad_accum=inplace)")
        params, tables = {}, {}
        for (name, p), s, c, r in zip(named, sums, casts, scratch):
            if r is None:
                params[name] = _wrap(p, s, c, self.inplace)
            else:  # the model's own table, looked up by embed_rows.lookup_into
                tables[name] = (s, r)
        if tables:
            kwargs["table_sums"] = [tables.get(name) for name in self.model.lookup_table_names()]
        return torch.func.functional_call(self.model, params, (tokens, targets, long_blocks, dtype), kwargs)


class GradSums:
    """The trainer's side of `graph`: before each micro-step, the running sums (`.grad`, or zeros where
    there is none yet) and `.grad` cleared, so that autograd takes the backward's sums as they are;
    after it, a sum put back where the micro-step gave its parameter no gradient."""

    def __init__(self, model: nn.Module):
        self.params = [p for _, p in trained_parameters(model)]
        self._zeros: list[Tensor] | None = None
        self._before: list[Tensor | None] = []

    def start(self) -> None:
        """Before a step's first micro-step: nothing to do (autograd's `.grad` is the running sum)."""

    def finish(self) -> None:
        """After a step's last micro-step: nothing to do."""

    def begin(self) -> list[Tensor]:
        if self._zeros is None:
            self._zeros = [torch.zeros_like(p) for p in self.params]
        self._before = [p.grad for p in self.params]
        sums = [z if g is None else g for g, z in zip(self._before, self._zeros)]
        for p in self.params:
            p.grad = None
        return sums

    def end(self) -> None:
        for p, g in zip(self.params, self._before):
            if p.grad is None and g is not None:
                p.grad = g
        self._before = []


class StepCasts:
    """The compute-dtype copies of the parameters named in `names` (`GPT.cast_only_names`), made once a
    step by `refresh` (one foreach copy) and handed to `SummedModel` by `aligned`. The trainer refreshes
    them before each step's first micro-step: the parameters change only between steps (optimiser,
    recovery, loading), so the copies are never stale inside one. Float32 parameters only: a bfloat16 one
    needs no cast, and `_CastSumInto`'s plain add is the float32 sum's."""

    def __init__(self, model: nn.Module, names, dtype: torch.dtype, static: bool = False):
        named = trained_parameters(model)
        wanted = set(names)
        unknown = wanted - {name for name, _ in named}
        if unknown:
            raise ValueError(f"StepCasts: no trained parameter named {sorted(unknown)[0]!r}")
        self.slots = [i for i, (name, p) in enumerate(named)
                      if name in wanted and p.dtype == torch.float32 and dtype != torch.float32]
        self.params = [named[i][1] for i in self.slots]
        self.copies = [torch.empty_like(p, dtype=dtype) for p in self.params]
        if static:  # CUDA graphs: read where they are, not copied into the graphs' inputs
            for c in self.copies:
                torch._dynamo.mark_static_address(c)
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
    """The trainer's side of `inplace`: one buffer per trained parameter, kept for the whole run, zeroed
    before a step's first micro-step (`start`), added into by each micro-step's backward, and made the
    parameters' `.grad` after the last one (`finish`). With `static` (CUDA graphs) the buffers are marked
    as static addresses, so that the graphs' replays read and write them where they are. A parameter
    named in `unused` (one no loss reaches, `GPT.unused_parameter_names`) keeps `.grad` None, as with
    autograd. A parameter named in `rows` (an embedding table only looked up, `GPT.lookup_table_names`,
    with model.embed_kernel=rows) also gets a float32 scratch table of its shape (`scratch`, None for the
    others), zero now and after every micro-step (`embed_rows`)."""

    def __init__(self, model: nn.Module, static: bool = False, unused=(), rows=()):
        named = trained_parameters(model)
        self.params = [p for _, p in named]
        self.buffers = [torch.zeros_like(p) for p in self.params]
        skip, by_rows = set(unused), set(rows)
        unknown = by_rows - {name for name, _ in named}
        if unknown:
            raise ValueError(f"GradBuffers: no trained parameter named {sorted(unknown)[0]!r}")
        self.scratch = [torch.zeros_like(p, dtype=torch.float32) if name in by_rows else None for name, p in named]
        self.handed = [(p, b) for (name, p), b in zip(named, self.buffers) if name not in skip]
        if static:
            for b in self.buffers + [r for r in self.scratch if r is not None]:
                torch._dynamo.mark_static_address(b)

    @torch.no_grad()
    def start(self) -> None:
        torch._foreach_zero_(self.buffers)
        for p in self.params:
            p.grad = None

    def begin(self) -> list[Tensor]:
        return self.buffers

    def end(self) -> None:
        """After each micro-step: nothing to do (the backward added into the buffers)."""

    def finish(self) -> None:
        for p, b in self.handed:
            p.grad = b
