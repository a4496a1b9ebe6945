"""Regional compilation: `--set train.compile=regional`.

Whole-model compilation (`auto`/`on`) hands Dynamo and Inductor one graph
with all twelve blocks inlined: the best code (the compiler sees across block
boundaries, mask building included) but the longest cold start, because
Inductor's compile time grows with the graph. Regional compilation compiles
each `Block` in place (`block.compile(...)`) and lets them share code: the
blocks are instances of one class, Dynamo guards on their structure, not
their identity, so blocks that take the same path (value embedding or not,
long or short window, attention or not) reuse one compiled graph. For the
record that is about six forward graphs (plus their backwards) instead of
one graph twelve blocks long; `GPT.hidden`'s glue (embedding lookups, U-net
skip additions, mask building) runs eagerly, and the head + soft-cap +
cross-entropy run in a second compiled region so the (T, 50304) float32
logits are never materialised eagerly.

What it costs: the eager glue launches a few dozen small kernels per
micro-step and the compiler cannot fuse across block boundaries. Which wins
on the GPU is measured with `speedrun bench` (see docs/performance.md).

Blocks are compiled in place, so parameter names, `state_dict()` keys,
checkpoints and forward hooks are unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from speedrun.errors import ConfigError



def _head_loss(model: nn.Module, x: Tensor, targets: Tensor) -> Tensor:
    """The tail of `GPT.forward` (after `hidden`), in one compiled region."""
    return model.head_loss(x, targets)


def raise_recompile_limit(n: int) -> None:
    """Let Dynamo keep at least `n` compiled variants of one function.

    All blocks share `Block.forward`'s code object, so its variants (value
    embedding or not, long or short window, attention or not, layer 0 where
    x is x0, and each of those again without grad for validation) count
    against one limit, 8 by default; past it, fullgraph compilation fails.
    """
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    if getattr(cfg, name) < n:
        setattr(cfg, name, n)


class RegionalModel(nn.Module):
    """The step model of `train.compile=regional`: same call signature as `GPT`.

    `forward(tokens, targets, long_blocks, dtype)` = `GPT.forward`, with the
    blocks compiled one by one and the loss tail compiled on its own.
    """

    def __init__(self, model: nn.Module, dynamic: bool = False):
        super().__init__()
        self.model = model
        raise_recompile_limit(4 * len(model.blocks) + 8)
        for block in model.blocks:
            block.compile(dynamic=dynamic, fullgraph=True)
        self._tail = torch.compile(_head_loss, dynamic=dynamic, fullgraph=True)

    def forward(self, tokens: Tensor, targets: Tensor, long_blocks: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        x = self.model.hidden(tokens, long_blocks, dtype)[0]
        return self._tail(self.model, x, targets)


def compile_regions(model: nn.Module, dynamic: bool = False) -> RegionalModel:
    """Compile `model`'s blocks in place and return the step model to call instead of it."""
    return RegionalModel(model, dynamic=dynamic)


def compile_step_model(model: nn.Module, mode: str, compiled: bool, cudagraphs: bool = False,
                       summed: bool | str = False) -> nn.Module:
    """The module the trainer calls: the model itself, whole-model compiled (its graphs replayed as CUDA
    graphs with `cudagraphs`), or regional; with
    `summed` (train.grad_accum=graph: True or "graph"; "inplace") wrapped in `grad_accum.SummedModel`,
    whose forward takes the running gradient sums."""
    from speedrun.train.grad_accum import SummedModel, allow_caching

    if summed:
        allow_caching()
    step_model = SummedModel(model, inplace=summed == "inplace") if summed else model
    if not compiled:
        return step_model
    if mode == "regional":
        if summed:
            raise ConfigError("train.grad_accum=graph or inplace needs the whole-model compile, not regional")
        return compile_regions(model)
    options = {"triton.cudagraphs": True} if cudagraphs else None
    return torch.compile(step_model, dynamic=False, fullgraph=True, options=options)
