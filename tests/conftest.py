"""Shared test set-up.

Under pytest-xdist each worker takes its share of the cores for torch's intra-op threads (and for the
subprocesses it starts, through OMP_NUM_THREADS): two workers on two cores with two OpenMP threads each
spin on oversubscribed cores, and a CPU training step then runs about three times slower (the demo's
whole bench, two copies side by side on 2 cores: 193 s each, 61 s with one thread each). A test that
needs a given thread count sets it itself.
"""

import os

import pytest
import torch


def pytest_configure(config):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "PYTEST_XDIST_WORKER" in os.environ:
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda")


@pytest.fixture(autouse=True)
def no_process_wide_compile_switch_left_on():
    """A test that leaves Dynamo's package cache switched on in its worker process fails itself,
    rather than a later test of that worker (an in-process run must switch it back off)."""
    yield
    if getattr(torch._dynamo.config, "caching_precompile", False):
        torch._dynamo.config.caching_precompile = False
        pytest.fail("this test left torch._dynamo.config.caching_precompile on", pytrace=False)
