"""The Gluon warp-specialised ReLU² backward product (speedrun.kernels.relu2_gluon) against the Triton
kernel and cuBLAS.

Usage:
  python3 relu2_gluon_bench.py OUT.json          on an H100/H200 (PYTHONPATH has src)
  python3 relu2_gluon_bench.py --compile-only    anywhere with Triton (no GPU): compiles the kernel
      for sm_90 offline and reports registers, shared memory and spills (cuobjdump), and counts the
      PTX's instructions the synchronisation relies on.

On the GPU: first ragged shapes (RAGGED; a hang shows before the big runs) against a torch reference
of the epilogue math on cuBLAS's product; then at M=49152, K=768, N=3072 (seeded randn inputs, a from
the Triton forward as the model saves it) g by `relu2_gluon.launch` and by `relu2_mlp.backward_product`:
the share of elements that differ and the largest absolute difference, Gluon against Triton and
against cuBLAS + torch; medians of 20 timed calls (CUDA events, 5 warm-up calls) of both kernels and
of cuBLAS's plain product; last, the three timed in turns after a warm-up (`cuda_timing.interleaved_us`:
the figures to compare on a power-capped card). JSON to OUT.json after each stage, a summary on stdout.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

import torch

M, K, N = 49152, 768, 3072
RAGGED = [(1000, 200, 392), (77, 64, 264), (300, 136, 520)]  # (M, K, N); N, K multiples of 8
STEADY_ROUNDS = 60  # cuda_timing.interleaved_us rounds of the last comparison (every kernel in turn)


# --------------------------------------------------------------------------- compile-only (CPU)

from speedrun.kernels.relu2_gluon import compile_offline, resource_usage  # noqa: E402


def _tool(name):
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _ptxas() -> str:
    """The ptxas Triton compiles sm_90 with (Triton 3.9 has two; get_ptxas(arch) picks), else the bundled one."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return get_ptxas(90).path
    except (ImportError, TypeError, AttributeError):
        return _tool("ptxas")


def ptxas_report(ptx: str) -> str:
    """ptxas -v's summary lines for this PTX (the flags Triton uses for sm_90a)."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        run = subprocess.run([_ptxas(), "-lineinfo", "-v", "--gpu-name=sm_90a", src, "-o", src + ".o"],
                             capture_output=True, text=True, check=True)
    return " | ".join(line.strip() for line in run.stderr.splitlines()
                      if "spill" in line or "Used" in line or "C75" in line)


def ptx_checks(ptx: str) -> dict:
    """Counts of the instructions the synchronisation relies on (for a reader to check)."""
    pats = {"setmaxnreg": r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+\d+", "named_barriers": r"bar\.sync\s+\d+, \d+",
            "mbarrier_arrive": r"mbarrier\.arrive", "mbarrier_try_wait": r"mbarrier\.try_wait",
            "fence_proxy_async": r"fence\.proxy\.async", "bulk_wait_read": r"cp\.async\.bulk\.wait_group\.read",
            "bulk_wait": r"cp\.async\.bulk\.wait_group\s", "tma_store": r"cp\.async\.bulk\.tensor\.\dd\.global\.shared",
            "tma_load": r"cp\.async\.bulk\.tensor\.\dd\.shared::(?:cluster|cta)\.global", "wgmma": r"wgmma\.mma_async",
            "local_mem": r"\.local"}
    out = {k: len(re.findall(p, ptx)) for k, p in pats.items()}
    out["setmaxnreg_values"] = sorted(set(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", ptx)))
    return out


SMEM_LIMIT = 232448  # bytes of shared memory a block may have on an H100/H200 (227 KB)


def inspect_compiled(name, k, dump=None, extra=""):
    """Registers, spills, shared memory (dynamic + static against SMEM_LIMIT) and the PTX's
    synchronisation counts of a compiled kernel; prints them (with `extra`), writes its ttgir and PTX
    into the folder `dump` if given; the report as a dict ("spills", "too_big" flag failures)."""
    usage = resource_usage(k.asm["cubin"])
    checks = ptx_checks(k.asm["ptx"])
    ptxas = ptxas_report(k.asm["ptx"])
    spills = usage.get("LOCAL", 0) > 0 or usage.get("STACK", 0) > 0 or " 0 bytes spill stores" not in ptxas
    too_big = k.metadata.shared + usage.get("SHARED", 0) > SMEM_LIMIT
    print(f"{name}: REG {usage.get('REG')} STACK {usage.get('STACK')} LOCAL {usage.get('LOCAL', 0)} "
          f"shared {k.metadata.shared} B dynamic + {usage.get('SHARED')} B static (limit {SMEM_LIMIT}), "
          f"warps {k.metadata.num_warps}, setmaxnreg {checks['setmaxnreg_values']}{extra}"
          f"{'  SPILLS' if spills else ''}{'  SHARED MEMORY TOO LARGE' if too_big else ''}")
    print("    ptxas:", ptxas)
    print("   ", {k2: v for k2, v in checks.items() if k2 != "setmaxnreg_values"})
    if dump:
        os.makedirs(dump, exist_ok=True)
        for ext in ("ttgir", "ptx"):
            with open(os.path.join(dump, f"{name}.{ext}"), "w") as f:
                f.write(k.asm[ext])
    return {"usage": usage, "ptxas": ptxas, "ptx": checks, "dynamic_shared_bytes": k.metadata.shared,
            "num_warps": k.metadata.num_warps, "spills": spills, "too_big": too_big}


def compile_only():
    dump = os.environ.get("RELU2_GLUON_DUMP")  # a folder: write the kernel's ttgir/ptx there
    report = inspect_compiled("bwd_from_a", compile_offline(), dump)
    ok = not (report["spills"] or report["too_big"])
    print("no spills, shared memory within the limit" if ok else "SPILLS OR TOO MUCH SHARED MEMORY")
    return report, ok


# --------------------------------------------------------------------------- device bench (H200)

def diff(x, ref):
    x, ref = x.float(), ref.float()
    d = (x - ref).abs()
    return {"frac_differ": (x != ref).float().mean().item(), "max_abs": d.max().item(),
            "ref_max_abs": ref.abs().max().item()}


def epilogue_reference(p, h):
    """relu2_mlp._epilogue's backward math in torch from the bf16 product p and h: g."""
    pf, hf = p.float(), h.float()
    return torch.where(hf > 0, pf * (2.0 * hf), torch.zeros_like(pf)).bfloat16()


