"""Running a Triton kernel's test script on the CPU, through Triton's interpreter.

TRITON_INTERPRET=1 is read when a kernel is defined, so it must not leak into
the pytest process (where GPU tests may compile the real kernels): each
script runs in its own subprocess and prints one line `RESULT <json>` (the
script is source run with `python -c`, so it cannot import this helper),
which the test module's fixture parses once and its tests check.

Each subprocess gets its own empty Inductor cache folder: the scripts compile
graphs around speedrun's custom ops, and Inductor's cache key does not cover
an op's fake (meta) kernel, so a graph cached before such a kernel changed
would be reused and fail (`compile_cache.key_local_caches` guards training
runs the same way).
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest

MARK = "RESULT "


def run_interpreted(script: str, *args: str, timeout: int = 600) -> dict:
    """Run `script` (Python source) with TRITON_INTERPRET=1; its RESULT json. Skips without Triton."""
    pytest.importorskip("triton")
    with tempfile.TemporaryDirectory(prefix="speedrun-inductor-") as cache:
        env = dict(os.environ, TRITON_INTERPRET="1", TORCHINDUCTOR_CACHE_DIR=cache)
        proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                              timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len(MARK):])
