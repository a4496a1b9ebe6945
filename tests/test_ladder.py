"""The record ladder: every rung builds, trains two steps (shrunk, on CPU),
changes exactly the fields it claims, and the command prints it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from speedrun.cli import main as cli
from speedrun.config import RunConfig, apply_overrides, diff, validate
from speedrun.errors import ConfigError
from speedrun.recipes.ladder import PROXY_TOKENS, get_rung, proxy_steps, report, rung_diff, rungs
from speedrun.recipes.presets import record_2025_08 as record
from speedrun.recipes.registry import registry

RUNGS = rungs()
NAMES = [r.name for r in RUNGS]


def shrink(cfg: RunConfig) -> RunConfig:
    """The rung's techniques on a 4-layer, 64-wide model, two steps of one 256-token sequence."""
    m, a, t, d = cfg.model, cfg.attention, cfg.train, cfg.data
    m.num_layers, m.model_dim, m.num_heads, m.head_dim, m.mlp_hidden = 4, 64, 2, 32, 128
    m.value_embeds = min(m.value_embeds, 2)
    m.no_attn_layers = (2,) if m.no_attn_layers else ()
    m.long_layers = (0, 3) if m.long_layers else ()
    a.segment_len = 128 if a.segment_len else 0
    t.steps, t.seq_len, t.batch_seqs, t.val_tokens, t.val_seq_len, t.val_every = 2, 256, 1, 256, 256, 2
    t.dtype, t.compile, t.warmup_steps, t.sample_tokens = "float32", "off", 0, 0
    d.data_dir, d.train_pattern, d.val_pattern = "demo", "demo_train_*.bin", "demo_val_*.bin"
    return cfg


@pytest.fixture(scope="module")
def ladder_runs(tmp_path_factory) -> dict[str, Path]:
    """Two training steps of every rung through the real Trainer, once for the module."""
    from speedrun.train.dist import DistInfo
    from speedrun.train.loop import Trainer

    root = tmp_path_factory.mktemp("ladder")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # much faster for these tiny matrices on a shared 2-core machine
    out = {}
    try:
        for rung in RUNGS:
            cfg = shrink(rung.build())
            validate(cfg, 1)
            info = DistInfo(0, 1, 0, torch.device("cpu"))
            trainer = Trainer(cfg, info, root / rung.name, progress=False)
            try:
                trainer.run()
            finally:
                trainer.guard.close()
            out[rung.name] = root / rung.name
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_rung_trains_two_steps(ladder_runs, name):
    from speedrun.run.rundir import read_metrics

    rows = list(read_metrics(ladder_runs[name]))
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    train = [r["train_loss"] for r in rows if "train_loss" in r]
    assert len(val) == 2 and len(train) == 2, rows
    assert all(math.isfinite(x) for x in val + train)
    assert 9.0 < val[0] < 11.5  # about ln(50257): an untrained model
    assert val[-1] <= val[0] + 1e-3, val  # two steps never make it worse
    summary = json.loads((ladder_runs[name] / "summary.json").read_text())
    assert summary["preset"] == name and summary["steps"] == 2


def test_ladder_order_and_record():
    assert NAMES[0] == "llmc_baseline" and NAMES[-1] == "record_2025_08"
    assert len(set(NAMES)) == len(NAMES) >= 15
    assert RUNGS[-1].build is record
    assert [r.parent for r in RUNGS] == [None] + NAMES[:-1]
    dates = [r.date for r in RUNGS]
    assert dates == sorted(dates)
    for name in ["llmc_baseline", "adamw_rotary", "muon", "modern_arch", "untied_head", "value_skips", "unet",
                 "flex_attention", "window_warmup", "value_embeds", "long_short", "fp8_head", "smaller_batch",
                 "bos_align", "record_2025_08"]:
        assert name in NAMES


@pytest.mark.parametrize("rung", RUNGS[1:], ids=NAMES[1:])
def test_rung_changes_exactly_what_it_claims(rung):
    parent = get_rung(rung.parent).build()
    cfg = rung.build()
    assert cfg.name == rung.name
    assert set(diff(parent, cfg)) == set(rung.changes)
    assert set(rung_diff(rung)) == set(rung.changes)


@pytest.mark.parametrize("rung", RUNGS, ids=NAMES)
def test_rung_data_matches_its_config(rung):
    cfg = rung.build()
    for w in (1, 8):
        validate(cfg, w)  # runs on 1 and on 8 GPUs
    assert cfg.train.batch_seqs * cfg.train.seq_len == rung.tokens_per_step
    assert rung.record_steps in (None, cfg.train.steps)
    assert rung.record_time_min > 0 and rung.description and len(rung.date) == 10
    assert registry()[rung.name] is rung.build


