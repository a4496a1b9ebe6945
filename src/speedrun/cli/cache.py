"""`speedrun cache`: what the portable compile caches in `$SPEEDRUN_HOME/compile/` were made for.

A cache file is named by a hash of everything that could make it wrong for a run
(`compile_cache.key_parts`), so a folder of them says nothing about itself, and a run
that finds none for its key only prints that key. `speedrun warm` therefore writes each
key's parts beside its files (`<key>.json`); this command lists them and, for a preset,
says which file this machine would load, or which stored file comes nearest and what
differs (a torch or Triton upgrade, another GPU, changed speedrun sources, another
world size or config). Files saved before the records existed are listed without one.
A run that compiles nothing on this machine (train.compile=auto on a CPU) has no
cache, and the check says so, in the words `speedrun warm` refuses with.
Listing reads only small files and imports no compiler; a check with --preset
imports the trainer, for its own rule of when a run compiles.
"""

from __future__ import annotations

import argparse
import shlex

from speedrun.compile import cache as compile_cache


def _size(b: int) -> str:
    return f"{b / 2**20:.2f} MiB" if b else "-"


def table(entries: list[dict]) -> list[str]:
    """One markdown row per stored file."""
    rows = ["| key | preset | made (UTC) | torch | Triton | device | world size | artifacts | speedrun's kernels |",
            "|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        r = e["record"] or {}
        p = r.get("parts", {})
        preset = str(r.get("preset") or "-")
        if r.get("overrides"):
            preset += " " + " ".join(f"--set {o}" for o in r["overrides"])
        cells = [e["key"], preset, r.get("created", "no record"), p.get("torch", "-"), p.get("triton", "-"),
                 p.get("device", "-"), str(p.get("world_size", "-")), _size(e["bytes"]), _size(e["triton_bytes"])]
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return rows


def this_machine(preset: str, overrides: list[str], world_size: int) -> list[str]:
    """Which stored file a run of `preset` on this machine would load, or the nearest and what differs."""
    from speedrun.config import apply_overrides
    from speedrun.recipes.registry import get_preset

    cfg = apply_overrides(get_preset(preset), list(overrides))
    device = compile_cache.run_device()
    where = f"{preset} on this machine ({compile_cache.device_description(device)}, world size {world_size})"
    why = compile_cache.nothing_to_cache(cfg, device)
    if why:  # the reason `speedrun warm` gives too: no advice to run it
        return [f"{where}: no compile cache to make or load: {why}"]
    parts = compile_cache.key_parts(cfg, device, world_size)
    key = compile_cache.key_from_parts(parts)
    head = f"{where}: key {key}"
    if compile_cache.cache_path(key).is_file():
        return [f"{head}: stored; a run loads it"]
    hint = compile_cache.nearest_miss(parts)
    return [f"{head}: no file; `{warm_command(preset, overrides, world_size)}` makes one"] + ([hint] if hint else [])


def warm_command(preset: str, overrides: list[str], world_size: int) -> str:
    """The command that makes the file a run of this preset, these overrides and world size loads."""
    args = " ".join(shlex.quote(a) for o in overrides for a in ("--set", o))
    start = "speedrun" if world_size == 1 else f"torchrun --standalone --nproc_per_node={world_size} -m speedrun.cli"
    return f"{start} warm --preset {shlex.quote(preset)}" + (f" {args}" if args else "")


def cmd_cache(args) -> int:
    check = this_machine(args.preset, args.overrides, args.world_size) if args.preset else []  # bad input first
    entries = compile_cache.stored()
    print(f"compile caches in {compile_cache.cache_dir()}: {len(entries)} file(s)")
    print("\n".join((table(entries) if entries else []) + check))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "cache", help="list the portable compile caches and what each was made for",
        description="List the files `speedrun warm` saved under $SPEEDRUN_HOME/compile/ with the torch, Triton, "
                    "GPU, preset and world size each was made for. With --preset, say which file a run of that "
                    "preset on this machine loads, or the nearest file and what differs. Remove a file by "
                    "deleting <key>.bin, <key>.triton and <key>.json.")
    p.add_argument("--preset", help="also check this preset against the stored files")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="config overrides of the run to check, as in train (repeatable)")
    p.add_argument("--world-size", type=_positive, default=1, help="processes of the run to check (default 1)")
    p.set_defaults(func=cmd_cache)


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of processes, at least 1, not {value!r}")
    return int(value)
