"""`speedrun presets`: every name `--preset` takes, with what each is.

`speedrun ladder` shows the record's history, so it lists the rungs only and
leaves out `proxy212` and `demo`, the presets most runs use. This lists all of
them from `registry.registry()`: the base presets of presets.py first, then the
ladder's rungs, each with the first line of its function's docstring, so the
list cannot drift from the presets themselves."""

from __future__ import annotations

import argparse
import inspect
import json


def preset_rows() -> list[dict]:
    """[{name, description, base, rung}] in `registry.registry()` order: the base presets (defined in
    presets.py), then the ladder's rungs. `record_2025_08` is both, listed once, with the base presets."""
    from speedrun.recipes.ladder import rungs
    from speedrun.recipes.registry import registry

    rung_names = {r.name for r in rungs()}
    return [{"name": name, "description": (inspect.getdoc(build) or "").split("\n", 1)[0],
             "base": build.__module__ == "speedrun.recipes.presets", "rung": name in rung_names}
            for name, build in registry().items()]


def cmd_presets(args: argparse.Namespace) -> int:
    rows = preset_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows)
    print("base presets:")
    print("\n".join(f"  {r['name']:<{width}}  {r['description']}" for r in rows if r["base"]))
    print("record ladder, oldest first, ending at `record_2025_08` (speedrun ladder shows each rung's change):")
    print("\n".join(f"  {r['name']:<{width}}  {r['description']}" for r in rows if not r["base"]))
    print("Train one: speedrun train --preset NAME; its whole config: speedrun info --preset NAME")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("presets", help="list every preset (base presets and ladder rungs)",
                              description="List every name --preset takes: the base presets, then the rungs "
                                          "of the record ladder, each with one line on what it is.")
    p.add_argument("--json", action="store_true", help="print [{name, description, base, rung}] as JSON")
    p.set_defaults(func=cmd_presets)
