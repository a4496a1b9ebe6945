"""`speedrun train` and `python -m speedrun.train` (what torchrun launches): arguments, config,
process group and run folder around the `Trainer`, which only trains.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from speedrun.bench.gpu_clocks import RunClocks
from speedrun.compile.session import CompileSession
from speedrun.compile.startup import process_start_time
from speedrun.config import AnyConfig, RecordRunConfig, apply_overrides, validate
from speedrun.errors import ConfigError, SpeedrunError
from speedrun.recipes.registry import get_preset
from speedrun.run.faults import out_of_memory
from speedrun.run.resilience import checkpoint_every_overrides, resume_config, tensorboard_writer
from speedrun.run.rundir import default_out_dir
from speedrun.train.dist import init_distributed, shutdown
from speedrun.run.checkpoint import load_config
from speedrun.train.loop import Trainer
from speedrun.train.record_loop import RecordTrainer
from speedrun.train.stages import scaled


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", help="preset name (speedrun ladder lists them; default: demo, or the resumed run's)")
    p.add_argument("--steps", type=int, help="training steps; every schedule scales with it")
    p.add_argument("--data-dir", help="folder with the shards (default: the preset's; 'demo' = embedded corpus)")
    p.add_argument("--val-tokens", type=int, help="validation tokens (0 = no validation)")
    p.add_argument("--val-every", type=int, help="validate every N steps (0 = only at the end)")
    p.add_argument("--seed", type=int, help="random seed for the initialisation")
    p.add_argument("--out", help="run folder (default: runs/<preset>-<time>)")
    p.add_argument("--overwrite", action="store_true",
                   help="start again in an --out folder that holds a run (finished or not), removing it")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override any config field, e.g. --set model.value_embeds=0 (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    p.add_argument("--checkpoint-every", metavar="N|Mm", help="checkpoint every N steps or M minutes (e.g. 10m)")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep the checkpoints once the run has finished (by default only the final model stays)")
    p.add_argument("--on-fault", choices=("stop", "recover"), help="on a NaN/inf or a loss spike (default: stop)")
    p.add_argument("--tensorboard", action="store_true", help="also log metrics to TensorBoard (needs tensorboard)")


def flag_overrides(args: argparse.Namespace, cfg: AnyConfig) -> list[str]:
    """The flags as `--set` overrides, on the fields that hold them in this record's config. For the
    2026 record --steps N rescales the stages (recipes.presets.record_steps): S and E, not one field."""
    record = isinstance(cfg, RecordRunConfig)
    flags = {"data.data_dir": args.data_dir, "train.seed": args.seed, "train.on_fault": args.on_fault,
             ("docs.val_tokens" if record else "train.val_tokens"): args.val_tokens,
             ("stages.val_every" if record else "train.val_every"): args.val_every}
    if args.steps is not None:
        if record:
            ext = scaled(args.steps, cfg.stages) if args.steps >= 4 else None
            if ext is None:
                raise ConfigError(f"--steps {args.steps}: the 2026 record needs at least 4 steps (3 scheduled + 1)")
            flags.update({"stages.scheduled_steps": ext.scheduled_steps, "stages.extension_steps": ext.extension_steps})
        else:
            flags["train.steps"] = args.steps
    return [f"{k}={v}" for k, v in flags.items() if v is not None]


def resolve_config(args: argparse.Namespace) -> AnyConfig:
    preset = get_preset(args.preset or "demo")
    if args.resume and not args.preset and (Path(args.resume) / "config.json").is_file():
        preset = load_config(Path(args.resume))  # the flags land on the fields of the resumed run's record
    overrides = flag_overrides(args, preset) + checkpoint_every_overrides(args.checkpoint_every) + args.overrides
    if args.resume:
        cfg = apply_overrides(get_preset(args.preset), overrides) if args.preset else None
        return resume_config(Path(args.resume), args.preset, cfg, overrides)
    return apply_overrides(preset, overrides)


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a preset (one process; torchrun -m speedrun.train for several GPUs)")
    add_train_arguments(p)
    p.set_defaults(func=cli_train)


def cli_train(args: argparse.Namespace) -> int:
    t_start = process_start_time()
    cfg = resolve_config(args)
    info = init_distributed()
    trainer, finished = None, False
    try:
        validate(cfg, info.world_size)
        if args.resume and args.out and Path(args.out).resolve() != Path(args.resume).resolve():
            raise ConfigError(f"--out {args.out}: --resume continues in {args.resume}; leave --out out")
        out = Path(args.resume or args.out or default_out_dir(cfg.name))
        kind = RecordTrainer if isinstance(cfg, RecordRunConfig) else Trainer
        session = None if kind is RecordTrainer else CompileSession(cfg, info)
        trainer = kind(cfg, info, out, overwrite=args.overwrite, progress=not args.no_progress, t_start=t_start,
                       resume=Path(args.resume) if args.resume else None,
                       keep_checkpoints=args.keep_checkpoints, session=session,
                       watchers=(RunClocks(info.device),) if info.is_main else ())
        if args.tensorboard:
            trainer.tb = tensorboard_writer(out) if info.is_main else None
        trainer.run()
        finished = True
    except torch.cuda.OutOfMemoryError:
        raise out_of_memory(cfg, info.world_size, getattr(trainer, "phase", "set-up")) from None
    finally:
        if trainer is not None:
            trainer.session.release()
        if getattr(trainer, "guard", None) is not None:
            trainer.guard.close()
        if not finished and getattr(trainer, "out", None) is not None:
            trainer.out.abandon()
        shutdown(clean=finished)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point for `python -m speedrun.train` / torchrun."""
    parser = argparse.ArgumentParser(prog="python -m speedrun.train",
                                     description="Train a preset; launch with torchrun for several GPUs.")
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return cli_train(args)
    except SpeedrunError as e:
        print(f"speedrun: error: {e}", file=sys.stderr)
        return e.exit_code
