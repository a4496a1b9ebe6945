"""Times the FP8 head's Gluon forward (`speedrun.kernels.head_gluon`) and the CE kernel with its row sums, at
the record's micro-step (M = 49152 tokens, K = 768, N = 50304), against cuBLAS and the two-pass CE kernel.

What one micro-step's head forward costs on each path (the backward is the same on both):

    cublas:  torch._scaled_mm (z)                 + softcap_ce lean kernel, both passes (loss, e5m2 grad)
    gluon:   head_gluon.launch (z and row sums)   + softcap_ce lean kernel, second pass only (rowsums=)

Rows: every launch variant of the Gluon kernel (VARIANTS: CONFIG overrides, with and without the row
sums) with its median us and, at the record's shape, z against cuBLAS (bit equality) and the row sums
against float64 (max relative error); the CE kernel with and without row sums (us; losses and e5m2
bytes compared); the CE kernel writing the gradient in both layouts (`softcap_ce.launch_transposed`)
against the one-layout kernel plus the transposed copy; the two paths end to end. The runs of 2026-12-01 (`2c51899`, head_gluon's CONFIG comment)
chose GROUP_M 32 from {8, 16, 32, 64} and POLY 0 over 1.

Usage:
  python3 head_fwd_gluon_bench.py --compile-only   anywhere with Triton 3.6 (no GPU): compiles every
      variant for sm_90 offline and prints registers, spills, shared memory; exit 1 on a spill.
  python3 head_fwd_gluon_bench.py OUT.json         on an H200, from scripts/bench with PYTHONPATH=src.
"""

import json
import sys
import traceback

import torch

M, K, N = 49152, 768, 50304
VARIANTS = {  # name: (CONFIG overrides, row sums)
    "plain": ({}, False),
    "rowsum": ({}, True),  # CONFIG's split: two slices a tile on the epilogue warps, two on the consumers
    "rowsum_split3": ({"RS_EPI_SLICES": 3}, True),
    "rowsum_split1": ({"RS_EPI_SLICES": 1}, True),
}  # POLY 1 and GROUP_M 8-64 were also run on 2026-12-01, all four slices on the epilogue or on the consumers
# on 2026-12-01 too (57860f8; head_gluon's CONFIG comment)


def compile_only() -> bool:
    from relu2_gluon_bench import inspect_compiled  # same folder: the relu2 kernel's compile checks
    from speedrun.kernels import head_gluon as H

    ok = True
    for name, (over, rowsum) in VARIANTS.items():
        try:
            r = inspect_compiled(f"{name} {over}", H.compile_offline(over, rowsum=rowsum))
        except Exception as e:  # noqa: BLE001 - report and go on to the next variant
            print(f"{name}: COMPILE FAILED {type(e).__name__}: {str(e)[:2000]}")
            ok = False
            continue
        ok &= not (r["spills"] or r["too_big"])
    print("ok: no spills, shared memory within the limit" if ok else "FAILED: see above")
    return ok


def _bytes_differ(a, b, rows=4096) -> int:
    view = torch.int16 if a.element_size() == 2 else torch.uint8
    return sum((a[i:i + rows].view(view) != b[i:i + rows].view(view)).sum().item() for i in range(0, a.shape[0], rows))


def _rowsum_rel_err(rs, z, cfg, rows=4096) -> float:
    from speedrun.kernels import head_gluon as H

    err = 0.0
    for i in range(0, z.shape[0], rows):
        ref = H.rowsums_reference(z[i:i + rows], 30.0, cfg)
        # all-padding partials are 0 in both (0 / 0 would be NaN, which Python's max would drop)
        err = max(err, ((rs[i:i + rows].double() - ref).abs() / ref.clamp_min(1e-300)).max().item())
    return err


