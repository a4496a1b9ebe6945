"""FlexAttention's tiles: the kernel options the model passes, and backward tiles for a block mask finer
than torch's defaults.

`FLEX_OPTIONS` are the kernel options of every FlexAttention call (`attention.flex_attention`): tile
sizes only, the same function on another schedule, the best of sweeps on an H200 at the record's shapes.
Forward (scripts/bench/flex_sweep.py): 64x64 tiles, 19.4 against 22.3 ms a step for torch's 128x64
(dd6597f). Backward, on the 64-token mask (scripts/bench/flex_mask_bench.py): (M1, N1, M2, N2) = (32, 64,
64, 32), 4 warps, 4 stages; forward + backward 69.0 ms a step against 79.2 for torch's (64, 128, 128, 64)
on 128-token blocks (72dcb66). Every tile divides the mask's 64-token blocks (`attention.MASK_BLOCK`).

Inductor checks each backward tile configuration from its heuristics against
the block mask's block size *before* it applies the caller's kernel options:
a configuration whose tiles do not divide the mask's blocks is dropped. On an
H100/H200 with head dimension 128 torch's only default is (BLOCK_M1, BLOCK_N1,
BLOCK_M2, BLOCK_N2) = (64, 128, 128, 64), so the model's 64-token block mask
(`attention.MASK_BLOCK`) leaves no configuration at all and the compile
fails, whatever `bwd_BLOCK_*` options are passed.

Inductor has a documented hook for out-of-tree heuristics: its `InductorChoices`
class, chosen by the `inductor_choices_class` config or set per thread with
`V.set_choices_handler`. Each thread reads the config once, at its first
lowering, and the backward is lowered on autograd's device thread; so
`use_sparse_block` sets the config, this thread's handler, and, through one
tiny backward on the device, the device thread's handler (which that thread may
have fixed already, if anything compiled a backward earlier in the process). `FineBlockChoices` keeps torch's
configurations that fit the mask and, when none does, offers torch's first one
with every tile clipped to the mask's block; the caller's `bwd_*` kernel
options then override it as usual. It changes which tiles run, never what is
computed. Only `use_sparse_block` installs it (the trainer calls it where
FlexAttention runs), and only for a mask finer than the window's blocks.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

try:  # Inductor is part of torch; the import is guarded only for unusual builds
    from torch._inductor.choices import InductorChoices
except ImportError:  # pragma: no cover
    InductorChoices = object

FLEX_OPTIONS = {"fwd_BLOCK_M": 64, "fwd_BLOCK_N": 64, "fwd_num_warps": 4, "fwd_num_stages": 3,
                "bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 32,
                "bwd_num_warps": 4, "bwd_num_stages": 4}


def fits(config, sparse_block: int) -> bool:
    """Do a backward configuration's four tiles divide the mask's block?"""
    tiles = (config.block_m1, config.block_n1, config.block_m2, config.block_n2)
    return all(sparse_block % t == 0 for t in tiles)


def clipped(config, sparse_block: int):
    """`config` with every tile at most `sparse_block` (tiles are powers of two, so they then divide it)."""
    return dataclasses.replace(config, **{k: min(getattr(config, k), sparse_block)
                                          for k in ("block_m1", "block_n1", "block_m2", "block_n2")})


class FineBlockChoices(InductorChoices):
    """Inductor's choices, with FlexAttention backward configurations that fit `sparse_block`."""

    def __init__(self, sparse_block: int = 128):
        super().__init__()
        self.sparse_block = sparse_block

    def get_flex_attention_bwd_configs(self, head_dim, dtype, device_type="cuda"):
        configs = super().get_flex_attention_bwd_configs(head_dim, dtype, device_type)
        kept = [c for c in configs if fits(c, self.sparse_block)]
        return kept or [clipped(c, self.sparse_block) for c in configs[:1]]


def use_sparse_block(sparse_block: int, block_size: int, device: torch.device | None = None) -> None:
    """Make Inductor's FlexAttention backward accept `sparse_block`-token masks in this process: the
    config, this thread, and the autograd thread of `device` (a CUDA device). A no-op at `block_size`
    or above."""
    if sparse_block >= block_size:
        return
    from torch._inductor import config
    from torch._inductor.virtualized import V

    config.inductor_choices_class = functools.partial(FineBlockChoices, sparse_block=sparse_block)
    V.set_choices_handler(FineBlockChoices(sparse_block))
    if device is not None and device.type == "cuda":
        x = torch.zeros(1, device=device, requires_grad=True)
        _InstallOnBackward.apply(x, sparse_block).sum().backward()


class _InstallOnBackward(torch.autograd.Function):
    """Identity whose backward installs the choices in the thread that runs it: for a CUDA tensor,
    autograd's device thread, where compiled backwards are lowered."""

    @staticmethod
    def forward(ctx, x, sparse_block):
        ctx.sparse_block = sparse_block
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        from torch._inductor.virtualized import V

        V.set_choices_handler(FineBlockChoices(ctx.sparse_block))
        return grad, None
