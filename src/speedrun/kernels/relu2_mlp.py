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
  a = relu(h)² from that bfloat16 h; the kernel stores a alone (the next
  product's input, which the backward keeps anyway for W2's gradient);
- backward: dL/da = dL/dy W2, rounded to bfloat16, then
  dL/dh = dL/da · 2·relu(h) where h > 0 and 0 elsewhere, with relu(h)
  recovered from a in the epilogue; dL/da is never written.

Why a alone is enough (221c046, 2026-12-02; saving h as well cost 3.5 ms a
step and 3.4 GiB of peak memory):
for a bfloat16 r = relu(h), a = bf16(r²) and bf16(sqrt(a)) = r exactly (IEEE
square root, round to nearest even) for every r with 2⁻⁶³ <= r < 2⁶⁴, and
r = 0 gives a = 0; a CPU test checks all 32,640 positive bfloat16 values.
Outside that range (0 < relu(h) < 1.1e-19, where r² underflows, or r² = inf)
the recovered value differs; the backward's dL/dh there is below 2.2e-19
|dL/da| instead of a value of that size, or inf where the forward already
overflowed. The forward stores half the bytes it would with h, the backward
reads the same number, and autograd keeps one (tokens x 3,072) tensor a
layer instead of two.

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
`pick` falls back to the reference elsewhere. The `impl` argument (the model's,
from `train.kernels`, `kernels/table.py`) chooses: "torch" (the reference),
"triton", "auto" (the kernel where it can run; the default).

Measured on an H200 (2026-11-30, 0f99371): per layer and
micro-step the forward went from 458-460 us (cuBLAS 317-321 + Inductor's
pass) to 392-394 us, the backward from 522-524 to 430 us, with every output
and gradient bit-equal to the compiled reference at the record's size; the
step 649.77 -> 640.18 ms (bench), full runs 638.3 -> 625.6 / 624.8 ms. The
kernels are still ~75 us a call slower than cuBLAS's product alone: the
epilogue's stores do not overlap the next tile's products.

On a capability-9.0 GPU the backward's product runs instead in the
warp-specialised Gluon kernel of `relu2_gluon.py`: its epilogue runs on
separate warps while the tensor cores work on the next tile. Bit-equal
outputs, 478.7 -> 408.3 us a call on an H200 (2026-12-01, 03a3753). A Gluon
forward gained nothing (394.8 -> 395.2 us), so the forward keeps this kernel.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from speedrun.kernels.choice import TRITON_FOUND, built_once, pick_impl

# The launch, per direction (the benches pass others to `forward_product` / `backward_product`).
# Chosen on an H200 at the record's shapes (scripts/bench/relu2_bench.py, 53 launches; 2026-11-30,
# 0f99371): 128 x 256 x 64 tiles, 8 warps, persistent, the epilogue in two column halves; the
# forward 4 stages (392-394 us a call), the backward 3 stages with a read by plain loads (H_PTR; 430 us;
# four stages do not fit in shared memory).
KERNEL_CONFIG = {
    "fwd": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "EPI_SPLIT": 2, "PERSISTENT": 1,
            "H_PTR": 0, "num_stages": 4, "num_warps": 8},
    "bwd": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "EPI_SPLIT": 2, "PERSISTENT": 1,
            "H_PTR": 1, "num_stages": 3, "num_warps": 8},
}


def reference(x: Tensor, fc_w: Tensor, proj_w: Tensor) -> Tensor:
    """The MLP as the model writes it without the kernel."""
    return F.linear(F.relu(F.linear(x, fc_w)).square(), proj_w)


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
        raise ValueError("relu2_mlp impl=triton needs Triton, bfloat16 weights and activations, "
                         "dimensions divisible by 8 and a CUDA GPU of capability 9.0+ (or the interpreter)")
    return choice


