"""The 2026 record's first training steps on a GPU, with the kernels the device's one choice gives: finite.

Each kernel's GPU test holds it to its reference on test inputs; this holds whole steps at the record's
size on a training run's own values, which those inputs can miss: the loss kernel's hardware e5m2 cast
gave the right codes on random logits at 8,192 rows and a non-finite head weight gradient at step 0
of training, so the record trained to NaN at step 2 (2026-12-07, found by
`scripts/bench/record_kernel_bisect.py`). Three steps, eagerly (about 30 s): Adam's first update is
step 1's, so step 2's loss is the first to read it. Random tokens, as `speedrun bench` draws them.
Both MLP forms: bf16 (the default) and FP8 with the delayed scales (the record's own).
"""

from __future__ import annotations

import math
import time

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _eager_trainer(folder, overrides: list[str]):
    """The record's trainer, eager and without precompile children, on random tokens written to
    `folder` as `speedrun bench` draws them (the same tokens for the same config)."""
    from speedrun.bench import record_steps
    from speedrun.config import apply_overrides, validate
    from speedrun.recipes.registry import get_preset
    from speedrun.train.dist import init_distributed
    from speedrun.train.record_loop import RecordTrainer

    info = init_distributed()
    (folder / "data").mkdir(parents=True)
    base = apply_overrides(get_preset("record"), ["train.compile=off", "train.precompile=false", *overrides])
    cfg = record_steps._config(base, folder / "data")
    validate(cfg, info.world_size)
    record_steps.write_data(folder / "data", cfg, 3, None)
    return RecordTrainer(cfg, info, folder / "run", progress=False, t_start=time.time())


@pytest.mark.parametrize("fp8_mlp", [False, True])
def test_the_first_three_steps_and_the_weights_stay_finite(tmp_path, fp8_mlp):
    trainer = _eager_trainer(tmp_path, [f"fp8.mlp={str(fp8_mlp).lower()}"])
    losses = [float(trainer.train_step(step)) for step in range(3)]
    assert all(math.isfinite(x) for x in losses), losses
    bad = [n for n, p in trainer.model.named_parameters() if not torch.isfinite(p.detach()).all()]
    assert not bad, bad


def test_joined_piece_sets_give_the_first_steps_loss(tmp_path):
    """`train.merge_tokens=32768` (the record's default on fewer than eight GPUs): the first stage's sets
    two to a micro-step (batches of 32,768 tokens with empty documents between the sets) give the first
    step's loss of the sets one by one, and finite next steps."""
    losses = {}
    for merge in (0, 32768):
        trainer = _eager_trainer(tmp_path / str(merge), [f"train.merge_tokens={merge}"])
        losses[merge] = [float(trainer.train_step(step)) for step in range(3)]
        del trainer
        torch.cuda.empty_cache()
    assert all(math.isfinite(x) for x in losses[32768]), losses
    assert losses[32768][0] == pytest.approx(losses[0][0], rel=2e-3), losses
