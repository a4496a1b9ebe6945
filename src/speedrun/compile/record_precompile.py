"""Compile the 2026 record's later stages in child processes while the trainer compiles the first.

The record's step has one compiled graph per stage (train/record_micro.py): four graphs of the whole
model's forward and backward, each about 90-100 s of compilation on an H200 with empty caches, which
one after the other made a cold start of 423 s. They do not depend on one another, so `start`
launches one child per later stage (`python -m speedrun.compile.record_precompile`) as the trainer
begins to build its model. A child builds the same model with the same seams (`record_micro`),
runs one micro-step of its stage's first step on random tokens at the run's shapes and exits; that
fills torch's local compiler caches (Inductor's graph cache and AOTAutograd's, Triton's kernels),
which the trainer shares through the environment. A child marks each stage done (an empty file
per step in a folder of its own) as it finishes it. Before the warm-up's first step of a later stage
the trainer waits for that stage (`ready`): with two children or more, until the child compiling it
has marked it, so that the trainer loads stage 1's graphs while another child still compiles stages
2 and 3 (the trainer's later stage and a child's fit one card of 64 GiB or more beside each other);
with one child, until the child ends. Its own compiles of those graphs are then cache hits, and
`finish` reaps the children at the end of the warm-up. The cold start becomes about one stage's
compile instead of four.

A child computes nothing the run uses. One that fails or is slow costs time, never results: the
trainer then compiles that stage itself. Each child holds a model and one micro-step's activations on
the GPU (16.6 GiB for stage 1 and 24.2 for stages 2 and 3 at the record's size, beside the trainer's
14.6 in stage 0; an H100, 2026-12-07): a card of 120 GiB or more gets a child per stage; one of 64 GiB
or more two, the first later stage alone and the rest in order in the other (stage 3's graph reuses
stage 2's kernels, so it compiles in 47 s after it against 58 for stage 2); a smaller card one child
for all three. With one child, an H100's cold start was 259.5 s, 180.4 s of it the child's three
compiles in turn (75.6 / 57.8 / 47.0 s).
`train.precompile=false` turns them off; they run only where the step is compiled and warmed up.
Rank 0's children write `precompile-stage<k>.log` in the run folder.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from speedrun.compile import precompile
from speedrun.train import stages

CHILDREN_BY_GIB = ((120, 3), (64, 2))  # (card GiB at least, children) beside the trainer; else one


def children_for(total_gib: float) -> int:
    """How many children a card of total_gib holds beside the trainer (module docstring)."""
    return next((n for gib, n in CHILDREN_BY_GIB if total_gib >= gib), 1)


def child_steps(cfg, children: int) -> list[list[int]]:
    """The steps each child compiles: the first step of each later stage; the first children - 1 of
    them one child each, the rest in order in the last child."""
    firsts = [b for b in stages.stage_ends(cfg.stages)[1:stages.N_STAGES + 1] if b < cfg.stages.total_steps]
    alone = max(min(children, len(firsts)) - 1, 0)
    return [[s] for s in firsts[:alone]] + ([firsts[alone:]] if firsts[alone:] else [])


def start(cfg, info, log_dir: Path | None) -> list[subprocess.Popen]:
    """Launch the children for this rank's device (none where `train.precompile` is off or not on a
    GPU); they inherit the environment, so they fill the caches the trainer reads."""
    if not cfg.train.precompile or info.device.type != "cuda":
        return []
    children = children_for(torch.cuda.get_device_properties(info.device).total_memory / 2**30)
    done_dir = tempfile.mkdtemp(prefix="speedrun-record-precompile-")
    cfg_path = os.path.join(done_dir, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg.to_dict(), f)
    procs, groups = [], child_steps(cfg, children)
    for steps in groups:
        name = _log_name(cfg, steps)
        log = open(log_dir / name, "w") if log_dir is not None and info.is_main else subprocess.DEVNULL
        cmd = [sys.executable, "-m", "speedrun.compile.record_precompile", "--config", cfg_path, "--device",
               str(info.device), "--world-size", str(info.world_size), "--done-dir", done_dir,
               "--steps", *map(str, steps)]
        try:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
    for p, steps in zip(procs, groups):
        _track(p, steps, done_dir, _log_name(cfg, steps))
    atexit.register(stop, procs)  # a trainer that fails before waiting leaves no child behind
    return procs


def _track(proc: subprocess.Popen, steps: list[int], done_dir: str, log_name: str) -> None:
    """What `ready`, `finish` and `stop` need of a child: its start, steps, marks' folder and log."""
    proc.t0, proc.steps, proc.done_dir, proc.log_name = time.time(), list(steps), done_dir, log_name
    proc.cfg_path = os.path.join(done_dir, "config.json")
    proc.waited, proc.reported = set(), False


def _log_name(cfg, steps: list[int]) -> str:
    return f"precompile-stage{stages.stage_index(cfg.stages, steps[0])}.log"


