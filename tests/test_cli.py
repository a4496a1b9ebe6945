"""The `speedrun` command itself: its version and the list of every preset."""

from __future__ import annotations

import json
from importlib.metadata import version

import pytest

from speedrun.cli.main import main
from speedrun.recipes.registry import registry


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"speedrun {version('speedrun')}"


def test_presets_lists_every_preset_base_presets_first(capsys):
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = [line.split()[0] for line in lines if line.startswith("  ")]
    assert sorted(listed) == sorted(registry()) and len(listed) == len(registry())  # each once
    assert listed[:7] == ["record", "proxy161", "proxy322", "demo", "record_2025_08", "proxy212", "demo_2025_08"]
    assert listed[7] == "llmc_baseline"
    demo = next(line for line in lines if line.startswith("  demo "))
    assert "The record's architecture at a CPU size" in demo  # the docstring's first line


def test_presets_json(capsys):
    assert main(["presets", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(registry())
    assert rows["record"]["base"] and not rows["record"]["rung"]
    assert rows["record_2025_08"]["base"] and rows["record_2025_08"]["rung"]
    assert rows["proxy212"]["base"] and not rows["proxy212"]["rung"]
    assert rows["muon"]["rung"] and not rows["muon"]["base"] and rows["muon"]["description"].startswith("2024-10-04")
