"""The Gluon attention's kernel variants that change no bit, timed against each other from CUDA graphs:
dQ with Q in registers (DQ_Q_REG), the document ids as int32 rather than int64, and dK/dV's lse, delta and
ids through shared memory (DKDV_SMEM).

usage: PYTHONPATH=src python3 scripts/bench/attn_gluon_variants_bench.py DATA_DIR OUT.json [SECONDS] [ROUNDS] [ARM,...]

Why: offline (scripts/attn_gluon_ptx.py, 2026-12-04) DQ_Q_REG needs 223-235 registers against
201-211 and no stack, and int32 ids take the forward with Q_REG from 202 to 167 registers and the dK/dV
kernel's spill under Triton 3.6 from 48 to 32 bytes. Each is predicted worth a few per cent of its kernel;
this measures them where the model runs them.

The inputs are attn_gluon_bench.py's: one micro-step's 49,152 tokens of the first training shard (its
documents), 6 heads of 128, q, k, v and the output's gradient random, scale 0.12. Per window of
energy_parts.py (long W, short W // 2; W in 2, 6, 10, 14), each arm first checks its outputs against the
plain arm's bit for bit (`same_bits`), then GRAPH_CALLS calls are captured in one CUDA graph and each arm's
replay is timed ROUNDS times in turns (the order reversed every other round, so a drifting clock weighs
on all arms alike), SECONDS each after a second of warm-up, on the card's energy counter
(`energy_parts.energy_of`). Per arm and window: the median µs and joules a call and the ratio to the plain
arm's. Writes OUT.json after every window.

Arms: `bwd` the backward as the model runs it by default (int64 ids), `bwd_dqreg` with DQ_Q_REG, `bwd_i32`
with int32 ids, `bwd_dqreg_i32` both; `bwd_smem` and `bwd_smem_i32` with DQ_Q_REG and dK/dV's lse, delta and
ids through shared memory (DKDV_SMEM; Triton 3.6: 8 and 0 B stack against 48 and 32); `fwd` the default
forward (Q_REG, int64 ids) and `fwd_i32`. ARM,...: only those arms (and the plain `bwd`, `fwd`).
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

# name -> (DQ_Q_REG, int32 ids, DKDV_SMEM)
BWD_ARMS = {"bwd": (0, False, 0), "bwd_dqreg": (1, False, 0), "bwd_i32": (0, True, 0), "bwd_dqreg_i32": (1, True, 0),
            "bwd_smem": (1, False, 1), "bwd_smem_i32": (1, True, 1)}
FWD_ARMS = {"fwd": False, "fwd_i32": True}


def arms(q, k, v, go, docs, lists, names=None):
    """name -> a call of that arm (no arguments; returns its outputs): those of `names` (all when None) and
    the plain arms the ratios are to."""
    docs32 = docs.to(torch.int32)
    o, lse = attn_gluon.launch_forward(q, k, v, docs, lists, SCALE, {"Q_REG": 1})
    fns = {}
    keep = lambda name: names is None or name in names or name in ("bwd", "fwd")  # noqa: E731
    for name, (dq_reg, i32, smem) in BWD_ARMS.items():
        if keep(name):
            fns[name] = lambda dq_reg=dq_reg, d=(docs32 if i32 else docs), smem=smem: attn_gluon.launch_backward(
                go, q, k, v, o, lse, d, lists, SCALE, {"DQ_Q_REG": dq_reg, "DKDV_SMEM": smem})
    for name, i32 in FWD_ARMS.items():
        if not keep(name):
            continue
        fns[name] = lambda d=(docs32 if i32 else docs): attn_gluon.launch_forward(q, k, v, d, lists, SCALE,
                                                                                  {"Q_REG": 1})
    return fns


def same_bits(fns) -> dict[str, bool]:
    """Each arm's outputs against its plain arm's (bwd or fwd), bit for bit."""
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
    """Median µs and joules a call per arm, and the ratios to the plain arm (bwd or fwd)."""
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


def main(data_dir: str, out: str, seconds: float = 1.0, rounds: int = 3, names=None) -> None:
    dev, uuid, counter, shard, docs, s, g, q, k, v = record_inputs(data_dir)
    go = torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16, generator=g).transpose(1, 2)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": T, "seconds": seconds,
           "rounds": rounds, "graph_calls": GRAPH_CALLS, "data": shard, "docs_dtype": str(docs.dtype),
           "windows": {}}
    for w in WINDOWS:
        for kind, win in (("long", w), ("short", max(w // 2, 1))):
            mask = flex_block_mask(s, torch.tensor(win, device=dev, dtype=torch.int32), 128, 64)
            fns = arms(q, k, v, go, docs, attn_gluon.block_lists(mask), names)
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
    main(a[0], a[1], float(a[2]) if len(a) > 2 else 1.0, int(a[3]) if len(a) > 3 else 3,
         a[4].split(",") if len(a) > 4 else None)
