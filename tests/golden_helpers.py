"""Golden figures: a few training steps' losses and gradient checksums of a preset on random tokens.

A change that should not touch the math (moving code, deleting a switch, adopting a kernel as the code)
must leave these figures as they were. They come from the trainer exactly as a run builds it (its warm-up
and restore included), so every fast path the default takes is in them. Recorded figures live in
tests/golden/*.json: `golden_helpers.py run` records one run's figures, twice in two processes, and
`golden_helpers.py merge` makes them one case, the second run kept as the spread the old code has
between two runs of its own.
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
from pathlib import Path

import torch

GOLDEN = Path(__file__).with_name("golden")


def _checksum(model: torch.nn.Module) -> list[float]:
    """Per-parameter float64 sums of the gradient, in the model's parameter order: any changed bit of a
    gradient changes its sum (short of an exactly cancelling pair)."""
    return [p.grad.double().sum().item() if p.grad is not None else 0.0 for p in model.parameters()]


def figures(preset: str, steps: int, overrides: list[str] = ()) -> dict:
    """Losses and gradient checksums of the first `steps` steps of `preset` on random tokens."""
    from speedrun.bench.step import write_random_data
    from speedrun.config import apply_overrides
    from speedrun.train.dist import init_distributed
    from speedrun.recipes.registry import get_preset
    from speedrun.train.loop import Trainer

    cfg = apply_overrides(get_preset(preset), ["train.warmup_steps=1", "train.val_tokens=0", *overrides])
    info = init_distributed()
    with tempfile.TemporaryDirectory() as tmp:
        write_random_data(Path(tmp) / "data", cfg, steps, info.world_size, seed=cfg.train.seed)
        cfg.data.data_dir = str(Path(tmp) / "data")
        cfg.data.train_pattern, cfg.data.val_pattern = "bench_train_*.bin", "bench_val_*.bin"
        trainer = Trainer(cfg, info, Path(tmp) / "run", progress=False)
        try:
            sums: list[list[float]] = []
            before = trainer.guard.before_update

            def record(step: int) -> None:
                before(step)
                if trainer.guard.active:
                    sums.append(_checksum(trainer.model))

            trainer.guard.before_update = record
            trainer.warm_up()
            trainer.guard.start()
            losses = [trainer.train_step(s).item() for s in range(steps)]
        finally:
            trainer.session.release()
            trainer.loader.close()
            trainer.guard.close()
            trainer.out.close()
    return {"preset": preset, "overrides": list(overrides), "losses": losses, "grad_sums": sums}


def load(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.json").read_text())


def machine() -> dict:
    """What the bits depend on besides the code. On a CPU that includes the processor's family and model:
    the BLAS picks its kernels by microarchitecture, so two "AVX512" machines add in different orders
    (an Emerald Rapids, family 6 model 207, moved the demo's third loss by 5e-7 of it against the
    machine that recorded it; measured 2026-12-06)."""
    import triton

    if torch.cuda.is_available():
        return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    return {"cpu": torch.backends.cpu.get_cpu_capability(), "cpu_model": _cpu_model(), "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def _cpu_model() -> str:
    """"vendor family model" from /proc/cpuinfo (Linux), else what `platform` knows."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return " ".join(fields.get(k, "?") for k in ("vendor_id", "cpu family", "model"))


def merge(first: dict, second: dict) -> dict:
    """One case from two runs of the same commit in two processes: the first's figures, and the second's
    as `repeat`, whose difference is the default path's own run-to-run spread (GPU atomics)."""
    return {**first, "repeat": {"losses": second["losses"], "grad_sums": second["grad_sums"]}}


def _usage() -> None:
    raise SystemExit("usage: golden_helpers.py run OUT.json PRESET STEPS [SECTION.FIELD=VALUE ...]\n"
                     "       golden_helpers.py merge NAME FIRST.json SECOND.json  (-> tests/golden/NAME.json)")


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) >= 4 and args[0] == "run":
        # As the test does: setting the count (even to its default) also sets the BLAS's own thread
        # count, which can otherwise differ and add in another order (measured 2026-12-06).
        torch.set_num_threads(torch.get_num_threads())
        out = figures(args[2], int(args[3]), args[4:])
        Path(args[1]).write_text(json.dumps({**out, "machine": machine()}, indent=1) + "\n")
    elif len(args) == 4 and args[0] == "merge":
        first, second = (json.loads(Path(a).read_text()) for a in args[2:])
        (GOLDEN / f"{args[1]}.json").write_text(json.dumps(merge(first, second), indent=1) + "\n")
    else:
        _usage()
