"""A candidate Gluon kernel for the FP8 head's forward product, and its benchmark (not used by the model).

The product (`speedrun.fp8._forward_impl` today):

    z = bf16((x_f8 @ w_f8.T) * scale)   x_f8 (M, K) and w_f8 (N, K) float8_e4m3fn, row-major;
                                        scale a 0-d float32 CUDA tensor (x_s * w_s); z (M, N) bfloat16

which `torch._scaled_mm(x_f8, w_f8.T, out_dtype=torch.bfloat16, scale_a=sa, scale_b=sb,
use_fast_accum=True)` computes. Why: at the record's shape (M = 49152, K = 768, N = 50304) cuBLAS
takes ~3.5 ms on an H200, while the head's two backward FP8 products of the same FLOPs (with small
outputs) take ~2.5 ms: the 4.9 GB bf16 store of z is not overlapped with the tensor-core work.

Design: `speedrun.relu2_gluon`'s persistent warp-specialised kernel (read its docstring for the
barrier and phase reasoning, which carries over unchanged), with fp8 operands:

- consumer partition (the default one), 8 warps = 2 warpgroups, each 64 rows of a 128 x 256 fp32
  accumulator (wgmma m64n256k32, fp8 e4m3, both operands K-major: B is the (N, K) buffer permuted).
  BLOCK_K = 128 (128 bytes per fp8 row, the 128-byte swizzle), so K = 768 is 6 k-steps a tile. Per
  k-step: wait for the ring slot's `ready` mbarrier, one async wgmma, wait(1), then the TMA loads of
  the k-step STAGES - 1 ahead (counted over the program's whole tile sequence, so the next tile's
  operands arrive while this one finishes). At a tile's end: wait(0), wait until the epilogue buffer
  is free, z = bf16(acc * scale) (fp32 multiply, then one round-to-nearest-even) stored into the one
  128 x 256 bf16 epilogue buffer, fence, arrive on `acc_ready`;
- store partition, 4 warps (one thread issues): waits for `acc_ready`, TMA-stores the buffer in
  SUB_N-wide column slices (slices wholly right of N are skipped; TMA clips the rest of a ragged
  tile, and zero-fills out-of-bounds loads), waits until the bulk stores have *read* the buffer
  (`wait_group.read 0`) and hands it back (`acc_free`) while the consumers compute the next tile.
  `setmaxnreg` (warp_specialize's register list) gives it EPI_REGS registers, the consumers the rest.

Shared memory: STAGES x (128 x 128 + 256 x 128) B + 128 x 256 x 2 B = 3 x 48 KB + 64 KB = 208 KB
(of 227 KB); four stages (256 KB) do not fit beside a whole-tile buffer. Not overlapped: the
consumers' write of the accumulator to shared memory at each tile's end (~6 k-steps of work per
tile, so this share is larger than in the relu2 kernel's K = 768 / BK = 64 case of 12 steps).
Tiles in grouped order (GROUP_M row blocks at a time), min(tiles, SMs) programs.

Rounding: the scale multiplies the fp32 accumulator before the single rounding to bf16. cuBLAS is
believed to do the same with acc * (scale_a * scale_b); with the record's w_s = 2**-9 a power of two,
acc * sa * sb and acc * (sa * sb) agree anyway. The accumulation is wgmma's "fast" fp8 accumulation
(Triton's default on sm_90, like use_fast_accum=True) over k in order; cuBLAS's order may differ, so
bit equality is measured, not assumed.

Usage:
  python3 head_fwd_gluon_bench.py --compile-only   anywhere with Triton 3.6 (no GPU): compiles every
      variant (CONFIGS) for sm_90 offline, prints registers, spills, shared memory and the PTX
      synchronisation counts; exits 1 on a spill or > 227 KB of shared memory.
  python3 head_fwd_gluon_bench.py OUT.json         on an H200, from scripts/device with PYTHONPATH=src:
      ragged shapes first (against torch._scaled_mm where it takes the shape, and an fp32 product of
      the fp8 values), then at the record's shape every variant against torch._scaled_mm (share of
      elements differing, max abs difference, bit equality) and median us (20 calls, 5 warm-up), and
      cuBLAS's forward, a backward-shaped (grad_x) product of the same FLOPs, a bf16 copy and fill
      of an (M, N) tensor. JSON to OUT.json after each stage, a summary on stdout.
"""

