"""Every preset by name: the base presets (presets.py), then the ladder's rungs (ladder.py), and what
`speedrun info --preset` says of one (its resolved config and parameter count).

A module of its own so that the ladder, which derives its rungs from the presets, and the presets
never import each other.
"""

from __future__ import annotations

import difflib
from typing import Callable

import torch

from speedrun.config import AnyConfig, RecordRunConfig
from speedrun.errors import ConfigError
from speedrun.model import record as record_model
from speedrun.model.gpt import GPT, count_parameters
from speedrun.recipes import presets as base
from speedrun.recipes.ladder import rungs


def registry() -> dict[str, Callable[[], AnyConfig]]:
    """Every preset by name: the base presets, then the ladder's rungs."""
    presets: dict[str, Callable[[], AnyConfig]] = {
        "record": base.record, "proxy161": base.proxy161, "proxy322": base.proxy322, "demo": base.demo,
        "record_2025_08": base.record_2025_08, "proxy212": base.proxy212, "demo_2025_08": base.demo_2025_08,
    }
    for rung in rungs():
        presets.setdefault(rung.name, rung.build)
    return presets


def get_preset(name: str) -> AnyConfig:
    presets = registry()
    if name not in presets:
        near = difflib.get_close_matches(name, list(presets), n=1)
        hint = f"; did you mean '{near[0]}'?" if near else f"; known: {', '.join(presets)}"
        raise ConfigError(f"--preset {name}: no such preset{hint}")
    return presets[name]()


def parameter_count(cfg: AnyConfig, world_size: int = 1) -> int:
    """The parameters the run trains (the 2026 record's bank pads depend on the world size)."""
    with torch.device("meta"):
        if isinstance(cfg, RecordRunConfig):
            return record_model.count_parameters(record_model.RecordGPT(cfg.model, world_size, device="meta"))
        return count_parameters(GPT(cfg.model, cfg.attention))


def describe(name: str) -> str:
    """The resolved config and parameter count, for `speedrun info --preset`."""
    cfg = get_preset(name)
    text = f"{cfg.to_json()}\nparameters: {parameter_count(cfg):,}"
    if isinstance(cfg, RecordRunConfig):
        text += f" (on fewer than 8 ranks; {parameter_count(cfg, 8):,} on 8, whose bank pads make every bank split evenly)"
    return text
