"""Every preset and ladder rung resolves to the config and parameter count recorded in
tests/golden/presets.json (2026-12-05; the 2025-08 record's `record` and `demo` renamed `record_2025_08` and
`demo_2025_08` when the 2026 record took the names, the 2026 presets added the same day). A change to the package's shape or to a default must not move a
rung: a field that goes must be retired at the value the rung had (`config.RETIRED`), and a field
that comes, or a changed value, needs the recording updated on purpose, with the reason in the commit."""

import json
from pathlib import Path

import pytest

from speedrun.config import RETIRED
from speedrun.recipes.registry import parameter_count, registry

RECORDED = json.loads((Path(__file__).with_name("golden") / "presets.json").read_text())


def test_the_same_presets_exist():
    assert sorted(registry()) == sorted(RECORDED)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_a_preset_resolves_as_recorded(name):
    cfg = registry()[name]()
    now, then = json.loads(json.dumps(cfg.to_dict())), RECORDED[name]["config"]
    for section, fields in then.items():
        if not isinstance(fields, dict):
            assert now[section] == fields, section
            continue
        for field, value in fields.items():
            path = f"{section}.{field}"
            if field in now[section]:
                assert now[section][field] == value, path
            else:
                assert path in RETIRED and RETIRED[path] == value, f"{path} went without being retired at {value!r}"
        added = set(now[section]) - set(fields)
        assert not added, f"new fields in {section}: {sorted(added)} (record them in tests/golden/presets.json)"
    assert parameter_count(cfg) == RECORDED[name]["parameters"]
