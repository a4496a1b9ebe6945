"""The GPU's own energy counter (NVML's total energy since the driver loaded), read through ctypes.

Why: on an H200 held at its 700 W limit the step time follows the energy a step takes, not its cycles
(`gpu_clocks.py`; measured at 1e8865a, 2026-12-02, and 4ae6d8e, 2026-12-04). Until now that energy
was estimated from nvidia-smi's power readings: each itself an average over about a second, sampled
every 0.25 s. The card also counts the energy it has drawn, in millijoules
(`nvmlDeviceGetTotalEnergyConsumption`, Volta and later). Two reads of that counter give the energy of
the span between them exactly, which makes parts a few seconds long measurable (the per-part energy
script `scripts/bench/energy_parts.py`) and the bench's per-step figure an integral rather than a
sample mean.

How: NVML's C library ships with every driver (`libnvidia-ml.so.1`), so it is opened with ctypes; the
Python bindings (pynvml) are not in every image, which is also why `gpu_clocks` runs nvidia-smi. The
library is passed in (`lib`) so that tests can hand a stand-in. Anything missing (no library, no
device with that UUID, a counter the card does not keep) gives None, never an exception: a timing is
never lost for want of its energy.
"""

from __future__ import annotations

import ctypes

LIBRARY = "libnvidia-ml.so.1"
NVML_SUCCESS = 0


def load_library(name: str = LIBRARY):
    """The NVML shared library, or None where it cannot be opened (no driver: a CPU machine)."""
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


class EnergyCounter:
    """One GPU's energy counter: `read_mj()` is the card's total energy in millijoules (None on error)."""

    def __init__(self, lib, handle: ctypes.c_void_p):
        self.lib, self.handle = lib, handle

    def read_mj(self) -> int | None:
        value = ctypes.c_ulonglong()
        rc = self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.pointer(value))
        return value.value if rc == NVML_SUCCESS else None


def open_counter(uuid: str | None, lib=None) -> EnergyCounter | None:
    """The counter of the GPU nvidia-smi calls `uuid` ("GPU-..."; `gpu_clocks.device_uuid`), or None
    where there is no such GPU, no NVML, or a card that does not count its energy."""
    if uuid is None:
        return None
    lib = lib if lib is not None else load_library()
    if lib is None:
        return None
    try:
        if lib.nvmlInit_v2() != NVML_SUCCESS:
            return None
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.pointer(handle)) != NVML_SUCCESS:
            return None
    except AttributeError:  # an NVML too old to have these entry points
        return None
    counter = EnergyCounter(lib, handle)
    return counter if counter.read_mj() is not None else None


class Span:
    """The energy between `start()` and `stop()`: `stop()` returns joules, or None without a counter
    or where either read failed. `clock` is the timer (time.perf_counter; a stand-in in tests)."""

    def __init__(self, counter: EnergyCounter | None, clock):
        self.counter, self.clock = counter, clock
        self._t0 = self._e0 = None

    def start(self) -> None:
        if self.counter is not None:
            self._e0, self._t0 = self.counter.read_mj(), self.clock()

    def stop(self) -> dict | None:
        """{"energy_j": joules, "seconds": span, "power_w": their ratio}, or None."""
        if self.counter is None or self._e0 is None:
            return None
        e1, t1 = self.counter.read_mj(), self.clock()
        if e1 is None or t1 <= self._t0:
            return None
        joules = (e1 - self._e0) / 1000
        return {"energy_j": joules, "seconds": t1 - self._t0, "power_w": joules / (t1 - self._t0)}