def relu2_mlp(x: Tensor, fc_w: Tensor, proj_w: Tensor, impl: str = "auto") -> Tensor:
    """relu(x fc_wᵀ)² proj_wᵀ; x (..., D), fc_w (F, D), proj_w (D, F), one dtype. impl as `pick`."""
    if pick(x, fc_w, proj_w, impl) == "torch":
        return reference(x, fc_w, proj_w)
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    want_grad = torch.is_grad_enabled() and (x.requires_grad or fc_w.requires_grad or proj_w.requires_grad)
    y = torch.ops.speedrun.relu2_mlp(flat, fc_w.contiguous(), proj_w.contiguous(), want_grad)[0]
    return y.view(*x.shape[:-1], y.shape[-1])


# --------------------------------------------------------------------------- the ops


@torch.library.custom_op("speedrun::relu2_mlp", mutates_args=())
def relu2_mlp_op(x: Tensor, fc_w: Tensor, proj_w: Tensor, want_grad: bool) -> tuple[Tensor, Tensor]:
    """y (N, D), and what the backward needs: a (N, F); without want_grad, (0,)-shaped."""
    a = x.new_empty((x.shape[0], fc_w.shape[0]))
    forward_product(x, fc_w, a)
    y = a @ proj_w.T
    return y, a if want_grad else x.new_empty((0,))


@relu2_mlp_op.register_fake
def _(x, fc_w, proj_w, want_grad):
    a_shape = (x.shape[0], fc_w.shape[0]) if want_grad else (0,)
    return x.new_empty((x.shape[0], proj_w.shape[0])), x.new_empty(a_shape)


def _setup_context(ctx, inputs, output):
    x, fc_w, proj_w, want_grad = inputs
    _, a = output
    ctx.mark_non_differentiable(a)
    ctx.save_for_backward(x, fc_w, proj_w, a)
    ctx.want_grad = want_grad


def _backward(ctx, g_y, *_):
    if not ctx.want_grad:
        raise RuntimeError("relu2_mlp: the forward ran without a gradient (no grad mode or no input required grad)")
    grads = torch.ops.speedrun.relu2_mlp_backward(g_y.contiguous(), *ctx.saved_tensors)
    return *grads, None


relu2_mlp_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("speedrun::relu2_mlp_backward", mutates_args=())
def relu2_mlp_backward(g_y: Tensor, x: Tensor, fc_w: Tensor, proj_w: Tensor, a: Tensor
                       ) -> tuple[Tensor, Tensor, Tensor]:
    """(dL/dx, dL/dfc_w, dL/dproj_w); dL/dh from the kernel (dL/dy proj_w with the ReLU² derivative,
    relu(h) recovered from a)."""
    g_proj = g_y.T @ a
    g_h = torch.empty_like(a)
    _backward_g_h(g_y, proj_w, a, g_h)
    return g_h @ fc_w, g_h.T @ x, g_proj


@relu2_mlp_backward.register_fake
def _(g_y, x, fc_w, proj_w, a):
    return torch.empty_like(x), torch.empty_like(fc_w), torch.empty_like(proj_w)


