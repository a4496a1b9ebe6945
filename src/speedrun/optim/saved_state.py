"""Optimiser state put back as it was saved.

`torch.optim.Optimizer.load_state_dict` casts floating state to its parameter's dtype. The 2026
record's optimisers keep float32 state (moments, variance buffers) for bfloat16 parameters and integer
mantissas beside them, which that cast would round or change; a resume must continue bit for bit.
"""

from __future__ import annotations

import torch


def restore_as_saved(optimizer: torch.optim.Optimizer, state_dict: dict) -> None:
    """After `Optimizer.load_state_dict(state_dict)`: each saved state tensor copied back as saved, in
    its own dtype, on its parameter's device."""
    saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, p in zip(saved_ids, params):
        for key, value in state_dict["state"].get(i, {}).items():
            if torch.is_tensor(value):
                optimizer.state[p][key] = value.to(device=p.device, copy=True)
