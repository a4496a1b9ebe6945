"""The Gluon attention (`speedrun.kernels.attn_gluon`) against FlexAttention: agreement, time and energy per call
at the record's shapes.

usage: PYTHONPATH=src python3 scripts/bench/attn_gluon_bench.py DATA_DIR OUT.json [SECONDS] [STAGES,...]

One micro-step's 49,152 tokens from the first training shard in DATA_DIR (its documents, as int32 ids
for the Gluon kernels, as the model hands them), 6 heads of 128, q, k, v random in the model's (1, T, H, D)
memory, scale 0.12. For each window of energy_parts.py (long W and short W // 2, W in 2, 6, 10, 14) the
64-token block mask the model builds (`attention.flex_block_mask`), then per kernel (FlexAttention with the
model's options, `flex_tiles.FLEX_OPTIONS`; the Gluon forward at each ring depth in STAGES, default 2):
- agreement with FlexAttention: the largest |o| and |lse| difference;
- one call's time, joules and clock on a settled power limiter (`energy_parts.energy_of`: a second of
  warm-up, then SECONDS, default 2, between two reads of the energy counter);
- TFLOP/s and J per TFLOP of the tiles the mask visits (4 x 64 x 64 x 128 FLOP a tile and head; x 3.5
  forward + backward, energy_parts.py's count);
- forward + backward (`flex_fb`, `gluon_fb`: FlexAttention's autograd against `attn_gluon.attention`'s),
  with the gradients' agreement (relative norm of the difference, per q, k, v);
- `*_g` rows: flex, gluon2 and gluon_bwd again, GRAPH_CALLS calls captured
  in one CUDA graph and replayed, so the host's launch cost (150-450 µs of Python a Gluon call, about the
  GPU's time at the short windows) does not hold the loop back: the kernels' own time and energy a call.
Writes OUT.json after every row.
"""

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from energy_parts import WINDOWS, energy_of  # noqa: E402

from speedrun.kernels import attn_gluon
from speedrun.bench import energy_counter as ec
from speedrun.bench import gpu_clocks as gc
from speedrun.kernels.flex_tiles import FLEX_OPTIONS, use_sparse_block
from speedrun.model.attention import (  # noqa: E402
    MASK_BLOCK, _compiled_flex, block_structure, document_ids, flex_block_mask, narrow_ids, refined_blocks,
)
from speedrun.data.shards import read_shard  # noqa: E402

T, H, D, SCALE = 49_152, 6, 128, 0.12
GRAPH_CALLS = 8


def graphed(fn, calls: int = GRAPH_CALLS):
    """fn run `calls` times inside one CUDA graph (after one run outside it, on a side stream, as capture
    wants): the graph's replay, to be timed as `calls` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def flop_factor(name: str) -> float:
    """A row's FLOP against the forward's: forward + backward 3.5, the backward alone 2.5."""
    base = name.removesuffix("_g")
    return 3.5 if base.endswith("_fb") else 2.5 if base.endswith("bwd") else 1.0


def record_inputs(data_dir: str):
    """(device, its uuid, its energy counter, the shard's name, docs, their block structure, the generator,
    q, k, v): the documents of the first training shard's first T tokens, q, k, v random from the
    generator (seeded 0; it goes on for whatever else the caller draws) in the model's (1, T, H, D) memory."""
    dev = torch.device("cuda")
    uuid = gc.device_uuid(dev)
    files = sorted(Path(data_dir).glob("fineweb_train_*.bin")) or sorted(Path(data_dir).glob("*.bin"))
    docs = document_ids(torch.from_numpy(read_shard(files[0])[:T].astype("int64"))).to(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16, generator=g).transpose(1, 2) for _ in range(3))
    return dev, uuid, ec.open_counter(uuid), files[0].name, docs, block_structure(docs, 128), g, q, k, v


