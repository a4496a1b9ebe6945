"""Time the 2026 record's loss kernel (`kernels/record_ce.py`) at stage 2's micro-batch on one GPU.

usage: (cd scripts/bench && python3 record_ce_bench.py OUT_JSON)

z: (49152, 50304) bfloat16 logits (randn * 3), three MTP weights and the prefix term, as the record's
training steps have them. For each gradient form (0 none, as validation; 1 bf16; 2 the e5m2 pair the FP8
head reads: the sweeps at form 0's tile, then the pair's tile kernel) the kernel runs at `record_ce.TILES`'
tile and at the others listed here (the tile kernel's, for form 2); each variant's
losses and gradient bytes are compared with the default tile's (the same math: only the order of the
row sums' additions, and the partner of a column in the pair of sigmoids that share a reciprocal, which
a tile's width sets, may differ). Alongside, the bytes' floor: one read of z, and a read and write of an
e5m2 (n, V) through `Tensor.copy_`. CUDA events, median of 20 after 3 warm-up calls (`cuda_timing`).
"""

import json
import sys

import torch

from cuda_timing import median_us
from speedrun.kernels import record_ce

N, V = 49152, 50304
# tiles beyond the defaults: for form 2, the e5m2 pair's tile kernel's (the sweeps keep form 0's tile)
VARIANTS = {0: [(32, 256, 8), (64, 128, 8)],
            1: [(64, 128, 8), (32, 128, 8), (32, 256, 8)],
            2: [(128, 128, 8), (64, 128, 4), (64, 256, 8), (128, 64, 4)]}


def inputs():
    g = torch.Generator(device="cuda").manual_seed(0)
    z = (torch.randn(N, V, device="cuda", generator=g) * 3).to(torch.bfloat16)
    targets = torch.randint(0, V, (N,), device="cuda", generator=g)
    prefix = torch.where(torch.rand(V, device="cuda", generator=g) < 0.5,
                         torch.randint(0, V, (V,), device="cuda", generator=g), -1)
    weights = torch.tensor([1.0, 0.5, 0.25], device="cuda")
    pi = torch.tensor([0.25], device="cuda")
    return z, targets, weights, pi, prefix


def run_form(form: int, args) -> list[dict]:
    want_grad, mult = form > 0, (8.0 if form == 2 else 0.0)
    default = record_ce.TILES[form]
    rows, ref = [], None
    for tile in [default] + [t for t in VARIANTS[form] if t != default]:
        record_ce.TILES[form] = tile
        call = lambda: record_ce.launch(*args, True, want_grad, mult)  # noqa: E731
        out = call()
        if ref is None:
            ref = [t.clone() for t in out]
        row = {"form": form, "tile": tile, "us": median_us(call),
               "loss_max_abs_diff": (out[0] - ref[0]).abs().max().item(),
               "grad_equal": all(torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e5m2 else a,
                                             b.view(torch.uint8) if b.dtype == torch.float8_e5m2 else b)
                                 for a, b in zip(out[1:], ref[1:]))}
        rows.append(row)
        print(row, flush=True)
        del out
    record_ce.TILES[form] = default
    return rows


def bytes_floor(z: torch.Tensor) -> dict:
    """One read of z; one read and one write of an e5m2 (n, V)."""
    src = torch.empty(N, V, device="cuda", dtype=torch.float8_e5m2)
    dst = torch.empty_like(src)
    return {"read_z_us": median_us(lambda: z.sum(dtype=torch.float32)),
            "copy_e5m2_us": median_us(lambda: dst.copy_(src))}


def main(out: str) -> None:
    args = inputs()
    floor = bytes_floor(args[0])
    print(floor, flush=True)
    rows = [row for form in (2, 1, 0) for row in run_form(form, args)]
    json.dump({"shape": [N, V], "default_tiles": {str(k): v for k, v in record_ce.TILES.items()},
               "floor": floor, "rows": rows}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