import functools
import json
import math
import os
import sys
import traceback

import torch

M, K, N = 49152, 768, 50304
X_S = math.sqrt(768) / 448  # fp8.head_matmul's x scale at the record's width
W_S = 2.0**-9               # fp8.W_SCALE
RAGGED = [(1000, 256, 392), (144, 128, 264), (300, 208, 520), (4096, 768, 50304)]  # (M, K, N)

# Launch configurations. MAXNREG: registers a thread at launch (12 warps x 32 x 168 <= 65,536);
# EPI_REGS: the store warpgroup's after setmaxnreg (the consumers get (12 x 168 - 4 x EPI_REGS) / 8,
# rounded down to 8). STORE False skips the TMA stores (handshakes kept): the mainloop's time alone.
BASE = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "SUB_N": 64, "GROUP_M": 8, "STAGES": 3,
        "EPI_WARPS": 4, "EPI_REGS": 128, "MAXNREG": 168, "STORE": True}
CONFIGS = {
    "base": {},
    "sub128": {"SUB_N": 128},
    "group32": {"GROUP_M": 32},
    "epi_regs40": {"EPI_REGS": 40},
    "bk64_s6": {"BLOCK_K": 64, "STAGES": 6},
    "base_nostore": {"STORE": False},  # diagnostic only: z is not written
}
NUM_WARPS = 8  # the consumer (default) partition: two warpgroups

_KERNEL = None
gluon = gl = tma = mbarrier = None
_tile_origin = _issue_load = _shared_state = _mma_partition = _store_partition = None


def config(cfg=None) -> dict:
    """BASE with `cfg`'s entries over it."""
    return {**BASE, **(cfg or {})}