def main(data_dir: str, out: str, seconds: float = 2.0, stages=(2,)) -> None:
    dev, uuid, counter, shard, docs, s, g, q, k, v = record_inputs(data_dir)
    docs = narrow_ids(docs, T)
    options = FLEX_OPTIONS
    use_sparse_block(MASK_BLOCK, 128, dev)  # the backward's tile choices on the 64-token mask, as the trainer's
    flex = _compiled_flex()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": T, "seconds": seconds,
           "data": shard, "flex_options": options, "rows": {}}
    for w in WINDOWS:
        for kind, win in (("long", w), ("short", max(w // 2, 1))):
            wt = torch.tensor(win, device=dev, dtype=torch.int32)
            mask = flex_block_mask(s, wt, 128)
            partial, full = refined_blocks(s, wt, 128, MASK_BLOCK)
            tflop = (partial.sum().item() + full.sum().item()) * H * 4 * 64 * 64 * D / 1e12
            with torch.no_grad():
                ref, ref_lse = flex(q, k, v, block_mask=mask, scale=SCALE, kernel_options=options, return_lse=True)
                fns = {"flex": lambda m=mask: flex(q, k, v, block_mask=m, scale=SCALE, kernel_options=options)}
                for st in stages:
                    t0 = time.perf_counter()
                    o, lse = attn_gluon.forward(q, k, v, docs, mask, SCALE, {"STAGES": st})
                    torch.cuda.synchronize()
                    first_s = time.perf_counter() - t0
                    agree = {"o_max_abs": (o.float() - ref.float()).abs().max().item(),
                             "lse_max_abs": (lse - ref_lse).abs().max().item(), "first_call_s": first_s}
                    res["rows"][f"{kind}_w{w}_gluon{st}_agreement"] = agree
                    print(f"{kind}_w{w} gluon STAGES={st}: {agree}", flush=True)
                    fns[f"gluon{st}"] = lambda m=mask, st=st: attn_gluon.forward(q, k, v, docs, m, SCALE, {"STAGES": st})
            qkv = [x.detach().requires_grad_() for x in (q, k, v)]
            go = torch.randn(q.shape, device=dev, generator=g).bfloat16()
            lists = attn_gluon.block_lists(mask)
            fb = {"flex_fb": lambda m=mask: torch.autograd.grad(
                      flex(*qkv, block_mask=m, scale=SCALE, kernel_options=options), qkv, go),
                  "gluon_fb": lambda ls=lists: torch.autograd.grad(attn_gluon.attention(*qkv, docs, ls, SCALE), qkv, go)}
            ga, gb = fb["flex_fb"](), fb["gluon_fb"]()
            agree = {n: ((b.float() - a.float()).norm() / a.float().norm()).item() for n, a, b in zip("qkv", ga, gb)}
            res["rows"][f"{kind}_w{w}_grad_agreement"] = agree
            print(f"{kind}_w{w} gradients, gluon against flex (relative): {agree}", flush=True)
            fns.update(fb)
            with torch.no_grad():
                o, lse = attn_gluon.forward(q, k, v, docs, mask, SCALE)
            fns["gluon_bwd"] = lambda o=o, lse=lse, ls=lists: attn_gluon.launch_backward(go, q, k, v, o, lse, docs, ls, SCALE)
            for name in ("gluon2", "gluon_bwd", "gluon_fb"):  # the host's time a call, no waiting for the GPU
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(10):
                    fns[name]()
                host_us = (time.perf_counter() - t0) / 10 * 1e6
                res["rows"][f"{kind}_w{w}_{name}_host_us"] = host_us
                print(f"{kind}_w{w} {name}: host {host_us:.1f} us a call", flush=True)
            for name in ("flex", "gluon2", "gluon_bwd"):
                try:
                    fns[f"{name}_g"] = graphed(fns[name])
                except Exception as e:  # a row lost, not the bench
                    print(f"{kind}_w{w} {name}: no CUDA graph: {type(e).__name__}: {e}", flush=True)
            for name, fn in fns.items():
                r = energy_of(fn, counter, uuid, seconds)
                if name.endswith("_g"):  # one replay is GRAPH_CALLS calls
                    r.update(us=r["us"] / GRAPH_CALLS, j=None if r["j"] is None else r["j"] / GRAPH_CALLS,
                             calls=r["calls"] * GRAPH_CALLS)
                tflop_ = tflop * flop_factor(name)
                r.update(tflop=tflop_, tflops=tflop_ / r["us"] * 1e6, j_per_tflop=r["j"] / tflop_ if r["j"] else None)
                res["rows"][f"{kind}_w{w}_{name}"] = r
                print(f"{kind}_w{w:<3d} {name:8s} {r['us']:8.1f} us {r['tflops']:6.1f} TFLOP/s "
                      f"{r['j'] or float('nan'):7.4f} J {r['j_per_tflop'] or float('nan'):5.2f} J/TFLOP "
                      f"{r['power_w'] or 0:4.0f} W {r['mhz_median'] or 0:5.0f} MHz", flush=True)
                Path(out).write_text(json.dumps(res, indent=1))
    Path(out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], float(a[2]) if len(a) > 2 else 2.0,
         tuple(int(x) for x in a[3].split(",")) if len(a) > 3 else (2,))
