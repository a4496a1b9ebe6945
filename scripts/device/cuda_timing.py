"""Median time of one call on the GPU, for the device micro-benchmarks (imported by the scripts beside it)."""

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
