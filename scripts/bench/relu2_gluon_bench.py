"""The Gluon warp-specialised ReLU² products (speedrun.kernels.relu2_gluon) against the Triton kernel and cuBLAS.

Usage:
  python3 relu2_gluon_bench.py OUT.json          on an H200 (PYTHONPATH has src)
  python3 relu2_gluon_bench.py --compile-only    anywhere with Triton (no GPU): compiles every
      variant for sm_90 offline and reports registers, shared memory and spills (cuobjdump), and
      checks the PTX for the barriers the design relies on.

On the GPU: first ragged shapes (RAGGED; a hang shows before the big runs) against a torch reference
of the epilogue math on cuBLAS's product; then at M=49152, K=768, N=3072 (seeded randn inputs) the
forward (h and a; and a alone) and backward (g) with `relu2_mlp.launch` (its KERNEL_CONFIG) and
`relu2_gluon.launch`: for every output the share of elements that differ and the largest absolute
difference, Gluon against Triton and against cuBLAS + torch; medians of 20 timed calls (CUDA events,
5 warm-up calls) of both kernels and of cuBLAS's plain products; last, the Gluon kernels' variants and
cuBLAS timed in turns after a warm-up (`cuda_timing.interleaved_us`: the figures to compare on a
power-capped card). JSON to OUT.json after each stage, a summary on stdout.
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
# The A_TMA backward's ring shapes timed (relu2_gluon.GLUON_CONFIG: A_TMA 1, 2 stages of 64-wide k-steps;
# 2, 4 stages of 32-wide ones)
TMA_RINGS = {"k64x2": 1, "k32x4": 2}
# Launch variants of the backward from a (GLUON_CONFIG["bwd_a"] with these entries over it), timed in
# alternating passes against the default: XTILE (the next tile's first slice loaded with this tile's
# last) and the epilogue's register share (EPI_REGS; the consumers keep the rest)
BWD_A_VARIANTS = {"xtile": {"XTILE": 1}, "regs160": {"EPI_REGS": 160}, "regs160_xtile": {"EPI_REGS": 160, "XTILE": 1},
                  "regs136_xtile": {"EPI_REGS": 136, "XTILE": 1}}
PASSES = 3
STEADY_ROUNDS = 60  # cuda_timing.interleaved_us rounds of the last comparison (every kernel in turn)


# --------------------------------------------------------------------------- compile-only (CPU)

from speedrun.kernels.relu2_gluon import compile_offline as compile_variant, resource_usage  # noqa: E402


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
    from speedrun.kernels import relu2_gluon as G

    variants = [("fwd_store_h_and_a", G.STORE_H_AND_A, True, None, False), ("fwd_store_a", G.STORE_A, True, None, False),
                ("bwd_drelu2", G.DRELU2, False, None, False), ("bwd_from_a", G.DRELU2_FROM_A, False, None, False)]
    variants += [(f"bwd_from_a_tma_{n}", G.DRELU2_FROM_A, False, None, a_tma) for n, a_tma in TMA_RINGS.items()]
    dump = os.environ.get("RELU2_GLUON_DUMP")  # a folder: write each variant's ttgir/ptx there
    report = {name: inspect_compiled(name, compile_variant(epi, b_nk, cfg, a_tma=tma), dump)
              for name, epi, b_nk, cfg, tma in variants}
    ok = not any(r["spills"] or r["too_big"] for r in report.values())
    print("no spills, shared memory within the limit" if ok else "SPILLS OR TOO MUCH SHARED MEMORY")
    return report, ok


# --------------------------------------------------------------------------- device bench (H200)

def diff(x, ref):
    x, ref = x.float(), ref.float()
    d = (x - ref).abs()
    return {"frac_differ": (x != ref).float().mean().item(), "max_abs": d.max().item(),
            "ref_max_abs": ref.abs().max().item()}


def epilogue_reference(p, h=None):
    """relu2_mlp._epilogue's math in torch from the bf16 product p: (h, a) or g."""
    pf = p.float()
    if h is None:
        r = pf.clamp_min(0.0)
        return p, (r * r).bfloat16()
    hf = h.float()
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
        hh, aa, gg = (torch.full((m, n), 7.0, device=dev, dtype=torch.bfloat16) for _ in range(3))
        G.launch(xs, w1, hh, aa, G.STORE_H_AND_A, True)
        torch.cuda.synchronize()
        G.launch(gs, w2, hh, gg, G.DRELU2, False)
        torch.cuda.synchronize()
        h_ref, a_ref = epilogue_reference(xs @ w1.T)
        g_ref = epilogue_reference(gs @ w2, hh)
        row = {"M": m, "K": k, "N": n, "h": diff(hh, h_ref), "a": diff(aa, a_ref), "g": diff(gg, g_ref)}
        # products of <= 200 terms: allow a few bf16 ulps of the largest value (7.0 left unwritten fails)
        row["ok"] = all(row[o]["max_abs"] <= 0.02 * max(row[o]["ref_max_abs"], 1.0) for o in ("h", "a", "g"))
        rows.append(row)
        print("ragged", (m, k, n), "ok" if row["ok"] else "MISMATCH", _fmt({o: row[o] for o in ("h", "a", "g")}),
              flush=True)
    return rows


