"""The ReLU² MLP with its activation inside the matrix products' epilogues.

The record's MLP is y = relu(x W1ᵀ)² W2ᵀ. Compiled as plain PyTorch, the
two products are cuBLAS calls and Inductor adds two memory-bound passes per
layer and micro-step over the (tokens x 4·dim) hidden activations: forward,
read h and write a = relu(h)²; backward, read dL/da and h and write dL/dh.
At the record's 49,152 tokens x 3,072 that is 0.9 + 0.9 GB, about 33 ms of
an H200 step (2026-11-30, 9c0f046).

Here the two products whose outputs feed those passes are one Triton kernel
each, with the pass in the epilogue while the accumulator tile is still in
registers:

- forward: h = x W1ᵀ, rounded to bfloat16 as cuBLAS would write it, then
  a = relu(h)² from that bfloat16 h; the kernel stores a (the next
  product's input, which the backward keeps anyway for W2's gradient), and
  h too only with FROM_A=0;
- backward: dL/da = dL/dy W2, rounded to bfloat16, then
  dL/dh = dL/da · 2·relu(h) where h > 0 and 0 elsewhere, with relu(h)
  recovered from a in the epilogue (or h loaded, FROM_A=0); dL/da is never
  written.

Why a alone is enough (FROM_A, the default since 221c046, 2026-12-02):
for a bfloat16 r = relu(h), a = bf16(r²) and bf16(sqrt(a)) = r exactly (IEEE
square root, round to nearest even) for every r with 2⁻⁶³ <= r < 2⁶⁴, and
r = 0 gives a = 0; a CPU test checks all 32,640 positive bfloat16 values.
Outside that range (0 < relu(h) < 1.1e-19, where r² underflows, or r² = inf)
the recovered value differs; the backward's dL/dh there is below 2.2e-19
|dL/da| instead of a value of that size, or inf where the forward already
overflowed. The forward then stores half the bytes and the backward reads
the same number, and autograd keeps one (tokens x 3,072) tensor a layer
instead of two.

The other products (y = a W2ᵀ and the three weight and input gradients)
stay cuBLAS calls inside the ops. The function is the compiled reference's:
each rounding to bfloat16 happens where the reference's does; the products'
summation order differs, so results differ in the last bits (tests hold the
kernel to the reference on the CPU interpreter and on the GPU).

The kernel is persistent: `min(tiles, SMs)` programs walk the output tiles,
and Triton's loop flattening lets the next tile's loads start during the
current tile's epilogue, which matters with K = 768 (twelve 64-wide steps a
tile). Operands come through tensor-memory-accelerator descriptors, so the
kernel needs compute capability 9.0 or later (or Triton's CPU interpreter);
`pick` falls back to the reference elsewhere. `model.mlp_kernel` chooses:
"torch" (the reference), "triton", "auto" (the kernel where it can run; the
default).

Measured on an H200 (2026-11-30, 0f99371): per layer and
micro-step the forward went from 458-460 us (cuBLAS 317-321 + Inductor's
pass) to 392-394 us, the backward from 522-524 to 430 us, with every output
and gradient bit-equal to the compiled reference at the record's size; the
step 649.77 -> 640.18 ms (bench), full runs 638.3 -> 625.6 / 624.8 ms. The
kernels are still ~75 us a call slower than cuBLAS's product alone: the
epilogue's stores do not overlap the next tile's products.

On a capability-9.0 GPU the backward's product runs instead in the
warp-specialised Gluon kernel of `relu2_gluon.py` (launch key GLUON, on for
the backward by default): its epilogue runs on separate warps while the
tensor cores work on the next tile. Bit-equal outputs, 478.7 -> 408.3 us a
call on an H200 (2026-12-01, 03a3753). The forward gained
nothing there (394.8 -> 395.2 us) and keeps this kernel.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from speedrun.kernels.choice import TRITON_FOUND, built_once, pick_impl
from speedrun.kernels.relu2_epilogue import DRELU2, DRELU2_FROM_A, STORE_A, STORE_H_AND_A

# The launch, per direction; `options` ("KEY=VALUE,fwd.KEY=VALUE,bwd.KEY=VALUE") overrides it.
# Chosen on an H200 at the record's shapes (scripts/bench/relu2_bench.py, 53 launches; 2026-11-30,
# 0f99371): 128 x 256 x 64 tiles, 8 warps, persistent, the epilogue in two column halves; the
# forward 4 stages (392-394 us a call), the backward 3 stages with h read by plain loads (430 us; four
# stages do not fit in shared memory). WARP_SPEC (Triton's automatic warp specialisation, documented
# for Blackwell) compiled on the H200 but changed nothing (392.4 against 393.6 us), so it stays off.
# GLUON: on a compute-capability-9.0 GPU, the warp-specialised Gluon kernel (relu2_gluon.py: its epilogue
# on separate warps, overlapping the next tile's products) in place of this one. Measured in 03a3753 (2026-12-01) on
# an H200, bit-equal outputs: backward 478.7 -> 408.3 us, forward 394.8 -> 395.2 us; so the backward only.
# FROM_A (read by the forward; the backward follows what the forward saved): save only a and recover
# relu(h) from it in the backward's epilogue (module docstring); 0 saves h as well, as before.
# A_TMA (read by the Gluon backward only): its epilogue loads the saved tensor a whole tile at a time by
# TMA while the tile's products run, in place of plain loads one slice ahead, beside two 64-wide ring
# stages (1) or four 32-wide ones (2) (relu2_gluon.GLUON_CONFIG's `*_tma`, `*_tma32` entries); measured
# slower in 4fb0892 (2026-12-02: 596-642 against 422-476 us a call), so off (0).
# XTILE, EPI_REGS (read by the Gluon backward only): its plain loads one slice ahead across tiles too;
# the epilogue warpgroup's registers (0: relu2_gluon.GLUON_CONFIG's). Bit-equal; per call a little faster,
# in the training step no gain (4fb0892, 2026-12-02), so off (0).
KERNEL_CONFIG = {
    "fwd": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "EPI_SPLIT": 2, "PERSISTENT": 1,
            "H_PTR": 0, "WARP_SPEC": 0, "GLUON": 0, "FROM_A": 1, "A_TMA": 0, "XTILE": 0, "EPI_REGS": 0,
            "num_stages": 4, "num_warps": 8},
    "bwd": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "EPI_SPLIT": 2, "PERSISTENT": 1,
            "H_PTR": 1, "WARP_SPEC": 0, "GLUON": 1, "FROM_A": 1, "A_TMA": 0, "XTILE": 0, "EPI_REGS": 0,
            "num_stages": 3, "num_warps": 8},
}
KEYS = tuple(KERNEL_CONFIG["fwd"])
# The kernel's epilogues: even codes are the forward's, odd the backward's. DRELU2_FROM_A: DRELU2 with
# relu(h) = bf16(sqrt(a)) from the saved a in place of h.


def reference(x: Tensor, fc_w: Tensor, proj_w: Tensor) -> Tensor:
    """The MLP as the model writes it without the kernel."""
    return F.linear(F.relu(F.linear(x, fc_w)).square(), proj_w)


def _valid(c: dict[str, int]) -> bool:
    """One direction's launch keys within their ranges (parse_options' message lists them)."""
    blocks = [c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")]
    flags = [c[k] for k in ("PERSISTENT", "H_PTR", "WARP_SPEC", "GLUON", "FROM_A", "XTILE")]
    regs = c["EPI_REGS"]
    return (all(b >= 16 and not b & (b - 1) for b in blocks) and c["EPI_SPLIT"] in (1, 2, 4)
            and all(f in (0, 1) for f in flags) and 0 <= c["A_TMA"] <= 2
            and (regs == 0 or (regs % 8 == 0 and 24 <= regs <= 256)))


def parse_options(text: str) -> dict[str, dict[str, int]]:
    """KERNEL_CONFIG with "KEY=VALUE" (both directions) or "fwd.KEY=VALUE"/"bwd.KEY=VALUE" applied;
    ValueError naming the item if malformed."""
    out = {d: dict(c) for d, c in KERNEL_CONFIG.items()}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        where, dot, name = key.strip().rpartition(".")
        dirs = [where] if dot else list(out)
        if not sep or name not in KEYS or any(d not in out for d in dirs) or not value.strip().isdigit():
            raise ValueError(f"mlp kernel option {item!r}: want KEY=INT, KEY one of {KEYS}, "
                             "optionally prefixed fwd. or bwd.")
        for d in dirs:
            out[d][name] = int(value)
    for d, c in out.items():
        if not _valid(c):
            raise ValueError(f"mlp kernel options ({d}): BLOCK_M/N/K powers of two >= 16, EPI_SPLIT 1, 2 or 4, "
                             f"PERSISTENT, H_PTR, WARP_SPEC, GLUON, FROM_A and XTILE 0 or 1, A_TMA 0, 1 or 2, "
                             f"EPI_REGS 0 or a multiple of 8 from 24 to 256; got {c}")
    return out


def supported(x: Tensor, fc_w: Tensor, proj_w: Tensor) -> bool:
    """Can the kernel take these tensors? bfloat16 throughout, dimensions that give the descriptors
    16-byte rows, and on CUDA a GPU with tensor-memory-accelerator loads (capability 9.0+)."""
    if not (x.dtype == fc_w.dtype == proj_w.dtype == torch.bfloat16):
        return False
    if fc_w.dim() != 2 or proj_w.shape != fc_w.shape[::-1] or x.shape[-1] != fc_w.shape[1]:
        return False
    if fc_w.shape[0] % 8 or fc_w.shape[1] % 8:
        return False
    return x.device.type != "cuda" or _has_tma(x.device.index if x.device.index is not None else -1)


@torch.compiler.assume_constant_result
def _has_tma(index: int) -> bool:
    """Tensor-memory-accelerator loads: compute capability 9.0 or later (a constant for Dynamo)."""
    return torch.cuda.get_device_capability(index if index >= 0 else None)[0] >= 9


def pick(x: Tensor, fc_w: Tensor, proj_w: Tensor, impl: str = "auto") -> str:
    """"torch" or "triton" for these tensors; "triton" asked for where it cannot run is an error."""
    choice = pick_impl(x, impl)
    if choice == "triton" and not (TRITON_FOUND and supported(x, fc_w, proj_w)):
        if impl == "auto":
            return "torch"
        raise ValueError("model.mlp_kernel=triton needs Triton, bfloat16 weights and activations, "
                         "dimensions divisible by 8 and a CUDA GPU of capability 9.0+ (or the interpreter)")
    return choice


def relu2_mlp(x: Tensor, fc_w: Tensor, proj_w: Tensor, impl: str = "auto", options: str = "") -> Tensor:
    """relu(x fc_wᵀ)² proj_wᵀ; x (..., D), fc_w (F, D), proj_w (D, F), one dtype. impl as `pick`;
    options as `parse_options` (checked by the op; `config.validate` checks `model.mlp_options`)."""
    if pick(x, fc_w, proj_w, impl) == "torch":
        return reference(x, fc_w, proj_w)
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    want_grad = torch.is_grad_enabled() and (x.requires_grad or fc_w.requires_grad or proj_w.requires_grad)
    y = torch.ops.speedrun.relu2_mlp(flat, fc_w.contiguous(), proj_w.contiguous(), want_grad, options)[0]
    return y.view(*x.shape[:-1], y.shape[-1])


# --------------------------------------------------------------------------- the ops


@torch.library.custom_op("speedrun::relu2_mlp", mutates_args=())
def relu2_mlp_op(x: Tensor, fc_w: Tensor, proj_w: Tensor, want_grad: bool, options: str
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """y (N, D), and what the backward needs: h and a (N, F); with FROM_A, h (0,)-shaped; without
    want_grad, both (0,)-shaped."""
    cfg = parse_options(options)["fwd"]
    h_shape, a_shape = _saved_shapes(x, fc_w, want_grad, cfg)
    a = x.new_empty((x.shape[0], fc_w.shape[0]))
    h = x.new_empty(h_shape)
    launch(x, fc_w, h, a, STORE_H_AND_A if h.numel() else STORE_A, b_nk=True, cfg=cfg)
    y = a @ proj_w.T
    return y, h, a if want_grad else x.new_empty(a_shape)


def _saved_shapes(x: Tensor, fc_w: Tensor, want_grad: bool, cfg: dict[str, int]) -> tuple[tuple, tuple]:
    """The shapes of the forward's saved h and a: (N, F) each, h (0,) with FROM_A, both without a gradient."""
    full = (x.shape[0], fc_w.shape[0])
    if not want_grad:
        return (0,), (0,)
    return ((0,) if cfg["FROM_A"] else full), full