def smem_bytes(cfg: dict) -> int:
    """The ring (A and B fp8 blocks per stage) and the bf16 epilogue buffer, without the barriers."""
    per_stage = (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"]
    return cfg["STAGES"] * per_stage + cfg["BLOCK_M"] * cfg["BLOCK_N"] * 2


# --------------------------------------------------------------------------- the kernel


def _build():
    """Define the kernel (once). Everything but the store partition is the ReLU² kernel's
    (`speedrun.relu2_gluon`): the tile order, the TMA ring's loads (B given as (N, K): B_NK=True), the
    shared state and the consumer partition (SCALED: bf16(acc * scale)). Those resolve their own names
    in relu2_gluon's globals; the jit functions below find theirs in this module's."""
    global _KERNEL, gluon, gl, tma, mbarrier
    global _tile_origin, _issue_load, _shared_state, _mma_partition, _store_partition
    if _KERNEL is not None:
        return _KERNEL
    from speedrun import relu2_gluon

    relu2_gluon._build()
    gluon, gl, tma, mbarrier = relu2_gluon.gluon, relu2_gluon.gl, relu2_gluon.tma, relu2_gluon.mbarrier
    _tile_origin, _issue_load = relu2_gluon._tile_origin, relu2_gluon._issue_load
    _shared_state, _mma_partition = relu2_gluon._shared_state, relu2_gluon._mma_partition

    @gluon.jit
    def _store_partition(out_desc, e_buf, acc_ready, acc_free, M, N, GROUP_M: gl.constexpr,
                         STORE: gl.constexpr):
        """TMA-stores each tile's buffer in SUB_N-wide column slices, then hands the buffer back once
        the bulk copies have read it."""
        BM: gl.constexpr = e_buf.shape[0]
        BN: gl.constexpr = e_buf.shape[1]
        SUB: gl.constexpr = out_desc.block_type.shape[1]
        SPLIT: gl.constexpr = BN // SUB
        t = 0
        for tile in range(gl.program_id(0), gl.cdiv(M, BM) * gl.cdiv(N, BN), gl.num_programs(0)):
            off_m, off_n = _tile_origin(tile, M, N, BM, BN, GROUP_M)
            mbarrier.wait(acc_ready, t & 1)
            if STORE:
                for j in gl.static_range(SPLIT):
                    if off_n + j * SUB < N:  # a ragged last tile: no store for slices wholly outside
                        tma.async_copy_shared_to_global(out_desc, [off_m, off_n + j * SUB],
                                                        e_buf.slice(j * SUB, SUB, 1))
                tma.store_wait(0)  # every slice read out of shared memory: the buffer is free
            mbarrier.arrive(acc_free)
            t += 1

    @gluon.jit
    def _head_fwd_kernel(a_desc, b_desc, out_desc, scale_ptr, M, N, K, GROUP_M: gl.constexpr,
                         STAGES: gl.constexpr, EPI_WARPS: gl.constexpr, EPI_REGS: gl.constexpr,
                         STORE: gl.constexpr, num_warps: gl.constexpr):
        """z = bf16((A @ B.T) * scale), A (M, K) and B (N, K) fp8 e4m3 (K-major), tile by tile.
        Persistent: grid <= tiles."""
        a_bufs, b_bufs, e_buf, ready, acc_ready, acc_free = _shared_state(a_desc, b_desc, out_desc,
                                                                          b_desc.block_type.shape[0], STAGES)
        gl.warp_specialize([
            (_mma_partition, (a_desc, b_desc, a_bufs, b_bufs, e_buf, ready, acc_ready, acc_free, scale_ptr, M, N, K,
                              True, GROUP_M, True, num_warps)),
            (_store_partition, (out_desc, e_buf, acc_ready, acc_free, M, N, GROUP_M, STORE)),
        ], [EPI_WARPS], [EPI_REGS])

    _KERNEL = _head_fwd_kernel
    return _KERNEL


def descriptor_layouts(cfg: dict):
    """Shared-memory layouts of the A (BM x BK fp8), B (BN x BK fp8) and z-slice (BM x SUB_N bf16) blocks."""
    _build()
    bm, bn, bk, sub = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SUB_N"]
    a = gl.NVMMASharedLayout.get_default_for([bm, bk], gl.float8e4nv)
    b = gl.NVMMASharedLayout.get_default_for([bn, bk], gl.float8e4nv)
    c = gl.NVMMASharedLayout.get_default_for([bm, sub], gl.bfloat16)
    return a, b, c


def kernel_constexprs(cfg: dict) -> dict:
    return {"GROUP_M": cfg["GROUP_M"], "STAGES": cfg["STAGES"], "EPI_WARPS": cfg["EPI_WARPS"],
            "EPI_REGS": cfg["EPI_REGS"], "STORE": cfg["STORE"]}


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def launch(x_f8, w_f8, scale, out, cfg=None):
    """out = bf16((x_f8 @ w_f8.T) * scale): x_f8 (M, K), w_f8 (N, K) float8_e4m3fn contiguous, scale a
    one-element float32 tensor, out (M, N) bfloat16 contiguous, all on one Hopper GPU. K must be a
    multiple of 16 and N of 8 (TMA's 16-byte row strides); M any. cfg: BASE entries to override."""
    kernel = _build()
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    cfg = config(cfg)
    m, k = x_f8.shape
    n = w_f8.shape[0]
    if x_f8.dtype != torch.float8_e4m3fn or w_f8.dtype != torch.float8_e4m3fn or out.dtype != torch.bfloat16:
        raise TypeError("head_fwd_gluon.launch: x_f8, w_f8 float8_e4m3fn and out bfloat16 expected")
    if w_f8.shape[1] != k or tuple(out.shape) != (m, n) or k % 16 or n % 8:
        raise ValueError(f"head_fwd_gluon.launch: shapes x {tuple(x_f8.shape)} w {tuple(w_f8.shape)} "
                         f"out {tuple(out.shape)} (K % 16 == 0, N % 8 == 0 needed)")
    if not (x_f8.is_contiguous() and w_f8.is_contiguous() and out.is_contiguous()):
        raise ValueError("head_fwd_gluon.launch: contiguous operands expected")
    if scale.numel() != 1 or scale.dtype != torch.float32:
        raise ValueError("head_fwd_gluon.launch: scale must be a one-element float32 tensor")
    if not m:
        return out
    bm, bn, bk, sub = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SUB_N"]
    a_l, b_l, c_l = descriptor_layouts(cfg)
    a_desc = TensorDescriptor.from_tensor(x_f8, [bm, bk], a_l)
    b_desc = TensorDescriptor.from_tensor(w_f8, [bn, bk], b_l)
    out_desc = TensorDescriptor.from_tensor(out, [bm, sub], c_l)
    tiles = -(-m // bm) * -(-n // bn)
    dev = x_f8.device.index if x_f8.device.index is not None else torch.cuda.current_device()
    progs = min(tiles, _sm_count(dev))
    kernel[(progs,)](a_desc, b_desc, out_desc, scale, m, n, k, **kernel_constexprs(cfg),
                     num_warps=NUM_WARPS, maxnreg=cfg["MAXNREG"])
    return out


# --------------------------------------------------------------------------- compile-only (CPU)


def compile_offline(cfg=None):
    """Compile for sm_90 without a GPU (Triton's bundled ptxas); the CompiledKernel. The launcher's
    specialisations at the record's shape are assumed: M, N, K multiples of 16, aligned scale."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel = _build()
    cfg = config(cfg)
    a_l, b_l, c_l = descriptor_layouts(cfg)
    bm, bn, bk, sub = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SUB_N"]
    consts = dict(kernel_constexprs(cfg), num_warps=NUM_WARPS)
    signature = {"a_desc": f"tensordesc<fp8e4nv[{bm}, {bk}],{a_l!r}>",
                 "b_desc": f"tensordesc<fp8e4nv[{bn}, {bk}],{b_l!r}>",
                 "out_desc": f"tensordesc<bf16[{bm}, {sub}],{c_l!r}>",
                 "scale_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32"}
    signature.update({name: "constexpr" for name in consts})
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in ("scale_ptr", "M", "N", "K")}
    return triton.compile(GluonASTSource(kernel, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": NUM_WARPS, "maxnreg": cfg["MAXNREG"]})


def compile_only() -> bool:
    from relu2_gluon_bench import inspect_compiled  # same folder: the relu2 kernel's compile checks

    ok = True
    dump = os.environ.get("HEAD_FWD_GLUON_DUMP")  # a folder: each variant's ttgir/ptx written there
    for name, over in CONFIGS.items():
        cfg = config(over)
        try:
            k = compile_offline(cfg)
        except Exception as e:  # noqa: BLE001 - report and go on to the next variant
            ok = False
            print(f"{name}: COMPILE FAILED {type(e).__name__}: {str(e)[:2000]}")
            continue
        blocks = [m.get("block_size") for m in (k.metadata.tensordesc_meta or [])]
        r = inspect_compiled(f"{name} {over}", k, dump and os.path.join(dump, name),
                             f", ring + buffer {smem_bytes(cfg)} B, TMA boxes {blocks}")
        ok &= not (r["spills"] or r["too_big"])
    print("ok: no spills, shared memory within the limit" if ok else "FAILED: see above")
    return ok


# --------------------------------------------------------------------------- device bench (H200)


def diff(z, ref, rows=4096) -> dict:
    """Share of elements that differ, max abs difference, bit equality, NaNs in z (unwritten, as z is
    pre-filled with NaN) and ref's max abs; in row chunks (the full tensors are 4.9 GB each)."""
    differ = nan = 0
    max_abs = ref_max = 0.0
    for i in range(0, z.shape[0], rows):
        a, b = z[i:i + rows], ref[i:i + rows]
        differ += (a.view(torch.int16) != b.view(torch.int16)).sum().item()
        nan += a.isnan().sum().item()
        max_abs = max(max_abs, (a.float() - b.float()).abs().nan_to_num(float("inf")).max().item())
        ref_max = max(ref_max, b.float().abs().max().item())
    return {"frac_differ": differ / z.numel(), "max_abs": max_abs, "bit_equal": differ == 0, "nan": nan,
            "ref_max_abs": ref_max}


def scaled_mm(x_f8, w_f8, sa, sb):
    return torch._scaled_mm(x_f8, w_f8.T, out_dtype=torch.bfloat16, scale_a=sa, scale_b=sb, use_fast_accum=True)


def fp32_reference(x_f8, w_f8, scale, rows=4096):
    """bf16(fp32 product of the fp8 values * scale), row chunk by chunk (TF32 off: exact products)."""
    out = torch.empty(x_f8.shape[0], w_f8.shape[0], device=x_f8.device, dtype=torch.bfloat16)
    wf = w_f8.float()
    for i in range(0, x_f8.shape[0], rows):
        out[i:i + rows] = (x_f8[i:i + rows].float() @ wf.T * scale).bfloat16()
    return out


def _err(e) -> str:
    return f"{type(e).__name__}: {str(e)[:500]}"


def _inputs(m, k, n, dev, gen):
    """Model-like fp8 operands: x RMS-normed-like / x_s, w ~ 0.02 randn / w_s; scales as 0-d tensors."""
    x = (torch.randn(m, k, device=dev, generator=gen, dtype=torch.bfloat16) / X_S).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device=dev, generator=gen) * 0.02 / W_S).to(torch.float8_e4m3fn)
    sa = torch.full((), X_S, device=dev, dtype=torch.float32)
    sb = torch.full((), W_S, device=dev, dtype=torch.float32)
    return x, w, sa, sb, sa * sb