def device_bench(out_path):
    from cuda_timing import interleaved_us, median_us

    from speedrun.kernels import relu2_gluon as G
    from speedrun.kernels import relu2_mlp as R

    dev = "cuda"
    res = {"shape": {"M": M, "K": K, "N": N}, "gluon_config": G.GLUON_CONFIG,
           "triton_config": R.KERNEL_CONFIG, "device": torch.cuda.get_device_name()}

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
    empty = torch.empty(0, device=dev, dtype=torch.bfloat16)

    h_t, a_t, h_g, a_g, a_only = (torch.empty(M, N, device=dev, dtype=torch.bfloat16) for _ in range(5))
    fwd_t = lambda: R.launch(x, fc_w, h_t, a_t, R.STORE_H_AND_A, True, R.KERNEL_CONFIG["fwd"])  # noqa: E731
    fwd_g = lambda: G.launch(x, fc_w, h_g, a_g, G.STORE_H_AND_A, True)  # noqa: E731
    fwd_ga = lambda: G.launch(x, fc_w, empty, a_only, G.STORE_A, True)  # noqa: E731
    for fn in (fwd_t, fwd_g, fwd_ga):
        fn()
        torch.cuda.synchronize()
    res["fwd_check"] = {"h": diff(h_g, h_t), "a": diff(a_g, a_t)}
    res["fwd_store_a_check"] = {"a_vs_gluon_h_and_a": diff(a_only, a_g)}

    h = h_t  # the backward's h: the forward's output (about half positive)
    g_t, g_g = (torch.empty(M, N, device=dev, dtype=torch.bfloat16) for _ in range(2))
    bwd_t = lambda: R.launch(g_y, proj_w, h, g_t, R.DRELU2, False, R.KERNEL_CONFIG["bwd"])  # noqa: E731
    bwd_g = lambda: G.launch(g_y, proj_w, h, g_g, G.DRELU2, False)  # noqa: E731
    for fn in (bwd_t, bwd_g):
        fn()
        torch.cuda.synchronize()
    res["bwd_check"] = {"g": diff(g_g, g_t)}

    # the backward from a (the default since `221c046`), and with a's tile loaded by TMA
    a_saved = torch.relu(h).square()
    g_a = torch.empty_like(g_g)
    bwd_a = lambda: G.launch(g_y, proj_w, a_saved, g_a, G.DRELU2_FROM_A, False)  # noqa: E731
    bwd_a()
    tma_fns = {}
    for name, a_tma in TMA_RINGS.items():
        out = torch.empty_like(g_g)
        tma_fns[name] = lambda out=out, n=a_tma: G.launch(g_y, proj_w, a_saved, out, G.DRELU2_FROM_A, False, a_tma=n)
        tma_fns[name]()
        torch.cuda.synchronize()
        res.setdefault("bwd_a_tma_check", {})[name] = diff(out, g_a)
    res["bwd_from_a_check"] = {"g_from_a_vs_g_from_h": diff(g_a, g_g)}

    # against cuBLAS's product + the torch epilogue (summation order differs from both kernels)
    h_ref, a_ref = epilogue_reference(x @ fc_w.T)
    res["fwd_vs_cublas"] = {"h": diff(h_g, h_ref), "a": diff(a_g, a_ref)}
    res["bwd_vs_cublas"] = {"g": diff(g_g, epilogue_reference(g_y @ proj_w, h))}
    del h_ref, a_ref
    for key in ("fwd_check", "fwd_store_a_check", "bwd_check", "bwd_from_a_check", "fwd_vs_cublas", "bwd_vs_cublas"):
        print(key, "(share differing, max abs diff)", _fmt(res[key]), flush=True)
    save()

    time = lambda fn: median_us(fn, reps=20, warmup=5)  # noqa: E731
    res["us"] = {"fwd_triton": time(fwd_t), "fwd_gluon": time(fwd_g), "fwd_gluon_store_a": time(fwd_ga),
                 "fwd_cublas": time(lambda: x @ fc_w.T), "bwd_triton": time(bwd_t), "bwd_gluon": time(bwd_g),
                 "bwd_cublas": time(lambda: g_y @ proj_w), "bwd_gluon_from_a": time(bwd_a)}
    res["us"].update({f"bwd_gluon_from_a_tma_{n}": time(fn) for n, fn in tma_fns.items()})
    print("bwd_a_tma_check (share differing, max abs diff)", _fmt(res["bwd_a_tma_check"]), flush=True)
    save()
    variant_bench(res, G, (g_y, proj_w, a_saved, g_a), (h, g_g), time)
    save()
    steady = {"fwd_gluon_store_a": fwd_ga, "fwd_cublas": lambda: x @ fc_w.T, "bwd_gluon_from_h": bwd_g,
              "bwd_gluon_from_a": bwd_a, "bwd_cublas": lambda: g_y @ proj_w,
              "bwd_gluon_from_a_tma_k64x2": tma_fns["k64x2"]}
    steady.update({f"bwd_gluon_from_a_{n}": (lambda cfg=cfg: G.launch(g_y, proj_w, a_saved, torch.empty_like(g_a),
                                                                     G.DRELU2_FROM_A, False, cfg))
                   for n, cfg in BWD_A_VARIANTS.items()})
    res["steady_us"] = interleaved_us(steady, rounds=STEADY_ROUNDS)
    save()
    us = res["us"]
    print(f"forward  us: triton {us['fwd_triton']:.1f}  gluon {us['fwd_gluon']:.1f} "
          f"(store_a {us['fwd_gluon_store_a']:.1f})  cublas {us['fwd_cublas']:.1f}")
    print(f"backward us: triton {us['bwd_triton']:.1f}  gluon {us['bwd_gluon']:.1f}  cublas {us['bwd_cublas']:.1f}")
    print("backward from a us: gluon {:.1f}, a by TMA: {}".format(us["bwd_gluon_from_a"], ", ".join(
        f"{n} {us['bwd_gluon_from_a_tma_' + n]:.1f}" for n in TMA_RINGS)))
    print("backward from a, passes of (default, " + ", ".join(BWD_A_VARIANTS) + ") us:")
    for row in res["bwd_a_passes_us"]:
        print("   ", "  ".join(f"{v:.1f}" for v in row))
    print("backward from h, (default, XTILE) us:", res["bwd_h_xtile_us"])
    print("steady (interleaved after a warm-up) us:", {k: round(v, 1) for k, v in res["steady_us"].items()})


