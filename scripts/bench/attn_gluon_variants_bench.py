"""The Gluon attention's kernels with the document ids as int32 (the model's, where the largest id fits:
`attention.narrow_ids`) against int64 (where it does not), timed against each other from CUDA graphs.

usage: PYTHONPATH=src python3 scripts/bench/attn_gluon_variants_bench.py DATA_DIR OUT.json [SECONDS] [ROUNDS]

Why: the two id types make the same comparisons and give the same bits, but int32 ids hold fewer
registers (the forward 202 -> 167 under Triton 3.6, dK/dV's spill smaller); 0d63ee6 (2026-12-04) measured
the backward 1.2-3.7% and the forward 0.7-1.8% faster with them. This measures the difference where the
model runs the kernels, e.g. under another Triton.

The inputs are attn_gluon_bench.py's: one micro-step's 49,152 tokens of the first training shard (its
documents), 6 heads of 128, q, k, v and the output's gradient random, scale 0.12. Per window of
energy_parts.py (long W, short W // 2; W in 2, 6, 10, 14), each arm first checks its outputs against the
int64 arm's bit for bit (`same_bits`), then GRAPH_CALLS calls are captured in one CUDA graph and each arm's
replay is timed ROUNDS times in turns (the order reversed every other round, so a drifting clock weighs
on all arms alike), SECONDS each after a second of warm-up, on the card's energy counter
(`energy_parts.energy_of`). Per arm and window: the median µs and joules a call and the ratio to the int64
arm's. Writes OUT.json after every window.

Arms: `fwd` and `bwd`, the forward and the backward with int64 ids; `fwd_i32` and `bwd_i32` with int32.
"""

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attn_gluon_bench import D, GRAPH_CALLS, H, SCALE, T, graphed, record_inputs  # noqa: E402
from energy_parts import WINDOWS, energy_of  # noqa: E402

from speedrun.kernels import attn_gluon
from speedrun.model.attention import flex_block_mask  # noqa: E402


def arms(q, k, v, go, docs, lists):
    """name -> a call of that arm (no arguments; returns its outputs): the forward and the backward with
    docs (int64) and with them as int32."""
    o, lse = attn_gluon.launch_forward(q, k, v, docs, lists, SCALE)
    fns = {}
    for suffix, d in (("", docs), ("_i32", docs.to(torch.int32))):
        fns["fwd" + suffix] = lambda d=d: attn_gluon.launch_forward(q, k, v, d, lists, SCALE)
        fns["bwd" + suffix] = lambda d=d: attn_gluon.launch_backward(go, q, k, v, o, lse, d, lists, SCALE)
    return fns


def same_bits(fns) -> dict[str, bool]:
    """Each arm's outputs against its int64 arm's (bwd or fwd), bit for bit."""
    base = {"bwd": fns["bwd"](), "fwd": fns["fwd"]()}
    return {name: all(torch.equal(a, b) for a, b in zip(fn(), base[name[:3]])) for name, fn in fns.items()}


def timed_rounds(graphs, counter, uuid, seconds, rounds) -> dict[str, list[dict]]:
    """Each graph's replay timed `rounds` times in turns, the order reversed every other round."""
    names = list(graphs)
    out = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            m = energy_of(graphs[n], counter, uuid, seconds)
            out[n].append({"us": m["us"] / GRAPH_CALLS,
                           "j": None if m["j"] is None else m["j"] / GRAPH_CALLS, "mhz": m.get("mhz_median")})
    return out


def summary(times: dict[str, list[dict]]) -> dict[str, dict]:
    """Median µs and joules a call per arm, and the ratios to the int64 arm (bwd or fwd)."""
    med = {}
    for n, rows in times.items():
        js = [r["j"] for r in rows if r["j"] is not None]
        med[n] = {"us": statistics.median(r["us"] for r in rows), "j": statistics.median(js) if js else None,
                  "us_all": [round(r["us"], 2) for r in rows]}
    for n, m in med.items():
        base = med[n[:3]]
        m["time_ratio"] = m["us"] / base["us"]
        m["energy_ratio"] = m["j"] / base["j"] if m["j"] and base["j"] else None
    return med


def main(data_dir: str, out: str, seconds: float = 1.0, rounds: int = 3) -> None:
    dev, uuid, counter, shard, docs, s, g, q, k, v = record_inputs(data_dir)
    go = torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16, generator=g).transpose(1, 2)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": T, "seconds": seconds,
           "rounds": rounds, "graph_calls": GRAPH_CALLS, "data": shard, "docs_dtype": str(docs.dtype),
           "windows": {}}
    for w in WINDOWS:
        for kind, win in (("long", w), ("short", max(w // 2, 1))):
            mask = flex_block_mask(s, torch.tensor(win, device=dev, dtype=torch.int32), 128)
            fns = arms(q, k, v, go, docs, attn_gluon.block_lists(mask))
            bits = same_bits(fns)
            graphs = {n: graphed(fn) for n, fn in fns.items()}
            med = summary(timed_rounds(graphs, counter, uuid, seconds, rounds))
            res["windows"][f"{kind}_w{win}"] = {"same_bits": bits, "arms": med}
            for n, m in med.items():
                print(f"{kind}_w{win:<3d} {n:14s} {m['us']:8.1f} us  x{m['time_ratio']:.4f} time  "
                      f"x{m['energy_ratio'] or float('nan'):.4f} energy  same bits {bits[n]}  {m['us_all']}",
                      flush=True)
            Path(out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], float(a[2]) if len(a) > 2 else 1.0, int(a[3]) if len(a) > 3 else 3)
