"""The `speedrun` console command.

Each subcommand lives in the module that does its job; that module exposes
`register(subparsers)`, which adds its parser and sets `func(args) -> int`.
This file only lists them, so adding a command never touches another's code.
A `SpeedrunError` becomes one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from speedrun.errors import SpeedrunError

# Modules that provide subcommands, in the order `--help` lists them.
COMMAND_MODULES = [
    "speedrun.run.env",  # info
    "speedrun.cli.train",  # train
    "speedrun.cli.presets",  # presets
    "speedrun.recipes.ladder",  # ladder
    "speedrun.cli.data",  # data tokenize | fineweb
    "speedrun.tools.stats",  # stats
    "speedrun.tools.compare",  # compare
    "speedrun.tools.plot",  # plot
    "speedrun.tools.sample",  # sample
    "speedrun.tools.export",  # export hf
    "speedrun.tools.hellaswag",  # eval hellaswag
    "speedrun.tools.tensorboard_log",  # tensorboard
    "speedrun.bench.step",  # bench | warm
    "speedrun.cli.cache",  # cache
]


def version() -> str:
    """The installed distribution's version; the package's own where it runs uninstalled (from a checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("speedrun")
    except PackageNotFoundError:
        from speedrun import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speedrun",
        description="Train, measure and export NanoGPT speedrun models.",
    )
    parser.add_argument("--version", action="version", version=f"speedrun {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return int(args.func(args) or 0)
    except SpeedrunError as e:
        print(f"speedrun: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("speedrun: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
