import pytest
import torch


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
