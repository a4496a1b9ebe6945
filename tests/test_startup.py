"""Start-up phases, the bytecode note and the re-tuning note."""

import time

from speedrun.compile.startup import StartupPhases, bytecode_note


def test_bytecode_note_only_when_bytecode_is_not_written():
    assert bytecode_note(False, None) is None
    assert bytecode_note(False, "/tmp/pyc") is None
    note = bytecode_note(True, None)
    assert "PYTHONDONTWRITEBYTECODE" in note and "unset it" in note
    assert "PYTHONPYCACHEPREFIX=/tmp/pyc is only read" in bytecode_note(True, "/tmp/pyc")


def test_phases_add_up_to_the_total():
    p = StartupPhases(time.time() - 1.0)
    p.mark("imports")
    time.sleep(0.01)
    p.mark("model")
    p.mark("imports")  # a repeated name adds to its phase
    d = p.as_dict()
    assert list(d) == ["imports", "model"] and d["imports"] >= 1.0 and d["model"] >= 0.01
    assert abs(sum(p.phases.values()) - p.total()) < 1e-6
    assert p.describe().startswith(f"{p.total():.1f} s = imports ")
