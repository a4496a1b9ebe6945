"""The step's bfloat16 weight products under cuBLAS and cuBLASLt: time, memsets and split-K reductions.

usage: (cd scripts/bench && python3 mm_blas_bench.py OUT.json)

A profile of the step on 2026-12-02 (`a8f16d9`) found 578 4-byte memsets and 456 split-K reductions a
step around cuBLAS's `nvjet` products, about 5.4 ms/step with their gaps. This times, for each linear
layer's shape at one micro-step's 49,152 tokens, the forward product x·Wᵀ, the input gradient g·W and the
weight gradient gᵀ·x under `torch.backends.cuda.preferred_blas_library` "cublas" (PyTorch's default) and
"cublaslt", in turns on a settled clock (`cuda_timing.interleaved_us`). It counts each call's device
operations with the profiler and compares the two libraries' results (largest absolute difference).
"""

import json
import sys

import torch

from cuda_timing import interleaved_us

N, D = 49_152, 768
SHAPES = {"qkv": (3 * D, D), "o": (D, D), "fc": (4 * D, D), "proj": (D, 4 * D)}  # (out, in) of each weight
LIBS = ("cublas", "cublaslt")


def products(out_f: int, in_f: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(out_f * 7 + in_f)
    x = torch.randn(N, in_f, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16, generator=g) * in_f ** -0.5
    dy = torch.randn(N, out_f, device="cuda", dtype=torch.bfloat16, generator=g)
    return {"fwd": lambda: x @ w.t(), "dx": lambda: dy @ w, "dw": lambda: dy.t() @ x}


def with_lib(lib: str, fn):
    def call():
        torch.backends.cuda.preferred_blas_library(lib)
        return fn()
    return call


def operations(fn) -> dict:
    """The device operations of one call: memsets, split-K reductions, all."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"all": len(names), "memset": sum("emset" in n for n in names),
            "splitk_reduce": sum("splitKreduce" in n for n in names), "kernels": sorted(set(n[:60] for n in names))}


def main(out_path: str) -> None:
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "N": N, "cases": {}}
    fns = {}
    for shape, (out_f, in_f) in SHAPES.items():
        for kind, fn in products(out_f, in_f).items():
            ref = with_lib("cublas", fn)().float()
            other = with_lib("cublaslt", fn)().float()
            case = {"max_abs_diff": (ref - other).abs().max().item(), "bit_equal": bool(torch.equal(ref, other))}
            for lib in LIBS:
                fns[f"{shape}.{kind}.{lib}"] = with_lib(lib, fn)
                case[lib] = operations(fns[f"{shape}.{kind}.{lib}"])
            result["cases"][f"{shape}.{kind}"] = case
            del ref, other
    us = interleaved_us(fns, rounds=30, calls=3)
    torch.backends.cuda.preferred_blas_library("cublas")
    for name, t in us.items():
        shape_kind, lib = name.rsplit(".", 1)
        result["cases"][shape_kind][lib]["us"] = t
    for name, c in result["cases"].items():
        print(f"{name:10s} " + "  ".join(
            f"{lib}: {c[lib]['us']:7.1f} us, {c[lib]['all']} ops ({c[lib]['memset']} memset, "
            f"{c[lib]['splitk_reduce']} split-K)" for lib in LIBS) + f"  max |diff| {c['max_abs_diff']:.3g}", flush=True)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
