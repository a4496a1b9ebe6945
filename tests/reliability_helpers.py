"""Shared by the reliability tests: a tiny float32 demo run through the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from speedrun.cli import main as cli

TINY = [
    "--preset", "demo_2025_08", "--no-progress",
    "--set", "model.num_layers=2", "--set", "model.value_embeds=0", "--set", "model.model_dim=32",
    "--set", "model.num_heads=1", "--set", "model.head_dim=32", "--set", "model.mlp_hidden=64",
    "--set", "model.long_layers=0", "--set", "train.seq_len=128", "--set", "train.batch_seqs=2",
    "--set", "train.val_tokens=256", "--set", "train.val_seq_len=128", "--set", "train.dtype=float32",
    "--set", "train.val_every=3", "--set", "train.sample_tokens=0",
]


def main(argv: list[str], threads: int = 1) -> int:
    """cli.main on `threads` intra-op threads (one is several times faster on a busy 2-core machine; two,
    the CPU's default here, let the kernels that split their work between threads do so), from Dynamo's
    empty in-memory state as a new `speedrun` process starts: the compiled variants of earlier tests'
    runs share the step's code objects and would count against Dynamo's recompile limit (the whole GPU
    suite hit it in test_pdl.py after the compiled runs of three other files)."""
    torch._dynamo.reset()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return cli.main(argv)
    finally:
        torch.set_num_threads(before)


def train(out: Path, *extra: str, steps: int = 8, threads: int = 1) -> int:
    """`speedrun train` on the tiny config; returns the exit code."""
    return main(["train", "--steps", str(steps), "--out", str(out), *TINY, *extra], threads)


def resume(run: Path, *extra: str, threads: int = 1) -> int:
    return main(["train", "--resume", str(run), "--no-progress", *extra], threads)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def curves(run: Path) -> tuple[dict, dict]:
    """({step: train_loss}, {step: val_loss}); each step must appear once."""
    train_l, val_l = {}, {}
    for r in records(run):
        for key, d in (("train_loss", train_l), ("val_loss", val_l)):
            if key in r:
                assert r["step"] not in d, f"step {r['step']} logged twice in {key}"
                d[r["step"]] = r[key]
    return train_l, val_l


def assert_curves_close(run_a: Path, run_b: Path, rel: float = 1e-4) -> None:
    """The two runs logged the same steps, and every train and validation loss agrees to `rel` (the
    compiled step's run-to-run spread: its kernels' sums are not ordered)."""
    import pytest

    (train_a, val_a), (train_b, val_b) = curves(run_a), curves(run_b)
    assert train_a.keys() == train_b.keys() and val_a.keys() == val_b.keys()
    for a, b in ((train_a, train_b), (val_a, val_b)):
        for step in a:
            assert b[step] == pytest.approx(a[step], rel=rel), step


def events(run: Path, kind: str) -> list[dict]:
    return [r for r in records(run) if r.get("event") == kind]


def torchrun(nproc: int, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=nproc -m speedrun.train ARGS` with gloo on the CPU (one
    intra-op thread each); on a timeout the whole process group (torchrun and its workers) is ended."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "speedrun.train", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
