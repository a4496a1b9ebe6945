"""The optimisers' step and the block lists' order at the record's shapes: eager against the kernels.

usage: (cd scripts/bench && python3 optim_bench.py OUT_JSON)

One optimiser step (CUDA events, median of 20 after 3 warm-ups), on one GPU, with random gradients;
Muon also as the device's own time (`cuda_timing.device_us`: each step queued behind a spin kernel, so
host launch time is not counted; `muon_*_device_us`):
  adam    DistAdam over the record's Adam tensors: four (50,304 x 768) bfloat16 embedding tables at
          embed_lr, the float32 (50,304 x 768) head, 100 float32 scalars; kernel=torch against triton
  muon    Muon over the record's block matrices: 11 x (4, 768, 768), 12 x (3072, 768), 12 x (768, 3072),
          11 x (6, 12); kernel=torch against triton (Newton-Schulz as configured, "auto")
  order   the eight block lists of one micro-step (two windows x partial/full x keys/queries) of a
          768 x 768 mask: block_order.reference (argsort) against the kernel
"""

import json
import sys

import torch

from cuda_timing import device_us, median_us
from speedrun.kernels import block_order
from speedrun.optim.adam import DistAdam
from speedrun.optim.muon import Muon

V, D = 50304, 768


def adam_params(dev):
    g = torch.Generator(dev).manual_seed(0)
    tables = [torch.nn.Parameter(torch.randn(V, D, generator=g, device=dev).bfloat16()) for _ in range(4)]
    head = torch.nn.Parameter(torch.randn(V, D, generator=g, device=dev) * 0.02)
    scalars = torch.nn.Parameter(torch.ones(100, device=dev))
    return [dict(params=tables, lr=0.6), dict(params=[head], lr=0.008), dict(params=[scalars], lr=0.04)]


def muon_params(dev):
    g = torch.Generator(dev).manual_seed(1)
    shapes = [(4, 768, 768)] * 11 + [(3072, 768)] * 12 + [(768, 3072)] * 12 + [(6, 12)] * 11
    return [torch.nn.Parameter(torch.randn(s, generator=g, device=dev) * 0.02) for s in shapes]


def step_us(opt, params, timer=median_us):
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    return timer(opt.step)


def main(out):
    dev = torch.device("cuda")
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for kernel in ("torch", "triton"):
        groups = adam_params(dev)
        result[f"adam_{kernel}_us"] = step_us(DistAdam(groups, kernel=kernel), [p for g in groups for p in g["params"]])
        params = muon_params(dev)
        result[f"muon_{kernel}_us"] = step_us(Muon(params, kernel=kernel), params)
        result[f"muon_{kernel}_device_us"] = step_us(Muon(params, kernel=kernel), params, device_us)
        print(kernel, result, flush=True)
        del groups, params
        torch.cuda.empty_cache()
    g = torch.Generator(dev).manual_seed(2)
    mats = [torch.rand(768, 768, generator=g, device=dev) < d for d in (0.02, 0.05, 0.02, 0.05)]
    for impl in ("torch", "triton"):
        def eight():
            for m in mats:
                block_order.order(m, True, impl)
                block_order.order(m.T, False, impl)
        result[f"order_{impl}_us"] = median_us(eight)
    print(result, flush=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