def test_historical_facts():
    base, rec = get_rung("llmc_baseline").build(), record()
    assert (base.optim.kind, base.model.activation, base.model.positions, base.model.tied_head) == \
        ("adamw", "gelu", "learned", True)
    assert base.model.padded_vocab == 50257 and base.attention.segment_len == 1024
    assert get_rung("llmc_baseline").tokens_per_step == 524_288 and get_rung("record_2025_08").tokens_per_step == 393_216
    assert get_rung("muon").record_steps is None
    assert diff(get_rung("bos_align").build(), rec).keys() == {"model.attn_gate", "train.steps"}


def test_proxy_steps_match_proxy212_tokens():
    assert PROXY_TOKENS == 83_361_792
    assert proxy_steps("record_2025_08") == 212 and proxy_steps("llmc_baseline") == 159
    for r in RUNGS:
        assert abs(proxy_steps(r) * r.tokens_per_step - PROXY_TOKENS) <= r.tokens_per_step / 2


def test_ablation_is_one_override_and_typos_are_refused():
    cfg = apply_overrides(record(), ["model.value_embeds=0", "model.value_residual=true", "attention.window=none"])
    assert (cfg.model.value_embeds, cfg.model.value_residual, cfg.attention.window) == (0, True, "none")
    with pytest.raises(ConfigError, match="did you mean 'model.value_residual'"):
        apply_overrides(record(), ["model.value_residul=1"])


def test_learned_positions_need_room_for_the_segment_or_the_rows():
    cfg = get_rung("llmc_baseline").build()
    validate(cfg)  # 64K rows of 1024-token segments
    cfg.attention.segment_len = 2048
    with pytest.raises(ConfigError, match="model.max_positions"):
        validate(cfg)


def test_value_residual_mixes_layer0_values():
    from speedrun.model.gpt import GPT, scalar_layout

    cfg = shrink(get_rung("value_skips").build())
    torch.manual_seed(0)
    on = GPT(cfg.model, cfg.attention)
    cfg = shrink(get_rung("value_skips").build())
    cfg.model.value_residual = False
    off = GPT(cfg.model, cfg.attention)
    off.load_state_dict(on.state_dict())  # no parameters of its own: same state
    with torch.no_grad():
        for p in on.parameters():
            p.add_(torch.randn_like(p) * 0.02)
        off.load_state_dict(on.state_dict())
        tok = torch.randint(0, 50257, (256,))
        tgt = torch.randint(0, 50257, (256,))
        w = torch.tensor(1)
        assert not torch.allclose(on(tok, tgt, w), off(tok, tgt, w))
        # with the layer-0 weight (second attention lambda) at zero, it is off again
        attn = scalar_layout(cfg.model.num_layers)["attn"]
        on.scalars[attn.start:attn.stop:2] = 1.0
        on.scalars[attn.start + 1:attn.stop:2] = 0.0
        off.scalars.copy_(on.scalars)
        torch.testing.assert_close(on(tok, tgt, w), off(tok, tgt, w))
    # and layer 0's V gets gradient from the later layers' use of it
    on.scalars.data[attn] = 0.5
    on(tok, tgt, w).backward()
    assert on.scalars.grad[attn][3::2].abs().sum() > 0


def test_cli_table_json_diff_proxy(capsys):
    assert cli.main(["ladder"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in NAMES) and "19,560" in out and "393,216" in out
    assert cli.main(["ladder", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == NAMES and rows[-1]["proxy_steps"] == 212
    assert cli.main(["ladder", "--diff", "unet"]) == 0
    out = capsys.readouterr().out
    assert "model.unet: False -> True" in out and "train.steps: 3242 -> 3000" in out
    assert cli.main(["ladder", "--proxy-steps", "value_embeds"]) == 0
    assert capsys.readouterr().out.strip() == "159"
    assert cli.main(["ladder", "--diff", "record_2025_8"]) != 0
    assert "did you mean 'record_2025_08'" in capsys.readouterr().err


def test_report_tabulates_runs_in_ladder_order(ladder_runs, capsys):
    table = report([ladder_runs["record_2025_08"], ladder_runs["llmc_baseline"], ladder_runs["unet"]])
    lines = table.splitlines()
    assert [ln.split("|")[1].strip() for ln in lines[2:]] == ["llmc_baseline", "unet", "record_2025_08"]
    assert "(vs llmc_baseline)" in lines[3] and "(vs unet)" in lines[4]
    assert cli.main(["ladder", "--report", str(ladder_runs["record_2025_08"])]) == 0
    assert "| record_2025_08 | 2 |" in capsys.readouterr().out
