"""Which parameter goes to which optimiser, at which learning rate.

The record: Muon on every >=2-D parameter inside the blocks; Adam on the
token and value embeddings (embed_lr), the head (head_lr) and everything
else, the scalars (scalar_lr). The llm.c baseline: AdamW on everything,
weight decay on matrices and embeddings only. Both optimisers shard their
work over the ranks themselves (see muon.py, adam.py).
"""

from __future__ import annotations

import torch
from torch import nn

from speedrun.config import OptimConfig
from speedrun.kernels import table as kernel_table
from speedrun.optim.adam import DistAdam
from speedrun.optim.muon import Muon


def split_parameters(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Partition the model's parameters into embed / head / matrix / scalar."""
    embed_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head_w = getattr(model, "head_w", None)
    parts: dict[str, list] = {"embed": [], "head": [], "matrix": [], "scalar": []}
    for name, p in model.named_parameters():
        if head_w is not None and p is head_w:
            parts["head"].append(p)
        elif id(p) in embed_ids:
            parts["embed"].append(p)
        elif name.startswith("blocks.") and p.ndim >= 2:
            parts["matrix"].append(p)
        else:
            parts["scalar"].append(p)
    return parts


def build_optimizers(model: nn.Module, cfg: OptimConfig, kernels: str = "auto") -> list[torch.optim.Optimizer]:
    """The run's optimisers; kernels: `train.kernels` (the element-wise updates on `optim/kernels.py`'s
    kernels or on their eager references)."""
    parts = split_parameters(model)
    impl = kernel_table.impl(kernels)
    if cfg.kind == "adamw":
        decay = parts["embed"] + parts["head"] + parts["matrix"]
        groups = [dict(params=decay, weight_decay=cfg.weight_decay), dict(params=parts["scalar"], weight_decay=0.0)]
        groups = [g for g in groups if g["params"]]
        return [DistAdam(groups, lr=cfg.adamw_lr, betas=cfg.adamw_betas, eps=cfg.adamw_eps, kernel=impl)]
    adam_groups = [
        dict(params=parts["embed"], lr=cfg.embed_lr),
        dict(params=parts["head"], lr=cfg.head_lr),
        dict(params=parts["scalar"], lr=cfg.scalar_lr),
    ]
    adam = DistAdam([g for g in adam_groups if g["params"]], betas=cfg.adam_betas, eps=cfg.adam_eps,
                    kernel=impl)
    muon = Muon(parts["matrix"], lr=cfg.muon_lr, momentum=cfg.muon_momentum, ns_steps=cfg.muon_ns_steps,
                kernel=impl)
    return [adam, muon]
