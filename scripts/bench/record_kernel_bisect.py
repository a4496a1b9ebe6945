"""Which of the record's kernels makes a training step non-finite? One variant a process, on random
documents, a few steps from the first (Adam's first update is step 1, so its effect shows at step 2).

Each variant is the device's kernel set (`record_attention.pick`) with one seam, or the loss kernel's
PTX special functions, put back on its reference; a variant whose steps stay finite where `default`'s
do not names the kernel. The steps run eagerly unless --compile (a compiled run is minutes a variant).
After each step: the step's loss, the parameters and Adam's pending (even-step) gradients that hold a
NaN or an infinity. Written for 2026-12-07: `8b632af` trained to NaN at step 2 on an H100, in both
the FP8 and bf16 MLP's benches, where `8f5d585`'s bench had stayed finite on an H200.

    python scripts/bench/record_kernel_bisect.py default            # one variant: its JSON lines
    python scripts/bench/record_kernel_bisect.py --all OUT.json      # every variant, a process each
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

VARIANTS = {  # name: what goes back to its reference
    "default": "nothing",
    "ce_plain": "the loss kernel's PTX ex2/rcp (tl.exp2 and division instead)",
    "ce_hand": "the loss kernel as the interpreter builds it (also the e5m2 rounding by hand), compiled",
    "ce_tiles": "the e5m2 pair's 128 x 64 tiles (32 x 256 instead, 8f5d585's)",
    "no_head_loss": "the FP8 head's fused loss (the FP8 products, then the bf16 loss kernel)",
    "no_loss": "both loss kernels (the reference loss on float32 logits)",
    "no_dc": "the DC kernels (the reference term)",
    "no_mlp_kernels": "the FP8 MLP's up-product and backward kernels",
    "adam_eager": "RecordAdam's Triton update",
}


def _trainer(preset: str, compiled: bool):
    """A RecordTrainer of `preset` on random documents, as `speedrun bench` builds it."""
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
    cfg = record_steps._config(base, tmp / "data")
    validate(cfg, info.world_size)
    record_steps.write_data(tmp / "data", cfg, 3, None)
    return RecordTrainer(cfg, info, tmp / "run", progress=False, t_start=time.time())


def _apply(variant: str, trainer) -> None:
    model = trainer.model
    k = model.kernels
    swaps = {"no_head_loss": dict(head_loss=None), "no_loss": dict(head_loss=None, loss=None),
             "no_dc": dict(dc=None), "no_mlp_kernels": dict(mlp_up=None, mlp_backward=None)}
    if variant in swaps:
        model.kernels = replace(k, **swaps[variant])
    if variant == "adam_eager":
        trainer.optimizers[1].kernel = "torch"


def run_variant(variant: str, preset: str, steps: int, compiled: bool) -> list[dict]:
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
    trainer = _trainer(preset, compiled)
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variant", nargs="?", choices=sorted(VARIANTS), default="default")
    p.add_argument("--all", metavar="OUT.json", help="every variant, each in its own process; the lines to OUT.json")
    p.add_argument("--preset", default="record")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--compile", action="store_true", help="the compiled step (minutes a variant)")
    p.add_argument("--timeout", type=int, default=90, help="seconds a variant (with --all)")
    a = p.parse_args()
    if not a.all:
        run_variant(a.variant, a.preset, a.steps, a.compile)
        return 0
    results = {}
    for v in VARIANTS:
        cmd = [sys.executable, __file__, v, "--preset", a.preset, "--steps", str(a.steps)] + (["--compile"] if a.compile else [])
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout).stdout
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        results[v] = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        losses = [round(r["loss"], 4) for r in results[v]]
        print(f"{v:>15}: losses {losses}  ({VARIANTS[v]})", flush=True)
    Path(a.all).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
