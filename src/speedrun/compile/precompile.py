"""Compile the graphs a run needs after its first step in a second process, during that step.

A cold start compiles, one after the other: the training step (the first
warm-up step, ~77 s on an H200), the FP8 head's own compiled products (on the
first call of the head op, inside that step) and the evaluation graph (at the
first validation, 22-27 s). Only the first has to be on the critical path.
`start` launches `python -m speedrun.compile.precompile` next to the trainer; the
child builds the same model (`train.build_model`, same config, same source
key for torch's local caches) and runs the head op and one evaluation forward
at the run's shapes. That fills torch's local compiler caches
(`TORCHINDUCTOR_CACHE_DIR`, `TRITON_CACHE_DIR`, inherited from the trainer's
environment), so when the trainer gets there its compiles are cache hits.

The child computes nothing the run uses: its tensors are random and its
outputs are dropped. A child that fails or is too slow costs time, never
results: the trainer then compiles as it would have. One child per GPU rank,
for its own device: every rank compiles its own graphs, and with one child
only a rank without one would compile its evaluation graph while the others
wait for it in the validation's all-reduce. Every rank meets at a barrier
after its child, before compiling the evaluation graph. Rank 0's child writes
`precompile.log` in the run folder. `train.precompile=false` turns it off.
No child is started on a warm start: when a run of the same key has already
compiled its evaluation graph into these local caches (`warm_note`, written
by the trainer after its first validation, kept inside torch's cache folder
so that it goes when they go), or when Dynamo's package cache
(`dynamo_cache.py`) holds the run's graphs. There the child cannot save any
compile and its own start-up (~20 s) would only delay the first validation:
measured on an H200, a warm start waited 8.9 s for it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

WAIT_LIMIT_S = 600.0
WARM_FOLDER = "speedrun-warm"


def wanted(cfg, info) -> bool:
    """A compiled GPU run with warm-up steps (without them nothing waits for the child: the graphs
    compile inside the run, after the child would have been stopped)."""
    return cfg.train.precompile and info.device.type == "cuda" and cfg.train.warmup_steps > 0


def warm_note(cfg, info) -> Path:
    """Exists once a run of this config compiled its evaluation graph into these local caches."""
    from speedrun.compile.cache import local_path

    return local_path(WARM_FOLDER, cfg, info.device, info.world_size, info.rank)


def start(cfg, info, log_path: Path | None, warm: bool = False) -> subprocess.Popen | None:
    """Launch the child for this run (None where not wanted, or on a `warm` start: the caches already
    hold the evaluation graph, and the child would only make the first validation wait for it);
    it inherits the environment."""
    if warm or not wanted(cfg, info):
        return None
    fd, cfg_path = tempfile.mkstemp(prefix="speedrun-precompile-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(cfg.to_dict(), f)
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    cmd = [sys.executable, "-m", "speedrun.compile.precompile", "--config", cfg_path,
           "--device", str(info.device), "--world-size", str(info.world_size), "--rank", str(info.rank)]
    try:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        if log is not subprocess.DEVNULL:
            log.close()
    proc.t0, proc.cfg_path = time.time(), cfg_path
    return proc


def wait(proc: subprocess.Popen, limit_s: float = WAIT_LIMIT_S, log: str = "precompile.log") -> str:
    """Wait for the child (at most limit_s from its start); a short note on how it ended."""
    try:
        rc = proc.wait(timeout=max(0.0, limit_s - (time.time() - proc.t0)))
        note = f"done after {time.time() - proc.t0:.1f} s" if rc == 0 else f"failed (exit {rc}; see {log})"
    except subprocess.TimeoutExpired:
        note = f"still running after {limit_s:.0f} s; stopped"
    stop(proc)
    return note


def stop(proc: subprocess.Popen | None) -> None:
    """End the child if it still runs and remove its config file."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    Path(proc.cfg_path).unlink(missing_ok=True)


# ---------------------------------------------------------------- the child


def warm_head(model, cfg, device: torch.device) -> None:
    """The fused FP8 head op, forward and backward, at the training shapes: its FP8
    products are compiled on their own (`fp8._compiled`), on first call."""
    from speedrun.kernels import fp8
    from speedrun.kernels import head

    x = torch.randn(cfg.train.seq_len, cfg.model.model_dim, device=device, dtype=torch.bfloat16)
    if not head.fused_available(model.use_fp8, x, model.impl):
        return
    x = torch.nn.functional.rms_norm(x, (x.shape[-1],))
    w = model.head_weight.detach()
    targets = torch.randint(0, cfg.model.vocab_size, (cfg.train.seq_len,), device=device)
    form = "none" if not cfg.model.logit_softcap else cfg.model.softcap_form
    with torch.no_grad():  # as inside the compiled step: plain tensors, no autograd
        _, grad, x_f8, w_f8, grad_t = torch.ops.speedrun.fp8_softcap_ce(
            x, w.contiguous(), targets, float(cfg.model.logit_softcap), form,
            head.x_scale(x.shape[-1]), fp8.W_SCALE, fp8.GRAD_SCALE, True)
        upstream = torch.full((), 1.0 / cfg.train.batch_seqs, device=device)
        scales = (head.x_scale(x.shape[-1]), fp8.W_SCALE, fp8.GRAD_SCALE)
        torch.ops.speedrun.fp8_mm_backward_prequantized(grad, upstream, x_f8, w_f8, *scales, grad_t)


def warm_eval(step_model, model, cfg, device: torch.device, dtype: torch.dtype) -> None:
    """One evaluation forward at the validation shapes, as `Trainer.evaluate` runs it."""
    from speedrun.train import schedules
    from speedrun.train.setup import resolve_data
    from speedrun.data.loader import val_batches

    _, val_file = resolve_data(cfg)
    if val_file is None:
        return
    t = cfg.train
    inputs, targets = next(val_batches(val_file, t.val_seq_len, t.val_seq_len, 0, 1, device))
    blocks = schedules.window_blocks(0.0, cfg.attention)
    window = torch.full((), blocks, dtype=torch.int32, device=device)
    model.eval()
    with torch.no_grad():
        step_model(inputs, targets, window, dtype).item()


def run_child(cfg, device: torch.device, world_size: int, rank: int = 0) -> None:
    from speedrun.compile import dynamo_cache
    from speedrun.train import grad_accum
    from speedrun.compile.cache import key_local_caches
    from speedrun.train.setup import build_model, pick_dtype

    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = pick_dtype(cfg.train.dtype, device)
    model = build_model(cfg, device, world_size, dtype)
    key_local_caches()  # the same cache keys as the trainer's
    dynamo_cache.enable(cfg, device, world_size, rank)  # the same cache entries' form; never saved here
    step_model = grad_accum.compile_step_model(model, True)  # the trainer's step model, wrapper and all
    for name, fn in (("head", lambda: warm_head(model, cfg, device)),
                     ("evaluation graph", lambda: warm_eval(step_model, model, cfg, device, dtype))):
        t0 = time.time()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        print(f"precompile: {name} in {time.time() - t0:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    from speedrun.config import from_dict

    p = argparse.ArgumentParser(prog="python -m speedrun.compile.precompile",
                                description="Fill the compiler caches for a run's later graphs (started by the trainer).")
    p.add_argument("--config", required=True, help="the run's config.json")
    p.add_argument("--device", required=True)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    args = p.parse_args(argv)
    cfg = from_dict(json.loads(Path(args.config).read_text()))
    t0 = time.time()
    run_child(cfg, torch.device(args.device), args.world_size, args.rank)
    print(f"precompile: finished in {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
