"""The 2026 record's Triton kernels compiled for sm_90 without a GPU: do they fit a Hopper SM?

A kernel whose shared memory passes the SM's 232,448 bytes compiles and then fails at its first launch
(`OutOfResources`), which only a GPU run shows. Compiled here with Triton's bundled ptxas at the
record's shapes and the launch's specialisations (`compile_offline` in each module), each is checked
against that limit; the loss kernel also for spills (local memory), which its wide tiles risk.

What this can miss: the amount depends on Triton's version. The DC kernels' dQ kernel before
`5af60c8` needed 180,224 bytes under Triton 3.9 (CI's) and 278,528 under 3.6 (the GPU machine's),
and failed there. To check under another Triton, install it beside the project and put it first:
`pip install --target DIR triton==3.6.0; PYTHONPATH=DIR python -m pytest tests/test_record_kernel_resources.py`.
"""

from __future__ import annotations

import pytest

HOPPER_SHARED = 232_448  # bytes of shared memory a block may use on an H100 or H200


def _usage(kernel) -> dict[str, int]:
    from speedrun.kernels.relu2_gluon import resource_usage
    return resource_usage(kernel.asm["cubin"])


@pytest.fixture(scope="module")
def triton():
    return pytest.importorskip("triton")


@pytest.mark.parametrize("which", ["forward", "dq", "dkdv"])
def test_dc_kernels_fit_hopper_shared_memory(triton, which):
    from speedrun.kernels import record_dc
    kernel = record_dc.compile_offline(which)
    assert 0 < kernel.metadata.shared <= HOPPER_SHARED, kernel.metadata.shared
    assert _usage(kernel)["REG"] <= 255


@pytest.mark.parametrize("grad,pair", [(0, False), (1, False), (2, False), (2, True)])
def test_loss_kernel_fits_without_spills(triton, grad, pair):
    from speedrun.kernels import record_ce
    kernel = record_ce.compile_offline(grad, pair)
    usage = _usage(kernel)
    assert kernel.metadata.shared <= HOPPER_SHARED, kernel.metadata.shared
    assert usage.get("STACK", 0) == 0 and usage.get("LOCAL", 0) == 0, usage