def device_bench(out_path):
    from cuda_timing import median_us
    from speedrun.kernels import fp8
    from speedrun.kernels import head
    from speedrun.kernels import head_gluon as H
    from speedrun.kernels import softcap_ce as sc

    res = {"shape": {"M": M, "K": K, "N": N}, "config": H.CONFIG, "device": torch.cuda.get_device_name(),
           "variants": {}}

    def save():
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)

    time = lambda fn: median_us(fn, reps=20, warmup=5)  # noqa: E731
    g = torch.Generator("cuda").manual_seed(1)
    x = torch.nn.functional.rms_norm(torch.randn(M, K, generator=g, device="cuda"), (K,)).bfloat16()
    w = torch.randn(N, K, generator=g, device="cuda") * 0.02
    t = torch.randint(0, 50257, (M,), generator=g, device="cuda")
    x_s, w_s = head.x_scale(K), fp8.W_SCALE
    x_f8, w_f8 = fp8.quantize(x, w, x_s, w_s)
    sa, sb = (torch.full((), s, device="cuda") for s in (x_s, w_s))
    scale = sa * sb
    ref = torch._scaled_mm(x_f8, w_f8.T, out_dtype=torch.bfloat16, scale_a=sa, scale_b=sb, use_fast_accum=True)
    z = torch.empty_like(ref)
    rs = torch.empty(M, H.rowsum_tiles(N), device="cuda")

    for name, (over, rowsum) in VARIANTS.items():
        row = {"config": over, "rowsum": rowsum}
        try:
            z.fill_(float("nan"))
            rsv = torch.empty(M, H.rowsum_tiles(N, over), device="cuda") if rowsum else None
            H.launch(x_f8, w_f8, scale, z, rsv, cfg=over)
            torch.cuda.synchronize()
            row["z_bytes_differing_from_cublas"] = _bytes_differ(z, ref)
            if rowsum:
                row["rowsum_max_rel_err"] = _rowsum_rel_err(rsv, z, over)
            row["us"] = time(lambda: H.launch(x_f8, w_f8, scale, z, rsv, cfg=over))
            rsv = None  # its memory back before the next variant
        except Exception as e:  # noqa: BLE001 - a failure is a result; go on
            row["error"] = f"{type(e).__name__}: {str(e)[:500]}"
            traceback.print_exc()
        res["variants"][name] = row
        save()
        print(name, row, flush=True)

    us = res["us"] = {}
    us["cublas_fwd"] = time(lambda: torch._scaled_mm(x_f8, w_f8.T, out_dtype=torch.bfloat16, scale_a=sa,
                                                     scale_b=sb, use_fast_accum=True))
    H.launch(x_f8, w_f8, scale, z, rs)
    grad_mul = 1.0 / fp8.GRAD_SCALE
    ce = lambda r: sc.launch(z, t, 30.0, "sigmoid", True, torch.float8_e5m2, grad_mul, r)  # noqa: E731
    l2, g2 = ce(None)
    l1, g1 = ce(rs)
    res["ce_loss_max_rel_diff"] = ((l1 - l2).abs() / l2.abs()).max().item()
    res["ce_e5m2_bytes_differing"] = _bytes_differ(g1, g2) / g1.numel()
    del g1, g2
    us["ce_lean_two_passes"] = time(lambda: ce(None))
    us["ce_lean_rowsums"] = time(lambda: ce(rs))
    from speedrun.kernels import transpose

    us["ce_rowsums_plus_transposed_copy"] = time(lambda: transpose.transpose_copy(ce(rs)[1]))
    us["ce_transposed_rowsums"] = time(lambda: sc.launch_transposed(z, t, 30.0, torch.float8_e5m2, grad_mul, rs))
    _, g1, g1t = sc.launch_transposed(z, t, 30.0, torch.float8_e5m2, grad_mul, rs)
    _, g2 = ce(rs)
    res["ce_transposed_e5m2_bytes_differing"] = _bytes_differ(g1, g2) / g1.numel()
    res["ce_transposed_exact"] = all(torch.equal(g1t[:, i:i + 4096].T.contiguous().view(torch.uint8),
                                                 g1[i:i + 4096].view(torch.uint8)) for i in range(0, M, 4096))
    del g1, g1t, g2
    us["path_cublas"] = time(lambda: (torch._scaled_mm(x_f8, w_f8.T, out_dtype=torch.bfloat16, scale_a=sa, scale_b=sb,
                                                       use_fast_accum=True), ce(None)))
    us["path_gluon"] = time(lambda: (H.launch(x_f8, w_f8, scale, z, rs), ce(rs)))
    save()
    print("us:", {k: round(v, 1) for k, v in us.items()})
    print("CE with row sums vs two passes: loss max rel diff", res["ce_loss_max_rel_diff"],
          "e5m2 bytes differing", res["ce_e5m2_bytes_differing"])
    print("CE writing both layouts vs one: e5m2 bytes differing", res["ce_transposed_e5m2_bytes_differing"],
          "transpose exact", res["ce_transposed_exact"])
    if not res["ce_transposed_exact"]:  # a correctness check, not a timing: fail the run (two earlier runs
        # printed False unread)
        sys.exit("head bench: ERROR: launch_transposed's transposed gradient is not the transpose of its own")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--compile-only":
        sys.exit(0 if compile_only() else 1)
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    device_bench(sys.argv[1])
