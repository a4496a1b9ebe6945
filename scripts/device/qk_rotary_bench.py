"""QK RMS-norm + rotary on the GPU: compiled PyTorch against the fused Triton kernels (speedrun.qk_rotary).

usage: python scripts/device/qk_rotary_bench.py --out DIR [--T 49152] [--iters 50]

One attention layer of the record: B=1, H=6, D=128, bfloat16, q and k views
into a (1, T, 18, 128) projection as `Attention.project` takes them, cos/sin
gathered from `Rotary(128, "half_truncated")`'s table. Times (CUDA events,
median of --iters calls after a warm-up):

* the reference compiled with torch.compile(fullgraph=True), and the Triton op
  wrapped in the same compiled function: forward (grad enabled, as in
  training) and forward + backward (gradient with respect to the projection);
* the Triton kernels alone (the forward op, the backward op) for a sweep of
  `qk_rotary.KERNEL_CONFIG` variants, with their effective bandwidth.

Checks the kernels against the eager reference on the GPU (forward) and
against float64 autograd of the same math (gradients; eager bfloat16 autograd
shown beside it) and prints the errors. Writes DIR/qk_rotary_bench.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from cuda_timing import median_us
from speedrun import qk_rotary as qr
from speedrun.model import Rotary

B, H, D = 1, 6, 128
FWD_VARIANTS = [(2, 2), (4, 2), (4, 4), (8, 4), (8, 8), (16, 8)]  # (BLOCK_T, num_warps)
BWD_VARIANTS = [(2, 2), (2, 4), (4, 4), (4, 8), (8, 4), (8, 8)]


def errors(got, ref) -> dict:
    """Max abs error, that over max|ref|, max |err|/|ref| where |ref| > 1e-3 max|ref|, fraction of elements that differ."""
    out = {"max_abs": 0.0, "rel_to_max": 0.0, "max_rel": 0.0, "frac_differ": 0.0}
    for a, b in zip(got, ref):
        a, b = a.double(), b.double()
        d, top = (a - b).abs(), b.abs().max()
        big = b.abs() > 1e-3 * top
        out["max_abs"] = max(out["max_abs"], d.max().item())
        out["rel_to_max"] = max(out["rel_to_max"], (d.max() / top).item())
        out["max_rel"] = max(out["max_rel"], (d[big] / b.abs()[big]).max().item())
        out["frac_differ"] = max(out["frac_differ"], (d > 0).double().mean().item())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--T", type=int, default=49152)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    T, iters = args.T, args.iters
    dev = torch.device("cuda")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    qkv = torch.randn(B, T, 3 * H, D, device=dev, dtype=torch.bfloat16).requires_grad_()
    q, k, _ = qkv.view(B, T, 3 * H, D).chunk(3, dim=-2)
    rot = Rotary(D, "half_truncated").to(dev)
    rot.build_table(T)
    cos, sin = rot.angles(torch.arange(T, device=dev), T)
    gq, gk = (torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    default_cfg = dict(qr.KERNEL_CONFIG)
    result = {"T": T, "B": B, "H": H, "D": D, "dtype": "bfloat16", "iters": iters,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "default_config": default_cfg}

    # ---------------------------------------------------------------- correctness (default config)
    qd, kd = q.detach(), k.detach()
    got = torch.ops.speedrun.qk_norm_rotary(qd, kd, cos, sin)
    ref = qr.reference(qd, kd, cos, sin)
    q1, k1 = qd.clone().requires_grad_(), kd.clone().requires_grad_()
    g_triton = torch.autograd.grad(qr.qk_norm_rotary(q1, k1, cos, sin, impl="triton"), (q1, k1), (gq, gk))
    g_eager = torch.autograd.grad(qr.reference(q1, k1, cos, sin), (q1, k1), (gq, gk))
    q64, k64 = qd.double().requires_grad_(), kd.double().requires_grad_()
    g64 = torch.autograd.grad(qr.reference_float64(q64, k64, cos, sin), (q64, k64), (gq.double(), gk.double()))
    result["check"] = {
        "fwd_triton_vs_eager": errors(got, ref),
        "grad_triton_vs_eager_bf16": errors(g_triton, g_eager),
        "grad_triton_vs_float64": errors(g_triton, g64),
        "grad_eager_bf16_vs_float64": errors(g_eager, g64),
        "out_contiguous": all(t.is_contiguous() for t in got),
    }
    del q64, k64, g64
    print(f"qk norm + rotary, B={B} T={T} H={H} D={D} bf16, {result['device']}")
    for name, e in result["check"].items():
        if isinstance(e, dict):
            print(f"  {name:28s} max_abs {e['max_abs']:.3e}  /max|ref| {e['rel_to_max']:.3e}  "
                  f"max_rel {e['max_rel']:.3e}  differ {e['frac_differ']:.2e}")

    # ---------------------------------------------------------------- compiled: reference vs the op
    def layer(qkv, cos, sin, impl):
        q, k, _ = qkv.view(B, T, 3 * H, D).chunk(3, dim=-2)
        return qr.qk_norm_rotary(q, k, cos, sin, impl=impl)

    compiled = torch.compile(layer, fullgraph=True)
    rows = {}
    for impl in ("torch", "triton"):
        fwd = lambda: compiled(qkv, cos, sin, impl)
        fwd_bwd = lambda: torch.autograd.grad(compiled(qkv, cos, sin, impl), qkv, (gq, gk))
        rows[impl] = {"fwd_us": median_us(fwd, iters, warmup=5), "fwd_bwd_us": median_us(fwd_bwd, iters, warmup=5)}
        rows[impl]["bwd_us"] = rows[impl]["fwd_bwd_us"] - rows[impl]["fwd_us"]
    result["compiled"] = rows

    # ---------------------------------------------------------------- the kernels alone, config sweep
    n = B * T * H * D
    fwd_bytes = 2 * (2 * n * 2) + 2 * T * (D // 2) * 4  # read q, k; write 2 outputs; cos, sin
    bwd_bytes = 2 * (3 * n * 2) + 2 * T * (D // 2) * 4  # read q, k, gq, gk; write dq, dk; cos, sin
    sweep = []
    for kind, variants in (("fwd", FWD_VARIANTS), ("bwd", BWD_VARIANTS)):
        for block_t, warps in variants:
            qr.KERNEL_CONFIG.update(default_cfg)
            if kind == "fwd":
                qr.KERNEL_CONFIG.update(BLOCK_T=block_t, num_warps=warps)
                call = lambda: torch.ops.speedrun.qk_norm_rotary(qd, kd, cos, sin)
                err = errors(call(), ref)["max_abs"]
                nbytes = fwd_bytes
            else:
                qr.KERNEL_CONFIG.update(BLOCK_T_BWD=block_t, num_warps_bwd=warps)
                call = lambda: torch.ops.speedrun.qk_norm_rotary_backward(gq, gk, qd, kd, cos, sin)
                err = errors(call(), g_triton)["max_abs"]  # against the default config's gradients
                nbytes = bwd_bytes
            us = median_us(call, iters, warmup=5)
            sweep.append({"kind": kind, "BLOCK_T": block_t, "num_warps": warps, "us": us,
                          "GB_s": nbytes / us / 1e3, "max_abs_err": err})
    qr.KERNEL_CONFIG.update(default_cfg)
    result["sweep"] = sweep
    result["bytes"] = {"fwd": fwd_bytes, "bwd": bwd_bytes}

    print(f"\ncompiled layer (view + chunk + op), median of {iters}, microseconds:")
    print(f"  {'impl':8s} {'fwd':>9s} {'fwd+bwd':>9s} {'bwd':>9s}")
    for impl, r in rows.items():
        print(f"  {impl:8s} {r['fwd_us']:9.1f} {r['fwd_bwd_us']:9.1f} {r['bwd_us']:9.1f}")
    print(f"\nkernels alone (fwd moves {fwd_bytes / 1e6:.0f} MB, bwd {bwd_bytes / 1e6:.0f} MB):")
    print(f"  {'kind':4s} {'BLOCK_T':>7s} {'warps':>5s} {'us':>8s} {'GB/s':>7s} {'max_abs_err':>11s}")
    for r in sweep:
        print(f"  {r['kind']:4s} {r['BLOCK_T']:7d} {r['num_warps']:5d} {r['us']:8.1f} {r['GB_s']:7.0f} {r['max_abs_err']:11.3e}")
    for kind in ("fwd", "bwd"):
        best = min((r for r in sweep if r["kind"] == kind), key=lambda r: r["us"])
        result[f"best_{kind}"] = best
        print(f"  best {kind}: BLOCK_T={best['BLOCK_T']} num_warps={best['num_warps']} {best['us']:.1f} us")

    # the compiled layer again with the best configs of the sweep
    tuned = {"BLOCK_T": result["best_fwd"]["BLOCK_T"], "num_warps": result["best_fwd"]["num_warps"],
             "BLOCK_T_BWD": result["best_bwd"]["BLOCK_T"], "num_warps_bwd": result["best_bwd"]["num_warps"]}
    qr.KERNEL_CONFIG.update(tuned)
    fwd = lambda: compiled(qkv, cos, sin, "triton")
    fwd_bwd = lambda: torch.autograd.grad(compiled(qkv, cos, sin, "triton"), qkv, (gq, gk))
    rows["triton_tuned"] = {"fwd_us": median_us(fwd, iters, warmup=5), "fwd_bwd_us": median_us(fwd_bwd, iters, warmup=5),
                            "config": tuned}
    rows["triton_tuned"]["bwd_us"] = rows["triton_tuned"]["fwd_bwd_us"] - rows["triton_tuned"]["fwd_us"]
    qr.KERNEL_CONFIG.update(default_cfg)
    print(f"  compiled layer, tuned {tuned}: fwd {rows['triton_tuned']['fwd_us']:.1f} "
          f"fwd+bwd {rows['triton_tuned']['fwd_bwd_us']:.1f} us")

    path = out_dir / "qk_rotary_bench.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
