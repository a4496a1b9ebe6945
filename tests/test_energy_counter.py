"""The NVML energy counter reader (`energy_counter.py`) against a stand-in library, and on a GPU the card's
own counter against the sampled power of the same span."""

import ctypes
import time

import pytest
import torch

from speedrun.bench import energy_counter as ec
from speedrun.bench import gpu_clocks as gc


class FakeNvml:
    """The three NVML entry points the reader calls, with ctypes pointers as the C library takes them."""

    def __init__(self, uuids=("GPU-abc",), energy=(5_000, 12_500), init_rc=0, read_rc=0):
        self.uuids, self.energy, self.init_rc, self.read_rc = uuids, list(energy), init_rc, read_rc
        self.reads = 0

    def nvmlInit_v2(self):
        return self.init_rc

    def nvmlDeviceGetHandleByUUID(self, uuid, handle_ptr):
        if uuid.decode() not in self.uuids:
            return 13  # NVML_ERROR_NOT_FOUND
        handle_ptr.contents.value = 1 + self.uuids.index(uuid.decode())
        return 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle, value_ptr):
        assert isinstance(handle, ctypes.c_void_p) and handle.value >= 1
        if self.read_rc:
            return self.read_rc
        value_ptr.contents.value = self.energy[min(self.reads, len(self.energy) - 1)]
        self.reads += 1
        return 0


def test_the_counter_reads_millijoules_and_a_span_gives_joules_and_watts():
    lib = FakeNvml(energy=(5_000, 5_000, 12_500))
    counter = ec.open_counter("GPU-abc", lib)
    assert counter is not None and lib.reads == 1  # opening checks one read
    times = iter([10.0, 12.5])
    span = ec.Span(counter, lambda: next(times))
    span.start()
    got = span.stop()
    assert got == {"energy_j": pytest.approx(7.5), "seconds": pytest.approx(2.5), "power_w": pytest.approx(3.0)}


def test_no_counter_where_nvml_cannot_give_one():
    assert ec.open_counter(None, FakeNvml()) is None  # no GPU uuid (a CPU device)
    assert ec.open_counter("GPU-other", FakeNvml()) is None  # no such card
    assert ec.open_counter("GPU-abc", FakeNvml(init_rc=9)) is None  # the driver is not loaded
    assert ec.open_counter("GPU-abc", FakeNvml(read_rc=3)) is None  # a card that does not count its energy
    assert ec.open_counter("GPU-abc", object()) is None  # an NVML without these entry points
    assert ec.load_library("libnot-a-real-library.so") is None
    span = ec.Span(None, time.perf_counter)
    span.start()
    assert span.stop() is None


def test_a_failed_read_at_the_end_loses_the_energy_not_the_run():
    lib = FakeNvml(energy=(1_000, 2_000))
    counter = ec.open_counter("GPU-abc", lib)
    span = ec.Span(counter, time.perf_counter)
    span.start()
    lib.read_rc = 15  # NVML_ERROR_GPU_IS_LOST
    assert span.stop() is None


def test_the_clock_sampler_reports_the_counter_and_per_step_prefers_it(tmp_path):
    from test_gpu_clocks import ROWS, _fake_smi

    lib = FakeNvml(uuids=("GPU-test",), energy=(0, 0, 2_000_000))  # 2 kJ over the span
    sampler = gc.ClockSampler("GPU-test", interval_s=0.01, smi=_fake_smi(tmp_path, ROWS),
                              counter=ec.open_counter("GPU-test", lib))
    assert sampler.start()
    deadline = time.monotonic() + 60
    while len(sampler.rows) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    s = sampler.stop()
    assert s["counter"]["energy_j"] == pytest.approx(2000.0) and s["counter"]["seconds"] > 0
    got = gc.per_step(s, 100.0)
    assert got["energy_source"] == "counter"
    assert got["energy_j_per_step"] == pytest.approx(s["counter"]["power_w"] * 0.1)


@pytest.mark.gpu
def test_gpu_counter_agrees_with_the_sampled_power(cuda):
    """On a GPU machine: the card's counter exists, rises while products run, and over a few seconds of
    steady work its mean power is within 15% of nvidia-smi's sampled mean."""
    counter = ec.open_counter(gc.device_uuid(torch.device("cuda")))
    assert counter is not None, "NVML's energy counter could not be read for this GPU"
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(200):  # past the power limiter's settling
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    sampler = gc.ClockSampler(gc.device_uuid(torch.device("cuda")), counter=counter)
    assert sampler.start()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 4.0:
        for _ in range(50):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    s = sampler.stop()
    assert s["counter"]["energy_j"] > 0 and s["counter"]["power_w"] > 100
    assert s["counter"]["power_w"] == pytest.approx(s["power_w_mean"], rel=0.15)
