"""Small host values (a step's learning rates, loss weights) onto the device without a wait.

`torch.tensor(values, device="cuda")` copies from pageable host memory, and CUDA makes the host wait
for every queued kernel before such a copy: one of them in an optimiser step stops the host from
running ahead, so everything it does next (the next step's batches, the eager launches) leaves the
device idle. On an H100 the record's NorMuon did six a step, each waiting out the backward (profiled
2026-12-06). Staged through pinned memory the copy is queued like a kernel; PyTorch's pinned-memory
allocator keeps the staging buffer until the copy has run.
"""

from __future__ import annotations

from typing import Sequence

import torch


def host_to_device(values: float | Sequence[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`torch.tensor(values, dtype)` on `device`, queued behind the device's work rather than waiting for it."""
    t = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