def ragged_checks(dev, gen):
    """Small ragged shapes, every storing variant, against cuBLAS (where _scaled_mm takes the shape: it
    is believed to want N % 16 == 0) and an fp32 product of the fp8 values."""
    rows = []
    for m, k, n in RAGGED:
        x, w, sa, sb, scale = _inputs(m, k, n, dev, gen)
        ref32 = fp32_reference(x, w, scale)
        try:
            ref = scaled_mm(x, w, sa, sb)
        except Exception as e:  # noqa: BLE001
            ref = _err(e)
        for name, over in CONFIGS.items():
            if not config(over)["STORE"]:
                continue
            row = {"M": m, "K": k, "N": n, "variant": name}
            try:
                # z: the first M rows of a NaN-filled allocation; the 64 rows after must stay NaN (a store
                # past column N would land in the next row, where the diff shows it)
                z_guard = torch.full(((m + 64) * n,), float("nan"), device=dev, dtype=torch.bfloat16)
                z = z_guard[:m * n].view(m, n)
                launch(x, w, scale, z, over)
                torch.cuda.synchronize()
                row["vs_fp32"] = diff(z, ref32)
                row["vs_cublas"] = diff(z, ref) if isinstance(ref, torch.Tensor) else ref
                row["guard_untouched"] = bool(z_guard[m * n:].isnan().all().item())
                close = row["vs_fp32"]["max_abs"] <= 0.02 * max(row["vs_fp32"]["ref_max_abs"], 1.0)
                row["ok"] = close and row["vs_fp32"]["nan"] == 0 and row["guard_untouched"]
            except Exception as e:  # noqa: BLE001 - a failure is a result; go on
                row["error"] = _err(e)
                row["ok"] = False
            rows.append(row)
            vc = row.get("vs_cublas")
            print("ragged", (m, k, n), name, "ok" if row["ok"] else "MISMATCH/ERROR",
                  row.get("error") or (f"vs fp32 {row['vs_fp32']['frac_differ']:.2e} {row['vs_fp32']['max_abs']:.3g}; "
                                       + (f"vs cublas {vc['frac_differ']:.2e} {vc['max_abs']:.3g}"
                                          if isinstance(vc, dict) else f"cublas: {vc[:80]}")), flush=True)
    return rows


