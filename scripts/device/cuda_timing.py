"""Median time of one call on the GPU, for the device micro-benchmarks (imported by the scripts beside it).

`median_us` times what the host and the device do together: events recorded back to back, so a call
whose launches take the host longer than its kernels take the device measures the launches (the
twenty-first session's Muon figure is suspected of that). `device_us` first holds the stream with a
spin kernel (`torch.cuda._sleep`) so that the host has queued the whole call before its start event
fires: the device's own time for it, launch gaps between queued kernels included, host stalls not."""

import statistics

import torch


def median_us(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median microseconds of one call of fn: `warmup` untimed calls, then `reps` calls each between
    two CUDA events (recorded back to back, one synchronisation at the end)."""
    for _ in range(warmup):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev) * 1000


def device_us(fn, reps: int = 20, warmup: int = 3, hold_ms: float = 50.0) -> float:
    """Median microseconds of the device's work for one call of fn, each call queued behind a spin of
    about `hold_ms` (longer than the host needs to launch it) and synchronised after."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    cycles = int(hold_ms * 2.0e6)  # at least hold_ms at any SM clock up to 2 GHz
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times) * 1000
