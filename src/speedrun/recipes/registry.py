"""Every preset by name: the base presets (presets.py), then the ladder's rungs (ladder.py).

A module of its own so that the ladder, which derives its rungs from the presets, and the presets
never import each other.
"""

from __future__ import annotations

import difflib
from typing import Callable

import torch

from speedrun.config import RunConfig
from speedrun.errors import ConfigError
from speedrun.model.gpt import GPT, count_parameters
from speedrun.recipes.ladder import rungs
from speedrun.recipes.presets import demo, proxy212, record


def registry() -> dict[str, Callable[[], RunConfig]]:
    """Every preset by name: the base presets, then the ladder's rungs."""
    presets: dict[str, Callable[[], RunConfig]] = {"record": record, "proxy212": proxy212, "demo": demo}
    for rung in rungs():
        presets.setdefault(rung.name, rung.build)
    return presets


def get_preset(name: str) -> RunConfig:
    presets = registry()
    if name not in presets:
        near = difflib.get_close_matches(name, list(presets), n=1)
        hint = f"; did you mean '{near[0]}'?" if near else f"; known: {', '.join(presets)}"
        raise ConfigError(f"--preset {name}: no such preset{hint}")
    return presets[name]()


def describe(name: str) -> str:
    """The resolved config and parameter count, for `speedrun info --preset`."""
    cfg = get_preset(name)
    with torch.device("meta"):
        n = count_parameters(GPT(cfg.model, cfg.attention))
    return f"{cfg.to_json()}\nparameters: {n:,}"
