"""Per-call time of the head's CE gradient in both layouts (ce_grad_gluon.py) against the kernel-and-copy pair.

At one micro-step of the record (49,152 x 50,304; z and the row sums from the Gluon head kernel, as in
training), timed in turns on a settled clock (`cuda_timing.interleaved_us`):
- `lean_copy`: the lean CE kernel (row sums given) writing g, then `transpose.transpose_copy` (the path of
  GPUs other than Hopper);
- `both`: `softcap_ce.launch_transposed` (the row kernel, ce_grad_gluon's pass, the target columns: the
  head's path on Hopper);
- `both_<key><value>`: the same with one ce_grad_gluon.CONFIG entry changed;
- the parts: `lean`, `copy`, `rows`, `pass` (the Gluon kernel alone), `targets`.
Before timing, each variant's g and g^T are compared with the pair's bytes.

  PYTHONPATH=src python3 scripts/bench/ce_both_layouts_bench.py OUT.json     (on an H200)
"""

import json
import sys

import torch

from cuda_timing import interleaved_us

VARIANTS = {"both_t4w4": {"TPC": 4, "num_warps": 4}, "both_t16w16": {"TPC": 16, "num_warps": 16},
            "both_t4w4_c16": {"TPC": 4, "num_warps": 4, "CPT": 16}}


def inputs(m=49152, n=50304, k=768):
    from speedrun.kernels import head_gluon

    gen = torch.Generator("cuda").manual_seed(0)
    x = (torch.randn(m, k, generator=gen, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    z = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    rowsums = torch.empty(m, head_gluon.rowsum_tiles(n), device="cuda")
    head_gluon.launch(x, w, torch.full((), 0.25, device="cuda"), z, rowsums)
    t = torch.randint(0, 50257, (m,), generator=gen, device="cuda")
    return z, t, rowsums


def main(out_path):
    from speedrun.kernels import ce_grad_gluon as G
    from speedrun.kernels import softcap_ce as sc
    from speedrun.kernels import transpose

    DEFAULT = dict(G.CONFIG)
    z, t, rs = inputs()
    N, V = z.shape
    mul, half = 448.0, sc.LEAN_CONFIG["BLOCK_V"] // 2
    u = lambda x: x.view(torch.uint8)  # noqa: E731
    _, g0 = sc.launch(z, t, 30.0, "sigmoid", True, torch.float8_e5m2, mul, rs)
    g0t = transpose.transpose_copy(g0)
    checks = {}
    for name, cfg in {"both": {}, **VARIANTS}.items():
        G.CONFIG.clear()
        G.CONFIG.update(DEFAULT, **cfg)
        _, g1, g1t = sc.launch_transposed(z, t, 30.0, torch.float8_e5m2, mul, rs)
        checks[name] = bool(torch.equal(u(g1), u(g0)) and torch.equal(u(g1t), u(g0t)))
        print(f"check {name}: bytes equal {checks[name]}", flush=True)
        del g1, g1t
    G.CONFIG.update(DEFAULT)
    shift, losses = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")
    g, gt = torch.empty_like(g0), torch.empty_like(g0t)

    def rows():
        sc._ce_rows_kernel[(N,)](z, t, losses, shift, rs, z.stride(0), 30.0, 1 / 7.5, mul, rs.shape[1], V=V,
                                 IGNORE=sc.IGNORE_INDEX, BLOCK_V=sc.LEAN_CONFIG["BLOCK_V"], POLY=sc.LEAN_CONFIG["POLY"],
                                 FAST=True, ROWSUMS=True, RS_BLOCK=256, num_warps=sc.LEAN_CONFIG["num_warps"])

    def targets():
        sc._ce_target_kernel[((N + 255) // 256,)](z, t, shift, g, gt, N, z.stride(0), 30.0, 1 / 7.5, mul, V=V,
                                                  IGNORE=sc.IGNORE_INDEX, BLOCK=256)

    rows()
    fns = {"lean_copy": lambda: transpose.transpose_copy(sc.launch(z, t, 30.0, "sigmoid", True, torch.float8_e5m2, mul,
                                                                   rs)[1]),
           "both": lambda: sc.launch_transposed(z, t, 30.0, torch.float8_e5m2, mul, rs)}
    for name, cfg in VARIANTS.items():
        fns[name] = lambda cfg=cfg: G.launch(z, shift, g, gt, 30.0, 1 / 7.5, half, cfg)
    fns.update(lean=lambda: sc.launch(z, t, 30.0, "sigmoid", True, torch.float8_e5m2, mul, rs),
               copy=lambda: transpose.transpose_copy(g0), rows=rows,
               **{"pass": lambda: G.launch(z, shift, g, gt, 30.0, 1 / 7.5, half)}, targets=targets)
    us = interleaved_us(fns, rounds=30, calls=3)
    for name, value in us.items():
        print(f"{name:12s} {value:9.1f} us", flush=True)
    gb = (z.numel() * 2 + 2 * g0.numel()) / 1e9
    print(f"pass moves {gb:.2f} GB: {gb / us['pass'] * 1e6 / 1e3:.2f} TB/s", flush=True)
    json.dump({"us": us, "checks": checks, "device": torch.cuda.get_device_name(),
               "note": "both_* variants time the Gluon pass alone (compare with 'pass')"}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