def _backward_g_h(g_y: Tensor, proj_w: Tensor, a: Tensor, g_h: Tensor) -> None:
    """g_h from `backward_product`'s math: by the Gluon kernel where `use_gluon` says and it compiles,
    else by this module's kernel."""
    if use_gluon(g_y.device):
        from speedrun.kernels import relu2_gluon
        if relu2_gluon.try_launch(g_y, proj_w, a, g_h):
            return
    backward_product(g_y, proj_w, a, g_h)


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
    def _epilogue(acc, saved_desc, saved_ptr, out_desc, off_m, off_n, M, N, BACKWARD: tl.constexpr,
                  H_PTR: tl.constexpr):
        """acc (float32) -> bfloat16 as a plain product would store it, then the ReLU² part. The backward
        reads the saved a (saved_desc, or with H_PTR saved_ptr: plain loads straight into registers, no
        shared-memory staging)."""
        p = acc.to(tl.bfloat16)
        if BACKWARD:  # dL/dh = dL/da * 2 relu(h)
            if H_PTR:
                rows = off_m + tl.arange(0, acc.shape[0])
                cols = off_n + tl.arange(0, acc.shape[1])
                ok = (rows[:, None] < M) & (cols[None, :] < N)
                a = tl.load(saved_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], mask=ok, other=0.0)
                a = a.to(tl.float32)
            else:
                a = saved_desc.load([off_m, off_n]).to(tl.float32)
            r = tl.sqrt(a).to(tl.bfloat16).to(tl.float32)  # relu(h) = bf16(sqrt(a)), exact (module docstring)
            g = tl.where(r > 0.0, p.to(tl.float32) * (2.0 * r), 0.0)
            out_desc.store([off_m, off_n], g.to(tl.bfloat16))
        else:  # a = relu(h)^2
            r = tl.maximum(p.to(tl.float32), 0.0)
            out_desc.store([off_m, off_n], (r * r).to(tl.bfloat16))

    @triton.jit
    def _halves(x, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr):
        """The left and right column halves of an (BLOCK_M, WIDTH) tile."""
        return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, WIDTH // 2)), (0, 2, 1)))

    @triton.jit
    def _relu2_mm_kernel(a_desc, b_desc, saved_desc, saved_ptr, out_desc, M, N, num_progs,
                         BACKWARD: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_STEPS: tl.constexpr,
                         GROUP_M: tl.constexpr, EPI_SPLIT: tl.constexpr, ITERS: tl.constexpr,
                         FLATTEN: tl.constexpr, WIDEN: tl.constexpr, H_PTR: tl.constexpr):
        """P = A B (A (M, K); B (K, N) in the backward, else (N, K)), tile by tile, with `_epilogue` on
        each; saved_desc/saved_ptr: the saved a the backward reads (the forward's are not read).
        Program p takes tiles p, p + num_progs, ... (ITERS of them); past the last tile it repeats the
        last one (the same bytes stored twice), so the loop has no branch. Loop bounds are constexpr:
        Triton 3.6's interpreter cannot take runtime bounds under numpy >= 2.4. WIDEN (the interpreter
        only): its tl.dot of bfloat16 tiles is wrong, so they are widened to float32 first, which gives
        the same products exactly."""
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(N, BLOCK_N)
        last = num_m * num_n - 1
        for it in tl.range(0, ITERS, flatten=FLATTEN):
            tile = tl.minimum(tl.program_id(0) + it * num_progs, last)
            pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ks in range(K_STEPS):
                a = a_desc.load([off_m, ks * BLOCK_K])
                if BACKWARD:
                    b = b_desc.load([ks * BLOCK_K, off_n])
                else:
                    b = b_desc.load([off_n, ks * BLOCK_K]).T
                if WIDEN:
                    a, b = a.to(tl.float32), b.to(tl.float32)
                acc = tl.dot(a, b, acc)
            # the epilogue in EPI_SPLIT column slices: less shared memory for the stores
            if EPI_SPLIT == 1:
                _epilogue(acc, saved_desc, saved_ptr, out_desc, off_m, off_n, M, N, BACKWARD, H_PTR)
            else:
                left, right = _halves(acc, BLOCK_M, BLOCK_N)
                if EPI_SPLIT == 2:
                    _epilogue(left, saved_desc, saved_ptr, out_desc, off_m, off_n, M, N, BACKWARD, H_PTR)
                    _epilogue(right, saved_desc, saved_ptr, out_desc, off_m, off_n + BLOCK_N // 2, M, N,
                              BACKWARD, H_PTR)
                else:
                    q0, q1 = _halves(left, BLOCK_M, BLOCK_N // 2)
                    q2, q3 = _halves(right, BLOCK_M, BLOCK_N // 2)
                    _epilogue(q0, saved_desc, saved_ptr, out_desc, off_m, off_n, M, N, BACKWARD, H_PTR)
                    _epilogue(q1, saved_desc, saved_ptr, out_desc, off_m, off_n + BLOCK_N // 4, M, N,
                              BACKWARD, H_PTR)
                    _epilogue(q2, saved_desc, saved_ptr, out_desc, off_m, off_n + BLOCK_N // 2, M, N,
                              BACKWARD, H_PTR)
                    _epilogue(q3, saved_desc, saved_ptr, out_desc, off_m, off_n + 3 * (BLOCK_N // 4), M, N,
                              BACKWARD, H_PTR)

    return _relu2_mm_kernel


def _programs(device: torch.device, tiles: int, persistent: bool) -> int:
    if not persistent:
        return tiles
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return min(tiles, sms)


def use_gluon(device: torch.device) -> bool:
    """The backward's product on the Gluon kernel: a capability-9.0 GPU (its wgmma is Hopper's alone) with
    Gluon's Hopper support importable; otherwise this module's kernel runs."""
    if device.type != "cuda":
        return False
    from speedrun.kernels import relu2_gluon
    return _capability(device.index if device.index is not None else -1) == (9, 0) and relu2_gluon.available()


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index if index >= 0 else None)


def forward_product(x: Tensor, fc_w: Tensor, a: Tensor, cfg: dict[str, int] | None = None) -> None:
    """a = bf16(relu(bf16(x fc_wᵀ))²) by this module's kernel; x (N, D), fc_w (F, D), a (N, F), all
    bfloat16 and contiguous. cfg: a launch (default KERNEL_CONFIG["fwd"])."""
    _launch(x, fc_w, a, a, False, cfg or KERNEL_CONFIG["fwd"])


def backward_product(g_y: Tensor, proj_w: Tensor, a: Tensor, g_h: Tensor, cfg: dict[str, int] | None = None) -> None:
    """g_h = bf16(p · 2 relu(h)) where relu(h) = bf16(sqrt(a)) > 0, else 0, p = bf16(g_y proj_w), by this
    module's kernel; g_y (N, D), proj_w (D, F), the saved a and g_h (N, F), all bfloat16 and contiguous.
    cfg: a launch (default KERNEL_CONFIG["bwd"])."""
    _launch(g_y, proj_w, a, g_h, True, cfg or KERNEL_CONFIG["bwd"])


def _launch(a: Tensor, b: Tensor, saved: Tensor, out: Tensor, backward: bool, cfg: dict[str, int]) -> None:
    """out from P = a @ (b if backward else b.T) with the direction's epilogue; saved: the backward's a
    (the forward passes out, never read)."""
    kernel = _build_kernel()
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = a.shape
    N = b.shape[1] if backward else b.shape[0]
    if not M:
        return
    BM, BN, BK, split = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["EPI_SPLIT"]
    store = [BM, BN // split]
    a_desc = TensorDescriptor.from_tensor(a, [BM, BK])
    b_desc = TensorDescriptor.from_tensor(b, [BK, BN] if backward else [BN, BK])
    out_desc = TensorDescriptor.from_tensor(out, store)
    saved_desc = TensorDescriptor.from_tensor(saved, store)
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    progs = _programs(a.device, tiles, bool(cfg["PERSISTENT"]))
    kernel[(progs,)](a_desc, b_desc, saved_desc, saved, out_desc, M, N, progs, BACKWARD=backward,
                     BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, K_STEPS=triton.cdiv(K, BK), GROUP_M=cfg["GROUP_M"],
                     EPI_SPLIT=split, ITERS=triton.cdiv(tiles, progs),
                     FLATTEN=bool(cfg["PERSISTENT"]), WIDEN=a.device.type != "cuda", H_PTR=bool(cfg["H_PTR"]),
                     num_stages=cfg["num_stages"], num_warps=cfg["num_warps"])