@relu2_mlp_op.register_fake
def _(x, fc_w, proj_w, want_grad, options):
    h_shape, a_shape = _saved_shapes(x, fc_w, want_grad, parse_options(options)["fwd"])
    return x.new_empty((x.shape[0], proj_w.shape[0])), x.new_empty(h_shape), x.new_empty(a_shape)


def _setup_context(ctx, inputs, output):
    x, fc_w, proj_w, want_grad, options = inputs
    _, h, a = output
    ctx.mark_non_differentiable(h, a)
    ctx.save_for_backward(x, fc_w, proj_w, h, a)
    ctx.want_grad, ctx.options = want_grad, options


def _backward(ctx, g_y, *_):
    if not ctx.want_grad:
        raise RuntimeError("relu2_mlp: the forward ran without a gradient (no grad mode or no input required grad)")
    grads = torch.ops.speedrun.relu2_mlp_backward(g_y.contiguous(), *ctx.saved_tensors, ctx.options)
    return *grads, None, None


relu2_mlp_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("speedrun::relu2_mlp_backward", mutates_args=())
def relu2_mlp_backward(g_y: Tensor, x: Tensor, fc_w: Tensor, proj_w: Tensor, h: Tensor, a: Tensor, options: str
                       ) -> tuple[Tensor, Tensor, Tensor]:
    """(dL/dx, dL/dfc_w, dL/dproj_w); dL/dh from the kernel (dL/dy proj_w with the ReLU² derivative,
    relu(h) recovered from a where the forward saved no h)."""
    g_proj = g_y.T @ a
    g_h = torch.empty_like(a)
    from_a = h.numel() == 0
    launch(g_y, proj_w, a if from_a else h, g_h, DRELU2_FROM_A if from_a else DRELU2, b_nk=False,
           cfg=parse_options(options)["bwd"])
    return g_h @ fc_w, g_h.T @ x, g_proj


