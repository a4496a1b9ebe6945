"""train.inductor_options: further Inductor options for the whole-model compile, "KEY=VALUE,...". The
config check refuses malformed text and regional compiles; each option is checked against this torch's
Inductor (it must exist and take the value's type) with one line naming it; the compile keys name the
text; the options reach torch.compile. On a GPU, Inductor's coordinate-descent tuning must train like the
default and leave its tuned configs in the cache."""

from __future__ import annotations

import json

import pytest
import torch

from reliability_helpers import assert_curves_close, train
from speedrun.compile import regional
from speedrun.compile.cache import graph_config
from speedrun.config import parse_inductor_options, validate
from speedrun.errors import ConfigError
from speedrun.recipes.presets import record


def test_text_parses_to_typed_values():
    assert parse_inductor_options(" coordinate_descent_tuning=true, triton.max_tiles=3,x=0.5,y=word,") == {
        "coordinate_descent_tuning": True, "triton.max_tiles": 3, "x": 0.5, "y": "word"}
    assert parse_inductor_options("") == {}
    for bad in ("coordinate_descent_tuning", "=1", "a b=1", "a..b=1", "a="):
        with pytest.raises(ValueError):
            parse_inductor_options(bad)


@pytest.mark.parametrize("text, needle", [
    ("coordinate_descent_tuning", "train.inductor_options: must be KEY=VALUE pairs"),
    ("1x=2", "train.inductor_options: must be KEY=VALUE pairs"),
])
def test_config_check_refuses_malformed_text(text, needle):
    cfg = record()
    cfg.train.inductor_options = text
    with pytest.raises(ConfigError, match=needle):
        validate(cfg, 1)


def test_config_check_refuses_regional_compile():
    cfg = record()
    cfg.train.inductor_options = "coordinate_descent_tuning=true"
    cfg.train.compile = "regional"
    with pytest.raises(ConfigError, match="train.inductor_options: needs the whole-model compile"):
        validate(cfg, 1)
    cfg.train.compile = "on"
    validate(cfg, 1)


@pytest.mark.parametrize("text, message", [
    ("no_such_option=true", "this torch ({}) has no Inductor option 'no_such_option'"),
    ("triton.no_such_option=1", "this torch ({}) has no Inductor option 'triton.no_such_option'"),
    ("coordinate_descent_tuning.x=1", "this torch ({}) has no Inductor option 'coordinate_descent_tuning.x'"),
    ("coordinate_descent_tuning=3", "coordinate_descent_tuning takes a bool, got 3"),
])
def test_each_option_is_checked_against_inductor(text, message):
    with pytest.raises(ConfigError) as err:
        regional.inductor_options(text)
    assert str(err.value) == "train.inductor_options: " + message.format(torch.__version__)


def test_an_unknown_option_is_one_line_from_the_command(tmp_path, capsys):
    from speedrun.compile import dynamo_cache

    before = torch._dynamo.config.caching_precompile
    code = train(tmp_path / "run", "--set", "train.compile=on", "--set", "train.inductor_options=no_such_option=1",
                 steps=1)
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "has no Inductor option 'no_such_option'" in err
    if dynamo_cache.supported():  # the failed set-up switched Dynamo's package cache back off
        assert torch._dynamo.config.caching_precompile is False
    torch._dynamo.config.caching_precompile = before


def test_options_reach_torch_compile(monkeypatch):
    seen = {}

    def fake_compile(module, **kwargs):
        seen.update(kwargs)
        return module

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = torch.nn.Linear(2, 2)
    regional.compile_step_model(model, "on", True, pdl=False, inductor="coordinate_descent_tuning=true")
    assert seen["options"] == {"coordinate_descent_tuning": True}
    regional.compile_step_model(model, "on", True)
    assert seen["options"] is None  # none given: torch's defaults, as before the option existed
    with pytest.raises(ConfigError, match="need the whole-model compile"):
        regional.compile_step_model(model, "regional", True, inductor="coordinate_descent_tuning=true")


def test_keys_name_the_text():
    cfg = record()
    assert "inductor_options" not in graph_config(cfg)["train"]  # empty: the keys of earlier runs hold
    cfg.train.inductor_options = "coordinate_descent_tuning=true"
    assert graph_config(cfg)["train"]["inductor_options"] == "coordinate_descent_tuning=true"


@pytest.mark.gpu
def test_gpu_coordinate_descent_trains_like_the_default(tmp_path, monkeypatch):
    """The tiny run compiled on the GPU with and without Inductor's coordinate-descent tuning: the same
    losses to within the compiled step's run-to-run spread, and the tuned run's kernels have configs
    found by the tuning in the cache."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    gpu = ["--set", "train.compile=on", "--set", "train.precompile=false", "--set", "train.warmup_steps=2",
           "--set", "train.dtype=bfloat16", "--set", "train.dynamo_cache=false"]
    assert train(tmp_path / "a", *gpu, steps=6) == 0
    assert train(tmp_path / "b", *gpu, "--set", "train.inductor_options=coordinate_descent_tuning=true",
                 steps=6) == 0
    tuned = [json.loads(p.read_text()) for p in (tmp_path / "inductor").rglob("*.best_config")]
    assert any(c.get("found_by_coordesc") for c in tuned)
    assert_curves_close(tmp_path / "a", tmp_path / "b")

