"""Ranges of the config's numbers: every preset is inside them, every number outside is one line naming it."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from speedrun.config import SECTIONS, RunConfig, apply_overrides, set_field, validate
from speedrun.errors import ConfigError
from speedrun.recipes.registry import get_preset, registry


def numeric_fields() -> list[tuple[str, type]]:
    """(section.field, type) of every int, float or tuple-of-numbers field."""
    cfg, out = RunConfig(), []
    for section in SECTIONS:
        obj = getattr(cfg, section)
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            tp = hints[f.name]
            if tp in (int, float) or typing.get_origin(tp) is tuple:
                out.append((f"{section}.{f.name}", tp))
    return out


@pytest.mark.parametrize("name", list(registry()))
def test_every_preset_and_rung_is_in_range(name):
    validate(get_preset(name))


@pytest.mark.parametrize("path, tp", numeric_fields())
def test_every_number_refuses_a_value_below_its_range(path, tp):
    """No number of the config means anything below zero: -1 (and NaN) is refused, naming the field."""
    default = getattr(getattr(RunConfig(), path.split(".")[0]), path.split(".")[1])
    n = len(default) if typing.get_origin(tp) is tuple and typing.get_args(tp)[-1] is not Ellipsis else 1
    values = ["-1"] + (["nan"] if float in (tp, *typing.get_args(tp)) else [])
    for value in values:
        cfg = RunConfig()
        set_field(cfg, path, ",".join([value] * n))
        with pytest.raises(ConfigError) as err:
            validate(cfg)
        assert str(err.value).startswith(f"{path}: "), (value, str(err.value))


@pytest.mark.parametrize("override, message", [
    ("optim.muon_lr=-0.05", "optim.muon_lr: must be >= 0, got -0.05"),
    ("model.long_layers=0,4,7,12", "model.long_layers: layer indices must be in 0..11 (model.num_layers=12), "
                                   "got (0, 4, 7, 12)"),
    ("model.no_attn_layers=12", "model.no_attn_layers: layer indices must be in 0..11"),
    ("optim.adam_betas=0.9,1.0", "optim.adam_betas: each beta must be in [0, 1), got (0.9, 1.0)"),
    ("optim.adamw_betas=-0.1,0.95", "optim.adamw_betas: each beta must be in [0, 1)"),
    ("optim.muon_momentum=1", "optim.muon_momentum: must be in [0, 1), got 1.0"),
    ("optim.adam_eps=0", "optim.adam_eps: must be > 0, got 0.0"),
    ("schedule.final_lr_frac=1.5", "schedule.final_lr_frac: must be in [0, 1], got 1.5"),
    ("schedule.cooldown_frac=inf", "schedule.cooldown_frac: must be in [0, 1], got inf"),
    ("attention.block_size=0", "attention.block_size: must be >= 1, got 0"),  # before a check divides by it
    ("model.gate_inputs=0", "model.gate_inputs: must be >= 1, got 0"),
    ("model.num_heads=-6", "model.num_heads: must be >= 1, got -6"),
    ("train.seed=-1", "train.seed: must be in [0, 2^64), got -1"),
])
def test_out_of_range_is_one_line_naming_the_field(override, message):
    with pytest.raises(ConfigError) as err:
        validate(apply_overrides(get_preset("record_2025_08"), [override]))
    assert str(err.value).startswith(message)


def test_the_edges_of_the_ranges_are_in():
    validate(apply_overrides(get_preset("record_2025_08"), [
        "optim.muon_lr=0", "optim.embed_lr=0", "model.long_layers=11", "model.no_attn_layers=0,11",
        "optim.adam_betas=0,0.999", "schedule.final_lr_frac=1", "schedule.momentum_warmup_frac=1.5",
        "model.logit_softcap=0", "model.attn_scale=0", "optim.muon_ns_steps=0", "train.seed=0"]))


def test_the_command_line_refuses_before_training(tmp_path, capsys):
    from speedrun.cli.main import main

    assert main(["train", "--preset", "demo_2025_08", "--out", str(tmp_path / "run"), "--set", "optim.muon_lr=-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "speedrun: error: optim.muon_lr: must be >= 0, got -1.0"
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