@relu2_mlp_backward.register_fake
def _(g_y, x, fc_w, proj_w, h, a, options):
    return torch.empty_like(x), torch.empty_like(fc_w), torch.empty_like(proj_w)


# --------------------------------------------------------------------------- Triton kernel

triton = tl = None  # set by built_once on first use
_tile_coords = _epilogue = _halves = _relu2_mm_kernel = None


@built_once
def _build_kernel(interpreted: bool):
    """Define the kernel (once, `built_once`); interpreted: TRITON_INTERPRET=1 now."""
    global _tile_coords, _epilogue, _halves, _relu2_mm_kernel  # module globals: the interpreter
    # re-executes the source with them

    @triton.jit
    def _tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
        """Output tile -> (row block, column block), GROUP_M row blocks at a time for L2 reuse."""
        per_group = GROUP_M * num_n
        first_m = (tile // per_group) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        return first_m + (tile % per_group) % size_m, (tile % per_group) // size_m

    @triton.jit
    def _epilogue(acc, h_desc, h_ptr, out_desc, off_m, off_n, M, N, EPILOGUE: tl.constexpr,
                  H_PTR: tl.constexpr):
        """acc (float32) -> bfloat16 as a plain product would store it, then the ReLU² part. H_PTR: the
        backward loads h (or a) with plain loads straight into registers (no shared-memory staging)."""
        p = acc.to(tl.bfloat16)
        if EPILOGUE % 2 == 1:  # dL/dh = dL/da * 2 relu(h); DRELU2_FROM_A: h_desc/h_ptr hold a
            if H_PTR:
                rows = off_m + tl.arange(0, acc.shape[0])
                cols = off_n + tl.arange(0, acc.shape[1])
                ok = (rows[:, None] < M) & (cols[None, :] < N)
                hf = tl.load(h_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], mask=ok, other=0.0)
                hf = hf.to(tl.float32)
            else:
                hf = h_desc.load([off_m, off_n]).to(tl.float32)
            if EPILOGUE == 3:  # relu(h) = bf16(sqrt(a)), exact (module docstring)
                hf = tl.sqrt(hf).to(tl.bfloat16).to(tl.float32)
            g = tl.where(hf > 0.0, p.to(tl.float32) * (2.0 * hf), 0.0)
            out_desc.store([off_m, off_n], g.to(tl.bfloat16))
        else:  # a = relu(h)^2 (and h itself for the backward)
            if EPILOGUE == 0:
                h_desc.store([off_m, off_n], p)
            r = tl.maximum(p.to(tl.float32), 0.0)
            out_desc.store([off_m, off_n], (r * r).to(tl.bfloat16))

    @triton.jit
    def _halves(x, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr):
        """The left and right column halves of an (BLOCK_M, WIDTH) tile."""
        return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, WIDTH // 2)), (0, 2, 1)))

    @triton.jit
    def _relu2_mm_kernel(a_desc, b_desc, h_desc, h_ptr, out_desc, M, N, num_progs,
                         EPILOGUE: tl.constexpr, B_NK: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_STEPS: tl.constexpr,
                         GROUP_M: tl.constexpr, EPI_SPLIT: tl.constexpr, ITERS: tl.constexpr,
                         FLATTEN: tl.constexpr, WIDEN: tl.constexpr, H_PTR: tl.constexpr,
                         WARP_SPEC: tl.constexpr):
        """P = A B (A (M, K); B (N, K) if B_NK else (K, N)), tile by tile, with `_epilogue` on each.
        Program p takes tiles p, p + num_progs, ... (ITERS of them); past the last tile it repeats the
        last one (the same bytes stored twice), so the loop has no branch. Loop bounds are constexpr:
        Triton 3.6's interpreter cannot take runtime bounds under numpy >= 2.4. WIDEN (the interpreter
        only): its tl.dot of bfloat16 tiles is wrong, so they are widened to float32 first, which gives
        the same products exactly."""
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(N, BLOCK_N)
        last = num_m * num_n - 1
        for it in tl.range(0, ITERS, flatten=FLATTEN, warp_specialize=WARP_SPEC):
            tile = tl.minimum(tl.program_id(0) + it * num_progs, last)
            pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ks in range(K_STEPS):
                a = a_desc.load([off_m, ks * BLOCK_K])
                if B_NK:
                    b = b_desc.load([off_n, ks * BLOCK_K]).T
                else:
                    b = b_desc.load([ks * BLOCK_K, off_n])
                if WIDEN:
                    a, b = a.to(tl.float32), b.to(tl.float32)
                acc = tl.dot(a, b, acc)
            # the epilogue in EPI_SPLIT column slices: less shared memory for the stores
            if EPI_SPLIT == 1:
                _epilogue(acc, h_desc, h_ptr, out_desc, off_m, off_n, M, N, EPILOGUE, H_PTR)
            else:
                left, right = _halves(acc, BLOCK_M, BLOCK_N)
                if EPI_SPLIT == 2:
                    _epilogue(left, h_desc, h_ptr, out_desc, off_m, off_n, M, N, EPILOGUE, H_PTR)
                    _epilogue(right, h_desc, h_ptr, out_desc, off_m, off_n + BLOCK_N // 2, M, N, EPILOGUE, H_PTR)
                else:
                    q0, q1 = _halves(left, BLOCK_M, BLOCK_N // 2)
                    q2, q3 = _halves(right, BLOCK_M, BLOCK_N // 2)
                    _epilogue(q0, h_desc, h_ptr, out_desc, off_m, off_n, M, N, EPILOGUE, H_PTR)
                    _epilogue(q1, h_desc, h_ptr, out_desc, off_m, off_n + BLOCK_N // 4, M, N, EPILOGUE, H_PTR)
                    _epilogue(q2, h_desc, h_ptr, out_desc, off_m, off_n + BLOCK_N // 2, M, N, EPILOGUE, H_PTR)
                    _epilogue(q3, h_desc, h_ptr, out_desc, off_m, off_n + 3 * (BLOCK_N // 4), M, N, EPILOGUE,
                              H_PTR)

    return _relu2_mm_kernel


def _programs(device: torch.device, tiles: int, persistent: bool) -> int:
    if not persistent:
        return tiles
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return min(tiles, sms)


def use_gluon(device: torch.device, cfg: dict[str, int]) -> bool:
    """The Gluon kernel for this launch: asked for (cfg GLUON), a capability-9.0 GPU (its wgmma is
    Hopper's alone) and Gluon's Hopper support importable; otherwise this module's kernel runs."""
    if not cfg.get("GLUON") or device.type != "cuda":
        return False
    from speedrun.kernels import relu2_gluon
    return _capability(device.index if device.index is not None else -1) == (9, 0) and relu2_gluon.available()


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index if index >= 0 else None)


def gluon_overrides(cfg: dict[str, int]) -> dict[str, int]:
    """The GLUON_CONFIG entries a launch configuration sets: XTILE, and EPI_REGS where not 0."""
    return {"XTILE": cfg.get("XTILE", 0), **({"EPI_REGS": cfg["EPI_REGS"]} if cfg.get("EPI_REGS") else {})}


def launch(a: Tensor, b: Tensor, h: Tensor, out: Tensor, epilogue: int, b_nk: bool, cfg: dict[str, int]) -> None:
    """out (and h) from P = a @ (b.T if b_nk else b) with `epilogue` (STORE_H_AND_A, DRELU2, STORE_A,
    DRELU2_FROM_A with the saved a passed as h); all bfloat16 and contiguous, h (0,)-shaped with
    STORE_A. The Gluon kernel where `use_gluon` says."""
    if use_gluon(a.device, cfg):
        from speedrun.kernels import relu2_gluon
        if relu2_gluon.try_launch(a, b, h, out, epilogue, b_nk, a_tma=cfg.get("A_TMA", 0),
                                      overrides=gluon_overrides(cfg)):
            return
    kernel = _build_kernel()
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = a.shape
    N = b.shape[0] if b_nk else b.shape[1]
    if not M:
        return
    BM, BN, BK, split = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["EPI_SPLIT"]
    store = [BM, BN // split]
    a_desc = TensorDescriptor.from_tensor(a, [BM, BK])
    b_desc = TensorDescriptor.from_tensor(b, [BN, BK] if b_nk else [BK, BN])
    out_desc = TensorDescriptor.from_tensor(out, store)
    h_desc = TensorDescriptor.from_tensor(h if epilogue != STORE_A else out, store)
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    progs = _programs(a.device, tiles, bool(cfg["PERSISTENT"]))
    kernel[(progs,)](a_desc, b_desc, h_desc, h if epilogue != STORE_A else out, out_desc, M, N, progs, EPILOGUE=epilogue, B_NK=b_nk,
                     BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, K_STEPS=triton.cdiv(K, BK), GROUP_M=cfg["GROUP_M"],
                     EPI_SPLIT=split, ITERS=triton.cdiv(tiles, progs),
                     FLATTEN=bool(cfg["PERSISTENT"]), WIDEN=a.device.type != "cuda", H_PTR=bool(cfg["H_PTR"]),
                     WARP_SPEC=bool(cfg["WARP_SPEC"]),
                     num_stages=cfg["num_stages"], num_warps=cfg["num_warps"])
