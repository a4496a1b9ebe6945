"""The 2026 record's precompile children (compile/record_precompile.py): which steps they compile,
when none start, and a child's run on the CPU (uncompiled: the mechanics, not the caches, which only
a GPU run can show)."""

from __future__ import annotations

import torch

from speedrun.compile import record_precompile
from speedrun.recipes.registry import get_preset
from speedrun.train import stages
from speedrun.train.dist import DistInfo


def test_a_child_per_later_stage_or_one_for_all():
    cfg = get_preset("proxy161")
    firsts = list(stages.stage_ends(cfg.stages)[1:4])  # 53, 106, 159: the first steps of stages 1-3
    assert [stages.stage_index(cfg.stages, s) for s in firsts] == [1, 2, 3]
    assert record_precompile.child_steps(cfg, roomy=True) == [[s] for s in firsts]
    assert record_precompile.child_steps(cfg, roomy=False) == [firsts]


def test_no_child_on_the_cpu_or_when_switched_off(tmp_path):
    cfg = get_preset("proxy161")
    assert record_precompile.start(cfg, DistInfo(0, 1, 0, torch.device("cpu")), tmp_path) == []
    cfg.train.precompile = False
    assert record_precompile.start(cfg, DistInfo(0, 1, 0, torch.device("cuda")), tmp_path) == []


def test_a_child_runs_each_stage_s_micro_step(capsys):
    cfg = get_preset("demo")
    steps = [s for s in stages.stage_ends(cfg.stages)[1:3]]
    record_precompile.run_child(cfg, torch.device("cpu"), 1, steps, compiled=False)
    out = capsys.readouterr().out
    assert [f"stage {k} (step {s})" in out for k, s in zip((1, 2), steps)] == [True, True]
