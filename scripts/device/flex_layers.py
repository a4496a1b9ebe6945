"""Which layer runs which FlexAttention kernel, and for how long: read a `speedrun bench --profile` trace.

usage: python3 scripts/device/flex_layers.py TRACE.json.gz

Prints, in launch order, the device kernels whose names contain "flex_attention" (forward and backward)
for the first two micro-steps of the profiled steps, with their durations, so that the n-th forward call
of a micro-step can be matched with the n-th attention layer of the model.
"""

import gzip
import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and "flex_attention" in e.get("name", "")),
                     key=lambda e: e["ts"])
    by_name = defaultdict(list)
    for e in kernels:
        by_name[e["name"]].append(e["dur"])
    for name, durs in by_name.items():
        print(f"{len(durs):5d} calls, mean {sum(durs) / len(durs):8.1f} us  {name}")
    print("\nfirst 48 in order (name suffix, us):")
    for e in kernels[:48]:
        kind = "bwd" if "backward" in e["name"] else "fwd"
        print(f"  {kind} {e['name'].rsplit('_', 1)[-1]:>4s} {e['dur']:8.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
