"""How many device operations a step launches, and the idle time before each kind: read a
`speedrun bench --profile` trace.

usage: python3 scripts/bench/trace_counts.py TRACE.json.gz [STEPS] [TOP]

Every kernel, memset and copy of the trace in device order, grouped by name (first 70 characters): calls a
step, device ms a step, and the idle gaps shorter than 10 µs that end at that kind of operation (the gaps the
GPU spends between back-to-back launches), ms a step. STEPS (default 3) is the profiled step count; TOP
(default 30) the rows printed, most calls first. Then the operations that come right after the memsets: the
4-byte memsets that cuBLAS issues before some of its products show up there.
"""

import gzip
import json
import sys
from collections import Counter

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def device_events(path: str) -> list[dict]:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS), key=lambda e: e["ts"])


def tally(events: list[dict]) -> tuple[Counter, Counter, Counter]:
    calls, busy, short_gaps = Counter(), Counter(), Counter()
    end = None
    for e in events:
        name = e["name"][:70]
        calls[name] += 1
        busy[name] += e["dur"]
        if end is not None and 0 < e["ts"] - end < 10:
            short_gaps[name] += e["ts"] - end
        end = max(end or 0.0, e["ts"] + e["dur"])
    return calls, busy, short_gaps


def main(path: str, steps: int = 3, top: int = 30) -> None:
    events = device_events(path)
    calls, busy, gaps = tally(events)
    print(f"{len(events) / steps:.0f} device operations a step; short gaps {sum(gaps.values()) / steps / 1e3:.2f} ms a step")
    print(f"{'calls/step':>10} {'ms/step':>8} {'gaps ms':>8}  name")
    for name, n in calls.most_common(top):
        print(f"{n / steps:10.1f} {busy[name] / steps / 1e3:8.2f} {gaps[name] / steps / 1e3:8.2f}  {name}")
    after = Counter(events[i + 1]["name"][:60] for i, e in enumerate(events[:-1]) if e["cat"] == "gpu_memset")
    print("\nafter a memset (calls/step):")
    for name, n in after.most_common(8):
        print(f"{n / steps:10.1f}  {name}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:4]))
