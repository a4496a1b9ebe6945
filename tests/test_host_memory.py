"""CPU runs keep freed tensor memory for reuse (host_memory.py): a freed large block serves the next
allocation that fits without faulting in new pages, where glibc's default unmaps it and the next one
faults in every page afresh. Page faults are counted (getrusage), not timed."""

import subprocess
import sys

import pytest

from speedrun.train import host_memory

_SCRIPT = r'''
import resource, sys, torch
if sys.argv[1] == "keep":
    from speedrun.train.host_memory import keep_freed_blocks
    assert keep_freed_blocks()
faults = []
for i in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones((64 << 20) - i * 4096)  # 256 MiB, then a little less each time: it fits the freed block
    del x
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
'''


def _faults(mode: str) -> list[int]:
    run = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return [int(f) for f in run.stdout.split()]


def test_freed_blocks_are_reused_without_page_faults():
    if not host_memory.keep_freed_blocks():
        pytest.skip("not glibc: nothing to set")
    default, kept = _faults("default"), _faults("keep")
    # glibc's default: every block is new memory, faulted in afresh (65,536 pages, or 128 huge pages)
    assert min(default) > 0, default
    # kept: the first block faults in as before, the later ones reuse its pages
    assert kept[0] >= min(default) and max(kept[1:]) * 50 < min(default[1:]), (default, kept)


def test_a_cpu_run_keeps_freed_blocks(tmp_path, monkeypatch):
    from reliability_helpers import train

    calls = []
    monkeypatch.setattr(host_memory, "keep_freed_blocks", lambda: calls.append(1) or True)
    assert train(tmp_path / "run", steps=1) == 0
    assert calls == [1]