def variant_bench(res, G, from_a, from_h, time):
    """BWD_A_VARIANTS of the backward from a: g against the default's (from_a = (g_y, proj_w, a, g)),
    then PASSES passes timing the default and each variant in turn; XTILE of the backward from h too."""
    g_y, proj_w, a_saved, g_a = from_a
    h, g_h = from_h
    fns, res["bwd_a_variant_check"] = {}, {}
    for name, cfg in BWD_A_VARIANTS.items():
        out = torch.full_like(g_a, 7.0)
        fns[name] = lambda out=out, cfg=cfg: G.launch(g_y, proj_w, a_saved, out, G.DRELU2_FROM_A, False, cfg)
        fns[name]()
        torch.cuda.synchronize()
        res["bwd_a_variant_check"][name] = diff(out, g_a)
    out_h = torch.full_like(g_h, 7.0)
    h_x = lambda: G.launch(g_y, proj_w, h, out_h, G.DRELU2, False, {"XTILE": 1})  # noqa: E731
    h_x()
    torch.cuda.synchronize()
    res["bwd_a_variant_check"]["from_h_xtile"] = diff(out_h, g_h)
    print("bwd_a_variant_check (share differing, max abs diff)", _fmt(res["bwd_a_variant_check"]), flush=True)
    default = lambda: G.launch(g_y, proj_w, a_saved, g_a, G.DRELU2_FROM_A, False)  # noqa: E731
    res["bwd_a_passes_us"] = [[time(fn) for fn in (default, *fns.values())] for _ in range(PASSES)]
    res["bwd_a_variant_names"] = ["default", *fns]
    res["bwd_h_xtile_us"] = [time(lambda: G.launch(g_y, proj_w, h, g_h, G.DRELU2, False)), time(h_x)]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--compile-only":
        sys.exit(0 if compile_only()[1] else 1)
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    device_bench(sys.argv[1])