def done_mark(done_dir: str | Path, step: int) -> Path:
    """The empty file a child writes once `step`'s graph is in the caches."""
    return Path(done_dir) / f"step{step}.done"


def ready(procs: list[subprocess.Popen], first_step: int, limit_s: float = precompile.WAIT_LIMIT_S,
          poll_s: float = 0.2) -> str | None:
    """Block until the stage that starts at `first_step` is compiled (module docstring): with two
    children or more, until its child marks it, ends or passes limit_s from its start (then it is
    stopped); with one, until the child ends. A note on the first wait for a stage, else None."""
    if len(procs) == 1:
        proc = procs[0]
        if proc.waited:
            return None
        proc.waited.update(proc.steps)
        note = finish(procs, limit_s)
        proc.reported = True  # its end is this note: the warm-up's own `finish` has nothing left to say
        return note
    proc = next((p for p in procs if first_step in p.steps), None)
    if proc is None or first_step in proc.waited:
        return None
    proc.waited.add(first_step)
    mark = done_mark(proc.done_dir, first_step)
    while not mark.exists() and proc.poll() is None and time.time() - proc.t0 < limit_s:
        time.sleep(poll_s)
    if mark.exists():
        return f"step {first_step}'s stage ready after {time.time() - proc.t0:.1f} s"
    return f"step {first_step}'s child " + precompile.wait(proc, limit_s, proc.log_name)


def finish(procs: list[subprocess.Popen], limit_s: float = precompile.WAIT_LIMIT_S) -> str | None:
    """Wait for every child (`precompile.wait`, at most limit_s from its start) and remove their
    folder; how the ones not yet reported by `ready` ended (None if none is left to report)."""
    notes = [precompile.wait(p, limit_s, p.log_name) for p in procs if not p.reported]
    stop(procs)
    return f"{len(notes)} child(ren): " + "; ".join(notes) if notes else None


def stop(procs: list[subprocess.Popen]) -> None:
    """End the children that still run and remove their folder (`precompile.stop`)."""
    for p in procs:
        precompile.stop(p)
        shutil.rmtree(p.done_dir, ignore_errors=True)


# ---------------------------------------------------------------- the child


def run_child(cfg, device: torch.device, world_size: int, steps: list[int], compiled: bool = True,
              done_dir: Path | None = None) -> None:
    """One micro-step forward and backward at each step's shapes, as the trainer's step runs it, each
    marked done in `done_dir` once finished (`compiled` off only in the CPU test of the mechanics)."""
    from speedrun.data.synthetic import random_documents
    from speedrun.data import documents
    from speedrun.data.shards import write_shard
    from speedrun.train.record_micro import MicroLoss, refresh_fp8, setup_model, step_batches
    from speedrun.train.setup import pick_dtype

    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = pick_dtype(cfg.train.dtype, device)
    micro_steps = documents.grad_accum_steps(world_size, cfg.docs)
    model = setup_model(cfg, world_size, device, dtype, micro_steps)
    refresh_fp8(model, cfg, after_step=-1)
    loss = MicroLoss(cfg, model, device, dtype, compiled)
    with tempfile.TemporaryDirectory(prefix="speedrun-record-precompile-") as tmp:
        shard = Path(tmp) / "train_000000.bin"
        tokens = random_documents(4 * max(cfg.stages.tokens_per_step), None, cfg.train.seed, cfg.docs.bos, cfg.model.vocab)
        write_shard(shard, tokens)
        loader = documents.DocumentLoader([shard], 0, world_size, cfg.docs)
        for step in steps:
            plan = stages.step_plan(cfg.stages, step, cfg.docs)
            t0 = time.time()
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="training data wrapped around")
                batch = step_batches(loader, plan, cfg, micro_steps)[0]
            loss(documents.to_device(batch, device), plan).backward()
            model.zero_grad(set_to_none=True)
            peak = ""
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                peak = f", peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB"
            print(f"precompile: stage {plan.stage} (step {step}) in {time.time() - t0:.1f} s{peak}", flush=True)
            if done_dir is not None:
                done_mark(done_dir, step).touch()


def main(argv: list[str] | None = None) -> int:
    from speedrun.config import from_dict

    p = argparse.ArgumentParser(prog="python -m speedrun.compile.record_precompile",
                                description="Compile the 2026 record's later stages (started by the trainer).")
    p.add_argument("--config", required=True, help="the run's config.json")
    p.add_argument("--device", required=True)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--steps", type=int, nargs="+", required=True, help="the steps whose graphs to compile")
    p.add_argument("--done-dir", type=Path, help="where to mark each step done (the trainer waits on it)")
    args = p.parse_args(argv)
    cfg = from_dict(json.loads(Path(args.config).read_text()))
    run_child(cfg, torch.device(args.device), args.world_size, args.steps, done_dir=args.done_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
