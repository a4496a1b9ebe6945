"""`speedrun bench` on the 2026 record (bench/record_steps.py): which steps each stage times, the
random documents' lengths, and a whole bench of the CPU demo preset with its report."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import numpy as np
import torch
import pytest

from speedrun.bench import record_steps
from speedrun.data.shards import read_shard, write_shard
from speedrun.config import apply_overrides
from speedrun.recipes.registry import get_preset
from speedrun.train import stages


def test_each_stage_times_even_odd_pairs_inside_itself():
    cfg = get_preset("record")
    bounds = stages.stage_ends(cfg.stages)
    plan = record_steps.stage_steps(cfg, 5)
    assert [k for k, _ in plan] == [0, 1, 2, 3]
    for (k, steps), start, end in zip(plan, bounds, bounds[1:]):
        assert steps[0] % 2 == 0 and start <= steps[0] and steps[-1] < end
        assert steps == list(range(steps[0], steps[0] + len(steps)))
        assert len(steps) == 2 + 2 * 5 or k == 3  # the 15-step extension fits 5 pairs after its odd start
    assert len(plan[3][1]) == 12  # 1270..1284: first even 1270, 2 untimed + 10 timed


def test_a_stage_too_short_for_a_pair_is_left_untimed():
    cfg = get_preset("proxy161")  # its extension is 2 steps (159, 160)
    plan = dict(record_steps.stage_steps(cfg, 3))
    assert plan[3] == [] and len(plan[0]) == 8


def test_random_documents_take_the_given_lengths():
    lengths = np.array([7, 300, 41])
    tokens = record_steps.random_documents(200_000, lengths, seed=1)
    starts = np.flatnonzero(tokens == record_steps.EOT)
    assert starts[0] == 0 and set(np.diff(starts)) <= set(lengths.tolist())
    assert tokens.max() <= record_steps.EOT


def test_corpus_lengths_are_the_bos_gaps(tmp_path):
    tokens = np.full(1000, 5, dtype=np.uint16)
    tokens[[0, 10, 15, 400]] = record_steps.EOT
    write_shard(tmp_path / "fineweb_train_000001.bin", tokens)
    assert record_steps.corpus_doc_lengths(str(tmp_path), "fineweb_train_*.bin").tolist() == [10, 5, 385]
    with pytest.raises(Exception, match="fewer than two document starts"):
        write_shard(tmp_path / "fineweb_train_000001.bin", np.full(1000, 5, dtype=np.uint16))
        record_steps.corpus_doc_lengths(str(tmp_path), "fineweb_train_*.bin")


def test_a_whole_bench_of_the_demo(capsys):
    # the demo's stages at half their tokens and a vocabulary of 512: the mechanics, not the rates (the
    # tables' optimiser steps over the demo's 50,304 rows made a CPU step 3 s)
    overrides = ["stages.val_every=0", "stages.tokens_per_step=1024,1024,1536,1536",
                 "stages.max_doc_len=256,256,384,384", "model.vocab=512", "model.sign_rows=64", "docs.bos=511"]
    args = argparse.Namespace(preset="demo", overrides=overrides, data="random", pairs=1, stages=None, profile=None)
    result = record_steps.run(args, 0.0)
    timed = [s["stage"] for s in result["stages"]]
    assert timed == [0, 1, 2]  # the demo's one-step extension runs at stage 2's rate
    for s in result["stages"]:
        assert s["ms_per_step"] > 0 and len(s["pair_ms"]) == 1 and np.isfinite(s["last_loss"])
    bounds = stages.stage_ends(get_preset("demo").stages)
    rates = [s["ms_per_step"] for s in result["stages"]] + [result["stages"][2]["ms_per_step"]]
    want = sum((b - a) * r for a, b, r in zip(bounds, bounds[1:], rates)) / 1000
    assert result["schedule_s"] == pytest.approx(want)
    assert "the 100-step schedule at these rates" in record_steps.format_report(result)


def test_the_random_shard_is_in_the_config_s_vocabulary(tmp_path):
    cfg = apply_overrides(get_preset("demo"), ["model.vocab=512", "docs.bos=511"])
    record_steps.write_data(tmp_path, cfg, 1, None)
    tokens = read_shard(tmp_path / "bench_train_000000.bin")
    assert tokens.max() == 511 and (tokens == 511).sum() > 1 and tokens[0] == 511


def test_the_profile_runs_the_first_pair_of_each_measured_stage(tmp_path):
    """A stand-in trainer: profiling whole demo steps on the CPU records millions of events (13 GiB)."""
    calls = []
    trainer = SimpleNamespace(device=torch.device("cpu"),
                              train_step=lambda s: calls.append(s) or torch.ones(64, 64) @ torch.ones(64, 64))
    prof = record_steps._profile(trainer, [{"steps": [2, 3, 4, 5]}, {"steps": [12, 13]}], tmp_path / "prof.txt")
    assert calls == [2, 3, 12, 13]
    assert prof["steps"] == 4 and prof["top"] and prof["idle"] is None  # no device on the CPU
    assert "self_cpu_time_total" in (tmp_path / "prof.txt").read_text()


def test_the_schedule_needs_every_stage_but_a_short_extension():
    cfg = get_preset("proxy161")
    bounds = stages.stage_ends(cfg.stages)
    steps = [b - a for a, b in zip(bounds, bounds[1:])]
    full = record_steps.schedule_seconds(cfg, {0: 100.0, 1: 200.0, 2: 300.0, 3: 400.0})
    assert full == pytest.approx(sum(n * r for n, r in zip(steps, (100, 200, 300, 400))) / 1000)
    no_extension = record_steps.schedule_seconds(cfg, {0: 100.0, 1: 200.0, 2: 300.0})
    assert no_extension == pytest.approx(sum(n * r for n, r in zip(steps, (100, 200, 300, 300))) / 1000)
    assert record_steps.schedule_seconds(cfg, {0: 100.0}) is None  # `--stages 0`: no schedule from one stage


def _stage(k: int, loss: float) -> dict:
    return {"stage": k, "tokens_per_step": 8, "windows": [1, 2], "ms_per_step": 1.0, "pair_ms_min": 2.0,
            "pair_ms_max": 2.0, "peak_memory_gib": None, "warm_s": 0.1, "last_loss": loss}


def test_a_broken_step_fails_the_bench_after_its_figures_are_written(monkeypatch, tmp_path, capsys):
    """A NaN loss means the timed step is not the record's (a NaN run went unnoticed in a bench's JSON):
    the report and the JSON are kept, the command fails with one line naming the stage."""
    from speedrun.bench import step

    result = {"preset": "record", "device": "cpu", "world_size": 1, "schedule_s": None, "schedule_steps": 1285,
              "describe": {"micro_steps": 8, "attention_backend": "varlen", "fp8_head": True, "fp8_mlp": True,
                           "compile": True},
              "stages": [_stage(0, 10.3), _stage(2, float("nan"))]}
    assert record_steps.nonfinite_stages(result) == [2]
    monkeypatch.setattr(record_steps, "run", lambda args, t: result)
    args = argparse.Namespace(preset="record", json=str(tmp_path / "b.json"), profile=None)
    assert step.cmd_bench(args) == 1
    out, err = capsys.readouterr()
    assert "10.3000" in out and "nan" in out and (tmp_path / "b.json").exists()
    assert err.strip().splitlines()[-1].startswith("bench: error: the training loss is not finite in stage(s) 2")
    result["stages"][1]["last_loss"] = 3.5
    assert step.cmd_bench(args) == 0
