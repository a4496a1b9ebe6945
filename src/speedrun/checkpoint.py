"""Model files: weights as safetensors beside the run's config.json.

A folder holding `model.safetensors` and `config.json` is a model that
`speedrun sample`, `speedrun export hf` and `speedrun eval` can load; every
finished run folder is one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from speedrun.config import RunConfig, from_dict
from speedrun.errors import ConfigError
from speedrun.rundir import atomic_write_text

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def save_model_files(model: torch.nn.Module, cfg: RunConfig, folder: Path) -> None:
    """Write weights (atomically: temp file then rename) and the config."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    tmp = folder / f".{WEIGHTS}.tmp"
    save_file(state, str(tmp), metadata={"format": "pt", "preset": cfg.name})
    tmp.replace(folder / WEIGHTS)
    atomic_write_text(folder / CONFIG, json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n")


def load_config(folder: Path) -> RunConfig:
    path = Path(folder) / CONFIG
    if not path.exists():
        raise ConfigError(f"{folder}: no {CONFIG} (expected a run or checkpoint folder)")
    try:
        return from_dict(json.loads(path.read_text()))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e.msg})") from None


def load_model(folder: Path, device: str | torch.device = "cpu"):
    """(GPT in eval mode with float32 weights, its RunConfig) from a model folder."""
    from safetensors.torch import load_file

    from speedrun.model import GPT

    folder = Path(folder)
    cfg = load_config(folder)
    path = folder / WEIGHTS
    if not path.exists():
        raise ConfigError(f"{folder}: no {WEIGHTS} (the run did not finish, or this is not a model folder)")
    state = load_file(str(path))
    n_scalars = state["scalars"].numel() if "scalars" in state else 1
    model = GPT(cfg.model, cfg.attention)
    if "scalars" in state:
        model.scalars.data = torch.ones(n_scalars)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError(f"{path}: weights do not match {CONFIG} (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.to(device).eval(), cfg