def device_bench(out_path):
    from cuda_timing import median_us

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda"
    res = {"shape": {"M": M, "K": K, "N": N}, "base": BASE, "configs": CONFIGS,
           "device": torch.cuda.get_device_name()}

    def save():
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)

    gen = torch.Generator(device=dev).manual_seed(0)
    res["ragged"] = ragged_checks(dev, gen)
    save()

    gen.manual_seed(1)
    x, w, sa, sb, scale = _inputs(M, K, N, dev, gen)
    ref = scaled_mm(x, w, sa, sb)
    z = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    time = lambda fn: median_us(fn, reps=20, warmup=5)  # noqa: E731
    res["variants"] = {}
    for name, over in CONFIGS.items():
        row = {}
        try:
            z.fill_(float("nan"))
            launch(x, w, scale, z, over)
            torch.cuda.synchronize()
            if config(over)["STORE"]:
                row["vs_cublas"] = diff(z, ref)
            row["us"] = time(lambda over=over: launch(x, w, scale, z, over))
        except Exception as e:  # noqa: BLE001
            row["error"] = _err(e)
            traceback.print_exc()
        res["variants"][name] = row
        save()
        vc = row.get("vs_cublas", {})
        print(f"{name}: " + (row["error"] if "error" in row else
                             f"{row['us']:.1f} us" + (f", vs cublas: share differing {vc['frac_differ']:.2e}, "
                                                      f"max abs {vc['max_abs']:.3g}, bit-equal {vc['bit_equal']}, "
                                                      f"NaN {vc['nan']}" if vc else " (no store)")), flush=True)

    # the fp32 product of the same fp8 values: which of the two is nearer (at the record's shape)
    try:
        ref32 = fp32_reference(x, w, scale)
        launch(x, w, scale, z)
        res["base_vs_fp32"] = diff(z, ref32)
        res["cublas_vs_fp32"] = diff(ref, ref32)
        del ref32
    except Exception as e:  # noqa: BLE001
        res["fp32_reference_error"] = _err(e)
    save()

    us = res["us_reference"] = {}
    us["cublas_fwd"] = time(lambda: scaled_mm(x, w, sa, sb))
    us["bf16_copy_MxN"] = time(lambda: z.copy_(ref))   # reads and writes 4.9 GB
    us["bf16_fill_MxN"] = time(lambda: z.fill_(1.0))   # writes 4.9 GB: the store floor
    save()
    try:  # grad_x-shaped: (M, N) e5m2 @ (N, K) e4m3 -> (M, K) bf16, same FLOPs, small output;
        # g lives in z's storage (its first M x N bytes) rather than a second big allocation
        g = z.view(-1).view(torch.float8_e5m2)[:M * N].view(M, N)
        for i in range(0, M, 4096):
            g[i:i + 4096] = (torch.randn(min(4096, M - i), N, device=dev, generator=gen) * 8).to(torch.float8_e5m2)
        w_cm = w.T.contiguous().T  # (N, K) column-major, as fp8._backward_impl passes it
        us["cublas_grad_x_shaped"] = time(lambda: torch._scaled_mm(
            g, w_cm, out_dtype=torch.bfloat16, scale_a=sa, scale_b=sb, use_fast_accum=False))
    except Exception as e:  # noqa: BLE001
        res["grad_x_shaped_error"] = _err(e)
    save()

    print("reference us:", {k2: round(v, 1) for k2, v in us.items()})
    print("variants us:", {n2: round(r["us"], 1) for n2, r in res["variants"].items() if "us" in r})
    for key in ("base_vs_fp32", "cublas_vs_fp32"):
        if key in res:
            print(key, f"share differing {res[key]['frac_differ']:.2e} max abs {res[key]['max_abs']:.3g}")
    bad = [f"{r['M']}x{r['K']}x{r['N']} {r['variant']}" for r in res["ragged"] if not r["ok"]]
    print("ragged: all ok" if not bad else f"ragged FAILURES: {bad}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--compile-only":
        sys.exit(0 if compile_only() else 1)
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    device_bench(sys.argv[1])
