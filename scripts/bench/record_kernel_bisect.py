"""Which of the record's kernels makes a training step non-finite? One variant a process, on random
documents, a few steps from the first (Adam's first update is step 1, so its effect shows at step 2).

Each variant is the device's kernel set (`record_attention.pick`) with one seam, or the loss kernel's
PTX special functions, put back on its reference; a variant whose steps stay finite where `default`'s
do not names the kernel. The steps run eagerly unless --compile (a compiled run is minutes a variant).
After each step: the step's loss, the parameters and Adam's pending (even-step) gradients that hold a
NaN or an infinity. If the eager default stays finite, --all runs the compiled step without the loss
kernels and then as it is. Written for 2026-12-07: `8b632af` trained to NaN at step 2 on an H100;
this found the loss kernel's hardware e5m2 cast (only `ce_hand`, `no_head_loss` and `no_loss` stayed
finite; fixed in `101a48d`).

    python scripts/bench/record_kernel_bisect.py default            # one variant: its JSON lines
    python scripts/bench/record_kernel_bisect.py --all OUT.json      # every variant, a process each
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

VARIANTS = {  # name: what goes back to its reference, the likelier culprits first
    "default": "nothing",
    "ce_plain": "the loss kernel's PTX ex2/rcp (tl.exp2 and division instead)",
    "ce_hand": "the loss kernel as the interpreter builds it (also the e5m2 rounding by hand), compiled",
    "ce_tiles": "the e5m2 pair's 128 x 64 tiles (32 x 256 instead, 8f5d585's)",
    "no_head_loss": "the FP8 head's fused loss (the FP8 products, then the bf16 loss kernel)",
    "no_mlp_kernels": "the FP8 MLP's backward kernel",
    "no_dc": "the DC kernels (the reference term)",
    "adam_eager": "RecordAdam's Triton update",
    "normuon_eager": "NorMuon's Triton momentum and update",
    "no_loss": "both loss kernels (the reference loss on float32 logits)",
}


def _trainer(preset: str, compiled: bool, data: str | None):
    """A RecordTrainer of `preset` on random documents, as `speedrun bench` builds it (with `data`, a
    corpus folder, its document lengths)."""
    from speedrun.bench import record_steps
    from speedrun.config import apply_overrides, validate
    from speedrun.recipes.registry import get_preset
    from speedrun.train.dist import init_distributed
    from speedrun.train.record_loop import RecordTrainer

    info = init_distributed()
    tmp = Path(tempfile.mkdtemp(prefix="speedrun-bisect-"))
    (tmp / "data").mkdir()
    base = apply_overrides(get_preset(preset), [f"train.compile={'on' if compiled else 'off'}",
                                                "train.precompile=false"])
    lengths = record_steps.corpus_doc_lengths(data, base.data.train_pattern) if data else None
    cfg = record_steps._config(base, tmp / "data")
    validate(cfg, info.world_size)
    record_steps.write_data(tmp / "data", cfg, 3, lengths)
    return RecordTrainer(cfg, info, tmp / "run", progress=False, t_start=time.time())


def _apply(variant: str, trainer) -> None:
    model = trainer.model
    k = model.kernels
    swaps = {"no_head_loss": dict(head_loss=None), "no_loss": dict(head_loss=None, loss=None),
             "no_dc": dict(dc=None), "no_mlp_kernels": dict(mlp_backward=None)}
    if variant in swaps:
        model.kernels = replace(k, **swaps[variant])
    if variant == "adam_eager":
        trainer.optimizers[1].kernel = "torch"
    if variant == "normuon_eager":
        trainer.optimizers[0].kernel = "torch"


def run_variant(variant: str, preset: str, steps: int, compiled: bool, data: str | None) -> list[dict]:
    import torch

    from speedrun.kernels import choice, record_ce

    if variant == "ce_plain":  # the kernel is built once, on first use: build it now without the PTX
        hip, torch.version.hip = torch.version.hip, "bisect"
        record_ce._build()
        torch.version.hip = hip
    if variant == "ce_hand":  # the interpreter's branches (tl.exp2, 1/x, the rounding by hand) as GPU code
        choice.import_triton(record_ce.__dict__)
        kernel = record_ce._build.__wrapped__(True)
        record_ce._build = lambda: kernel
    if variant == "ce_tiles":
        record_ce.TILES = {**record_ce.TILES, 2: (32, 256, 8)}
    warnings.filterwarnings("ignore")
    trainer = _trainer(preset, compiled, data)
    _apply(variant, trainer)
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    adam = trainer.optimizers[1]
    lines = []
    for step in range(steps):
        t = time.time()
        loss = float(trainer.train_step(step))
        bad = [n for n, p in trainer.model.named_parameters() if not torch.isfinite(p.detach()).all()]
        pending = [names.get(id(p), "?") for p, s in adam.state.items()
                   if "pending_grad" in s and not torch.isfinite(s["pending_grad"]).all()]
        lines.append({"variant": variant, "step": step, "loss": loss, "nonfinite_params": bad[:8],
                      "nonfinite_pending_grads": pending[:8], "seconds": round(time.time() - t, 2)})
        print(json.dumps(lines[-1]), flush=True)
    return lines


def _sweep(a, variants, compiled: bool, timeout: int, results: dict) -> None:
    """Each variant in its own process; its lines into results[name] (name + ' compiled' if compiled)."""
    for v in variants:
        cmd = [sys.executable, __file__, v, "--preset", a.preset, "--steps", str(a.steps)]
        cmd += (["--compile"] if compiled else []) + (["--data", a.data] if a.data else [])
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        name = v + (" compiled" if compiled else "")
        results[name] = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        losses = [round(r["loss"], 4) for r in results[name]]
        print(f"{name:>24}: losses {losses}  ({VARIANTS[v]})", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variant", nargs="?", choices=sorted(VARIANTS), default="default")
    p.add_argument("--all", metavar="OUT.json", help="every variant, each in its own process; the lines to OUT.json")
    p.add_argument("--preset", default="record")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--data", help="a corpus folder whose document lengths the random documents take")
    p.add_argument("--compile", action="store_true", help="the compiled step (minutes a variant)")
    p.add_argument("--timeout", type=int, default=90, help="seconds a variant (with --all)")
    p.add_argument("--compile-timeout", type=int, default=240,
                   help="seconds a compiled variant (with --all, when the eager default stays finite)")
    a = p.parse_args()
    if not a.all:
        run_variant(a.variant, a.preset, a.steps, a.compile, a.data)
        return 0
    results: dict = {}
    _sweep(a, ["default"], a.compile, a.timeout, results)
    default = [r["loss"] for r in results["default" + (" compiled" if a.compile else "")]]
    if default and all(math.isfinite(x) for x in default) and not a.compile:
        # eager steps do not show it: the compiled step with the loss kernels on their reference, and without
        print("the eager default stays finite: compiled variants next", flush=True)
        _sweep(a, ["no_loss", "default"], True, a.compile_timeout, results)
    else:
        _sweep(a, [v for v in VARIANTS if v != "default"], a.compile, a.timeout, results)
    Path(a.all).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
