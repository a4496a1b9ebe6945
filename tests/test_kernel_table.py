"""The one kernel table and the one switch (`kernels/table.py`, `train.kernels`): every module and test the
table names exists, and "reference" reaches every kernel choice the model, the attention and the
optimisers make."""

import re
from pathlib import Path

import pytest
import torch

from speedrun.config import RunConfig, apply_overrides, validate
from speedrun.errors import ConfigError
from speedrun.kernels import table
from speedrun.model import attention
from speedrun.model.gpt import GPT
from speedrun.optim.groups import build_optimizers

ROOT = Path(__file__).resolve().parents[1]


def test_switch_values():
    assert table.impl("auto") == "auto" and table.impl("reference") == "torch"
    with pytest.raises(ValueError, match="train.kernels"):
        table.impl("triton")
    cfg = apply_overrides(RunConfig(), ["train.kernels=bogus"])
    with pytest.raises(ConfigError, match="train.kernels: must be auto or reference, got 'bogus'"):
        validate(cfg)


@pytest.mark.parametrize("entry", table.KERNELS, ids=lambda k: k.function.split(" ")[0])
def test_every_file_the_table_names_exists(entry):
    text = " ".join((entry.hopper, entry.other_gpu, entry.cpu, entry.test))
    for path in re.findall(r"[\w/]+\.py", text):
        where = ROOT / path if path.startswith("tests/") else ROOT / "src" / "speedrun" / path
        if "/" not in path:  # a module named beside the one before it
            where = ROOT / "src" / "speedrun" / "kernels" / path
        assert where.exists(), f"{entry.function}: {path}"


def test_reference_reaches_every_choice():
    cfg = RunConfig()
    cfg.model.num_layers, cfg.model.model_dim, cfg.model.num_heads, cfg.model.head_dim = 2, 64, 2, 32
    cfg.model.mlp_hidden, cfg.model.vocab_size, cfg.model.value_embeds = 128, 500, 1
    cfg.model.no_attn_layers, cfg.model.long_layers = (), (0,)
    for kernels, want in (("auto", "auto"), ("reference", "torch")):
        model = GPT(cfg.model, cfg.attention, kernels=kernels)
        impls = {m.impl for m in model.modules() if hasattr(m, "impl")}
        assert impls == {want}
        adam, muon = build_optimizers(model, cfg.optim, kernels)
        assert adam.kernel == want and muon.kernel == want


def test_reference_attention_is_never_the_projects_kernel(monkeypatch):
    monkeypatch.setattr(attention, "_hopper", lambda device: True)
    monkeypatch.setattr(attention.attn_gluon, "available", lambda: True)
    cuda = torch.device("cuda", 0)
    assert attention.pick_backend("auto", cuda, 64, 128, torch.bfloat16) == "gluon"
    assert attention.pick_backend("auto", cuda, 64, 128, torch.bfloat16, reference=True) == "flex"
    assert attention.pick_backend("auto", torch.device("cpu"), 64, 128, reference=True) == "dense"
