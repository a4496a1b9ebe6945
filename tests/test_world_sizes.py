"""The same run on 1, 2 and 8 processes: one global batch, the same losses.

The record's machine has 8 GPUs and each rank takes one micro-step; on one
GPU the same global batch is 8 micro-steps of gradient accumulation. This
runs the whole trainer (loader, accumulation, sharded Muon and Adam, the
scalar vector padded to W, validation split over ranks) through torchrun
with gloo on the CPU, float32, and holds W = 2 and W = 8 to W = 1. Only the
order of floating-point sums differs (gradient averaging, loss reduction),
hence a relative tolerance of 1e-4 instead of equality.
"""

import pytest

from reliability_helpers import TINY, curves, torchrun, train

SETTINGS = ["--steps", "3", *TINY, "--set", "train.batch_seqs=8", "--set", "train.val_tokens=1024",
            "--set", "train.warmup_steps=0"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    run = tmp_path_factory.mktemp("w1") / "run"
    assert train(run, *SETTINGS[2:], steps=3) == 0
    return curves(run)


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 8])
def test_world_size_gives_the_same_run(one_process, world_size, tmp_path):
    """W = 2: each rank's four micro-steps add up their gradients in place into its buffers
    (grad_accum.py, eager here) before the sharded optimisers reduce them; W = 8: one micro-step each."""
    run = tmp_path / "run"
    done = torchrun(world_size, "--out", str(run), *SETTINGS)
    assert done.returncode == 0, done.stderr[-3000:]
    (train_ref, val_ref), (train_w, val_w) = one_process, curves(run)
    assert train_w.keys() == train_ref.keys() and val_w.keys() == val_ref.keys()
    for ref, got in ((train_ref, train_w), (val_ref, val_w)):
        for step in ref:
            assert got[step] == pytest.approx(ref[step], rel=1e-4), (world_size, step, got[step], ref[step])
    assert val_w[3] < val_w[0]  # it trained