def _fmt(checks):
    return {o: (f"{v['frac_differ']:.2e}", f"{v['max_abs']:.3g}") for o, v in checks.items()}


def ragged_checks(G, dev):
    """Small ragged shapes against cuBLAS's product + the torch epilogue (run first: a hang shows early)."""
    rows = []
    for m, k, n in RAGGED:
        xs = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w1 = (torch.randn(n, k, device=dev) * k ** -0.5).bfloat16()
        w2 = (torch.randn(k, n, device=dev) * n ** -0.5).bfloat16()
        gs = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        hh = xs @ w1.T
        gg = torch.full((m, n), 7.0, device=dev, dtype=torch.bfloat16)
        G.launch(gs, w2, torch.relu(hh).square(), gg)
        torch.cuda.synchronize()
        row = {"M": m, "K": k, "N": n, "g": diff(gg, epilogue_reference(gs @ w2, hh))}
        # products of <= 200 terms: allow a few bf16 ulps of the largest value (7.0 left unwritten fails)
        row["ok"] = row["g"]["max_abs"] <= 0.02 * max(row["g"]["ref_max_abs"], 1.0)
        rows.append(row)
        print("ragged", (m, k, n), "ok" if row["ok"] else "MISMATCH", _fmt({"g": row["g"]}), flush=True)
    return rows


def device_bench(out_path):
    from cuda_timing import interleaved_us, median_us

    from speedrun.kernels import relu2_gluon as G
    from speedrun.kernels import relu2_mlp as R

    dev = "cuda"
    res = {"shape": {"M": M, "K": K, "N": N}, "gluon_config": G.GLUON_CONFIG,
           "triton_config": R.KERNEL_CONFIG["bwd"], "device": torch.cuda.get_device_name()}

    def save():
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)

    torch.manual_seed(0)
    res["ragged"] = ragged_checks(G, dev)
    save()

    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    fc_w = (torch.randn(N, K, device=dev) * K ** -0.5).bfloat16()
    proj_w = (torch.randn(K, N, device=dev) * N ** -0.5).bfloat16()
    g_y = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    a = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    R.forward_product(x, fc_w, a)  # the saved a, about half of it positive

    g_t, g_g = (torch.empty(M, N, device=dev, dtype=torch.bfloat16) for _ in range(2))
    bwd_t = lambda: R.backward_product(g_y, proj_w, a, g_t)  # noqa: E731
    bwd_g = lambda: G.launch(g_y, proj_w, a, g_g)  # noqa: E731
    for fn in (bwd_t, bwd_g):
        fn()
        torch.cuda.synchronize()
    res["bwd_check"] = {"g": diff(g_g, g_t)}
    # against cuBLAS's product + the torch epilogue (summation order differs from both kernels)
    res["bwd_vs_cublas"] = {"g": diff(g_g, epilogue_reference(g_y @ proj_w, (x @ fc_w.T)))}
    for key in ("bwd_check", "bwd_vs_cublas"):
        print(key, "(share differing, max abs diff)", _fmt(res[key]), flush=True)
    save()

    time = lambda fn: median_us(fn, reps=20, warmup=5)  # noqa: E731
    cublas = lambda: g_y @ proj_w  # noqa: E731
    res["us"] = {"bwd_triton": time(bwd_t), "bwd_gluon": time(bwd_g), "bwd_cublas": time(cublas)}
    save()
    res["steady_us"] = interleaved_us({"bwd_gluon": bwd_g, "bwd_triton": bwd_t, "bwd_cublas": cublas},
                                      rounds=STEADY_ROUNDS)
    save()
    us = res["us"]
    print(f"backward us: triton {us['bwd_triton']:.1f}  gluon {us['bwd_gluon']:.1f}  cublas {us['bwd_cublas']:.1f}")
    print("steady (interleaved after a warm-up) us:", {k: round(v, 1) for k, v in res["steady_us"].items()})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--compile-only":
        sys.exit(0 if compile_only()[1] else 1)
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    device_bench(sys.argv[1])
