"""Running a Triton kernel's test script on the CPU, through Triton's interpreter.

TRITON_INTERPRET=1 is read when a kernel is defined, so it must not leak into
the pytest process (where GPU tests may compile the real kernels): each
script runs in its own subprocess and prints one line `RESULT <json>` (the
script is source run with `python -c`, so it cannot import this helper),
which the test module's fixture parses once and its tests check.

The scripts share one Inductor cache folder a test process, made empty when the
process first needs it: the scripts compile graphs around speedrun's custom ops,
and Inductor's cache key does not cover an op's fake (meta) kernel, so a graph
cached before such a kernel changed would be reused and fail
(`compile_cache.key_local_caches` guards training runs the same way); within one
pytest process the sources do not change. Sharing it builds Inductor's
precompiled C++ header (about 5 s) and the kernels the scripts have in common once.
"""

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

MARK = "RESULT "


@functools.cache
def _inductor_cache() -> str:
    """This test process's Inductor cache folder for the scripts (module docstring), removed at its exit."""
    path = tempfile.mkdtemp(prefix="speedrun-inductor-")
    atexit.register(shutil.rmtree, path, True)
    return path


def run_interpreted(script: str, *args: str, timeout: int = 600) -> dict:
    """Run `script` (Python source) with TRITON_INTERPRET=1; its RESULT json. Skips without Triton."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", TORCHINDUCTOR_CACHE_DIR=_inductor_cache())
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len(MARK):])
