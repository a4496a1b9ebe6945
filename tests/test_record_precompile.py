"""The 2026 record's precompile children (compile/record_precompile.py): which steps they compile,
when none start, a child's run on the CPU, and that the graph a child traces is the one the trained
run meets (Dynamo on the CPU, with a backend that records the graphs: whether Inductor's caches then
hit is what only a GPU run shows)."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import torch

from record_standins import dense_kernels

from speedrun.compile import record_precompile
from speedrun.config import RecordRunConfig, apply_overrides
from speedrun.data.shards import write_shard
from speedrun.kernels import record_attention
from speedrun.recipes.presets import record_steps
from speedrun.recipes.registry import get_preset
from speedrun.train import stages
from speedrun.train.dist import DistInfo
from speedrun.train.record_loop import RecordTrainer


def test_a_child_per_later_stage_or_fewer_on_smaller_cards():
    cfg = get_preset("proxy161")
    firsts = list(stages.stage_ends(cfg.stages)[1:4])  # 53, 106, 159: the first steps of stages 1-3
    assert [stages.stage_index(cfg.stages, s) for s in firsts] == [1, 2, 3]
    assert record_precompile.child_steps(cfg, 3) == [[53], [106], [159]]
    assert record_precompile.child_steps(cfg, 2) == [[53], [106, 159]]
    assert record_precompile.child_steps(cfg, 1) == [firsts]
    assert record_precompile.child_steps(cfg, 5) == [[53], [106], [159]]  # never more than the stages
    # an H200 (139 GiB usable), an H100 (79.6), a 40 GiB card
    assert [record_precompile.children_for(g) for g in (139.8, 79.6, 40.0)] == [3, 2, 1]


def test_a_schedule_without_its_extension_compiles_only_the_stages_it_meets():
    cfg = get_preset("proxy161")
    cfg.stages = replace(cfg.stages, extension_steps=0)  # stage 3 would start at step 159, the end
    assert record_precompile.child_steps(cfg, 3) == [[53], [106]]
    assert record_precompile.child_steps(cfg, 2) == [[53], [106]]
    assert record_precompile.child_steps(cfg, 1) == [[53, 106]]


def test_no_child_on_the_cpu_or_when_switched_off(tmp_path):
    cfg = get_preset("proxy161")
    assert record_precompile.start(cfg, DistInfo(0, 1, 0, torch.device("cpu")), tmp_path) == []
    cfg.train.precompile = False
    assert record_precompile.start(cfg, DistInfo(0, 1, 0, torch.device("cuda")), tmp_path) == []


def test_a_child_runs_each_stage_s_micro_step(capsys, tmp_path):
    cfg = get_preset("demo")
    steps = [s for s in stages.stage_ends(cfg.stages)[1:3]]
    record_precompile.run_child(cfg, torch.device("cpu"), 1, steps, compiled=False, done_dir=tmp_path)
    out = capsys.readouterr().out
    assert [f"stage {k} (step {s})" in out for k, s in zip((1, 2), steps)] == [True, True]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"step{s}.done" for s in steps)


def _fake_child(done_dir, steps, code: str) -> subprocess.Popen:
    """A stand-in child running `code` (Python, with `mark(step)` to mark a step done), tracked as
    `start` tracks a real one."""
    script = f"from pathlib import Path\nmark = lambda s: Path({str(done_dir)!r}, f'step{{s}}.done').touch()\n{code}"
    proc = subprocess.Popen([sys.executable, "-c", script])
    record_precompile._track(proc, steps, str(done_dir), "precompile-test.log")
    return proc


def test_the_trainer_goes_on_once_its_stage_is_marked_not_when_the_child_ends(tmp_path):
    """Two children: a stage is ready at its mark while its child still runs (the next stage compiles
    beside the trainer's steps); a child that ends without the mark is reported; `finish` stops what
    still runs at the limit and removes the folder."""
    (tmp_path / "config.json").write_text("{}")
    first = _fake_child(tmp_path, [5], "mark(5)\nimport time; time.sleep(60)")
    second = _fake_child(tmp_path, [9, 12], "import sys; sys.exit(3)")
    procs = [first, second]
    t0 = time.time()
    note = record_precompile.ready(procs, 5, poll_s=0.05)
    assert "step 5's stage ready" in note and first.poll() is None and time.time() - t0 < 30
    assert record_precompile.ready(procs, 5) is None  # one note a stage
    assert record_precompile.ready(procs, 7) is None  # no child compiles it: the trainer does
    assert "failed (exit 3" in record_precompile.ready(procs, 9, poll_s=0.05)
    assert "stopped" in record_precompile.finish(procs, limit_s=0.5)
    assert first.poll() is not None and not tmp_path.exists()


def test_with_one_child_the_trainer_waits_for_its_end(tmp_path):
    """One child (a card under 64 GiB): its later stages do not fit beside the trainer's, so the first
    later stage waits for the child to end, whatever it marked."""
    (tmp_path / "config.json").write_text("{}")
    child = _fake_child(tmp_path, [5, 9], "mark(5)\nimport time; time.sleep(1)")
    note = record_precompile.ready([child], 5, poll_s=0.05)
    assert note.startswith("1 child(ren): done after") and child.poll() == 0
    assert record_precompile.ready([child], 9) is None and not tmp_path.exists()
    assert record_precompile.finish([child]) is None  # reported once, by `ready`


def _tiny_bf16(data) -> RecordRunConfig:
    """A tiny record (vocabulary 128) in bf16 with the FP8 head and MLP, compiled, on `data`."""
    sets = {
        "model.vocab": 128, "model.sign_rows": 64, "model.mlp_hidden": 192, "docs.bos": 127,
        "docs.sets_per_step": 2, "docs.val_tokens": 0, "stages.piece_sets_per_step": 2,
        "stages.tokens_per_step": "512,512,768,768", "stages.max_doc_len": "128,256,256,256",
        "stages.block_tokens": 16, "stages.momentum_warmup_steps": 4, "stages.momentum_cooldown_steps": 2,
        "data.train_pattern": "docs_train_*.bin", "data.data_dir": str(data), "train.sample_tokens": 0,
        "train.dtype": "bfloat16", "train.compile": "on", "train.warmup": "off",
    }
    return apply_overrides(record_steps(get_preset("demo"), 12), [f"{k}={v}" for k, v in sets.items()])


def test_a_child_traces_the_graph_the_trained_run_meets(tmp_path, monkeypatch):
    """The caches serve the trainer only if a child's graph is the trainer's: the same code and the
    same inputs (shapes, dtypes, gradients) at a later stage's first step, although the trainer's model,
    FP8 scales and optimiser tie have trained through the stages before and the child's are fresh."""
    rng = np.random.default_rng(0)
    docs = [np.r_[127, rng.integers(0, 127, rng.integers(20, 300))] for _ in range(300)]
    write_shard(tmp_path / "docs_train_000000.bin", np.concatenate(docs).astype(np.uint16))
    cfg = _tiny_bf16(tmp_path)
    graphs: dict[str, list] = {"trainer": [], "child": []}
    side, real_compile = ["trainer"], torch.compile

    def record(gm, example_inputs):
        meta = [(tuple(t.shape), t.dtype, t.requires_grad) for t in example_inputs if isinstance(t, torch.Tensor)]
        graphs[side[0]].append((gm.code, meta))
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda f, **kw: real_compile(f, backend=record, dynamic=False))
    monkeypatch.setattr(record_attention, "pick", dense_kernels)  # the CPU's reference loops break graphs
    torch._dynamo.reset()
    trainer = RecordTrainer(cfg, DistInfo(0, 1, 0, torch.device("cpu")), tmp_path / "run", progress=False)
    stage2 = stages.stage_ends(cfg.stages)[2]
    for step in range(stage2 + 1):  # through stages 0 and 1 into stage 2's first step
        trainer.train_step(step)
    assert len(graphs["trainer"]) == 3  # one graph per stage met
    torch._dynamo.reset()
    side[0] = "child"
    record_precompile.run_child(cfg, torch.device("cpu"), 1, [stage2])
    assert graphs["child"] == graphs["trainer"][2:]
