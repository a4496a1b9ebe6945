"""Median time of one call on the GPU, for the device micro-benchmarks (imported by the scripts beside it).

`median_us` times what the host and the device do together: events recorded back to back, so a call
whose launches take the host longer than its kernels take the device measures the launches (the
Muon figure of 2026-12-01, `4343345`, is suspected of that). `device_us` first holds the stream with a
spin kernel (`torch.cuda._sleep`) so that the host has queued the whole call before its start event
fires: the device's own time for it, launch gaps between queued kernels included, host stalls not.

`interleaved_us` is for comparing kernels on a power-capped card. Twenty back-to-back calls of a 0.4 ms
kernel last 8 ms, shorter than the power limiter's settling: on 2026-12-02 (`4fb0892`) the same
ReLU² backward timed 407 µs in one `median_us` pass and 471 µs in the next, seconds later. It keeps the
GPU busy for a warm-up of about a second and then times the candidates in rotating turns with no
synchronisation between them, so that every candidate sees the same settled clock."""

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


def interleaved_us(fns: dict, rounds: int = 40, calls: int = 5, warm_s: float = 1.0) -> dict:
    """Median microseconds of one call of each fn in `fns` (name -> fn): calls of every fn in turn
    until about `warm_s` seconds of device work have run, then `rounds` rounds in which each fn (in an
    order rotated every round) runs `calls` times between two CUDA events; one synchronisation at the
    end. Returns name -> median over the rounds of the per-call time."""
    names = list(fns)
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        for n in names:
            fns[n]()
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        if start.elapsed_time(end) >= warm_s * 1000:
            break
    marks = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls):
                fns[n]()
            b.record()
            marks[n].append((a, b))
    torch.cuda.synchronize()
    return {n: statistics.median(a.elapsed_time(b) for a, b in ev) * 1000 / calls for n, ev in marks.items()}
