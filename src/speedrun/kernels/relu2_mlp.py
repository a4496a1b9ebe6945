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

The 2026 record's FP8 MLP uses the forward kernel in an FP8 mode (`relu2_fp8_up`): e4m3 operands,
the product scaled as `_scaled_mm` scales it, post = relu(pre)² stored in bf16 for the backward,
post's e4m3 quantisation for the down-product (the delayed scale s_act, saturating at 448) stored
beside it, and each program's largest post written for the next s_act. Through `_scaled_mm` and
Inductor the same took a product writing pre, a pass reading pre and writing post and its e4m3 copy,
and a reduction reading post again (about 246 + 179 + 100 us a layer and micro-step at the record's
stage 2 on an H200, 2026-12-06 profile). Under the interpreter the roundings to bfloat16 and e4m3
are done by hand first (`bf16_rounding`, `_round_e4m3`), so the CPU test gets the GPU's codes.

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

from speedrun.kernels import bf16_rounding
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
    # the FP8 up-product: e4m3 operands, so K tiles of 128 bytes as the bf16 kernels' 64 elements are;
    # three stages (48 KB each) leave room for the bf16 and e4m3 stores' staging
    "fp8": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "EPI_SPLIT": 2, "PERSISTENT": 1,
            "H_PTR": 0, "num_stages": 3, "num_warps": 8},
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


@torch.library.custom_op("speedrun::relu2_fp8_up", mutates_args=())
def relu2_fp8_up(a_f8: Tensor, w1_f8: Tensor, scale: Tensor, s_act: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(post, post_f8, maxima) of `fp8_up_product` for a_f8 (N, D) and w1_f8 (F, D) e4m3: the FP8 MLP's
    forward up to its down-product; max(maxima) is post's largest element."""
    n, f = a_f8.shape[0], w1_f8.shape[0]
    post = a_f8.new_empty((n, f), dtype=torch.bfloat16)
    post_f8 = a_f8.new_empty((n, f), dtype=torch.float8_e4m3fn)
    maxima = a_f8.new_empty((programs(a_f8.device, n, f),), dtype=torch.float32)  # every program writes its own
    fp8_up_product(a_f8.contiguous(), w1_f8.contiguous(), scale.float(), s_act.float(), post, post_f8, maxima)
    return post, post_f8, maxima


@relu2_fp8_up.register_fake
def _(a_f8, w1_f8, scale, s_act):
    n, f = a_f8.shape[0], w1_f8.shape[0]
    return (a_f8.new_empty((n, f), dtype=torch.bfloat16), a_f8.new_empty((n, f), dtype=torch.float8_e4m3fn),
            a_f8.new_empty((programs(a_f8.device, n, f),), dtype=torch.float32))


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
_tile_coords = _epilogue = _fp8_epilogue = _halves = _relu2_mm_kernel = _rne_bf16 = _round_e4m3 = None


@built_once
def _build_kernel(interpreted: bool):
    """Define the kernel (once, `built_once`); interpreted: TRITON_INTERPRET=1 now."""
    global _tile_coords, _epilogue, _fp8_epilogue, _halves, _relu2_mm_kernel  # module globals: the
    global _rne_bf16, _round_e4m3  # interpreter re-executes the source with them

    if interpreted:  # the interpreter truncates to bfloat16 and misses e4m3's carry into the exponent
        _rne_bf16 = bf16_rounding.build()

        @triton.jit
        def _round_e4m3(x):
            """x in [0, 448] rounded to e4m3's grid in float32 (to nearest, ties to even): the 20 dropped
            mantissa bits by integer carry, subnormals (below 2^-6) on their 2^-9 grid by one addition."""
            b = x.to(tl.int32, bitcast=True)
            b = (b + 0x7FFFF + ((b >> 20) & 1)) & -1048576
            return tl.where(x < 0.015625, (x + 24576.0) - 24576.0, b.to(tl.float32, bitcast=True))
    else:  # the GPU's conversions round to nearest even themselves
        @triton.jit
        def _rne_bf16(x):
            return x

        @triton.jit
        def _round_e4m3(x):
            return x

    @triton.jit
    def _tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
        """Output tile -> (row block, column block), GROUP_M row blocks at a time for L2 reuse."""
        per_group = GROUP_M * num_n
        first_m = (tile // per_group) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        return first_m + (tile % per_group) % size_m, (tile % per_group) // size_m

    @triton.jit
    def _fp8_epilogue(acc, scale, s_act, post_desc, q_desc, off_m, off_n):
        """The FP8 up-product's: pre = bf16(acc·scale) as `_scaled_mm` writes it, post = bf16(relu(pre)²)
        stored, post_f8 = e4m3(min(post / s_act, 448)) stored (the division correctly rounded, as the
        reference's), and the tile's largest post returned (rows past M are TMA's zeros: post 0)."""
        pre = _rne_bf16(acc * scale).to(tl.bfloat16).to(tl.float32)
        r = tl.maximum(pre, 0.0)
        post = _rne_bf16(r * r).to(tl.bfloat16)
        post_desc.store([off_m, off_n], post)
        q = tl.minimum(tl.math.div_rn(post.to(tl.float32), s_act), 448.0)
        q_desc.store([off_m, off_n], _round_e4m3(q).to(tl.float8e4nv))
        return tl.max(tl.max(post.to(tl.float32), 1), 0)

    @triton.jit
    def _epilogue(acc, saved_desc, saved_ptr, out_desc, off_m, off_n, M, N, BACKWARD: tl.constexpr,
                  H_PTR: tl.constexpr, FP8: tl.constexpr, scale, s_act, q_desc):
        """acc (float32) -> bfloat16 as a plain product would store it, then the ReLU² part; returns the
        tile's largest output (FP8: `_fp8_epilogue`), else 0. The backward reads the saved a (saved_desc,
        or with H_PTR saved_ptr: plain loads straight into registers, no shared-memory staging)."""
        if FP8:
            return _fp8_epilogue(acc, scale, s_act, out_desc, q_desc, off_m, off_n)
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
        return 0.0

    @triton.jit
    def _halves(x, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr):
        """The left and right column halves of an (BLOCK_M, WIDTH) tile."""
        return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, WIDTH // 2)), (0, 2, 1)))

    @triton.jit
    def _relu2_mm_kernel(a_desc, b_desc, saved_desc, saved_ptr, out_desc, M, N, num_progs,
                         scale_ptr, s_act_ptr, q_desc, max_ptr,
                         BACKWARD: tl.constexpr, FP8: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_STEPS: tl.constexpr,
                         GROUP_M: tl.constexpr, EPI_SPLIT: tl.constexpr, ITERS: tl.constexpr,
                         FLATTEN: tl.constexpr, WIDEN: tl.constexpr, H_PTR: tl.constexpr):
        """P = A B (A (M, K); B (K, N) in the backward, else (N, K)), tile by tile, with `_epilogue` on
        each; saved_desc/saved_ptr: the saved a the backward reads (the forward's are not read). FP8:
        e4m3 operands, the epilogue's scale and s_act read from scale_ptr and s_act_ptr, post_f8 stored
        through q_desc, and each program's largest post written to max_ptr[program].
        Program p takes tiles p, p + num_progs, ... (ITERS of them); past the last tile it repeats the
        last one (the same bytes stored twice), so the loop has no branch. Loop bounds are constexpr:
        Triton 3.6's interpreter cannot take runtime bounds under numpy >= 2.4. WIDEN (the interpreter
        only): its tl.dot of bfloat16 tiles is wrong, so they are widened to float32 first, which gives
        the same products exactly (FP8 products too)."""
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(N, BLOCK_N)
        last = num_m * num_n - 1
        scale = 1.0
        s_act = 1.0
        if FP8:
            scale = tl.load(scale_ptr)
            s_act = tl.load(s_act_ptr)
        top = 0.0
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
                top = tl.maximum(top, _epilogue(acc, saved_desc, saved_ptr, out_desc, off_m, off_n, M, N,
                                                BACKWARD, H_PTR, FP8, scale, s_act, q_desc))
            else:
                left, right = _halves(acc, BLOCK_M, BLOCK_N)
                if EPI_SPLIT == 2:
                    top = tl.maximum(top, _epilogue(left, saved_desc, saved_ptr, out_desc, off_m, off_n, M, N,
                                                    BACKWARD, H_PTR, FP8, scale, s_act, q_desc))
                    top = tl.maximum(top, _epilogue(right, saved_desc, saved_ptr, out_desc, off_m,
                                                    off_n + BLOCK_N // 2, M, N, BACKWARD, H_PTR, FP8, scale,
                                                    s_act, q_desc))
                else:
                    q0, q1 = _halves(left, BLOCK_M, BLOCK_N // 2)
                    q2, q3 = _halves(right, BLOCK_M, BLOCK_N // 2)
                    quarter = BLOCK_N // 4
                    top = tl.maximum(top, _epilogue(q0, saved_desc, saved_ptr, out_desc, off_m, off_n, M, N,
                                                    BACKWARD, H_PTR, FP8, scale, s_act, q_desc))
                    top = tl.maximum(top, _epilogue(q1, saved_desc, saved_ptr, out_desc, off_m, off_n + quarter,
                                                    M, N, BACKWARD, H_PTR, FP8, scale, s_act, q_desc))
                    top = tl.maximum(top, _epilogue(q2, saved_desc, saved_ptr, out_desc, off_m,
                                                    off_n + 2 * quarter, M, N, BACKWARD, H_PTR, FP8, scale,
                                                    s_act, q_desc))
                    top = tl.maximum(top, _epilogue(q3, saved_desc, saved_ptr, out_desc, off_m,
                                                    off_n + 3 * quarter, M, N, BACKWARD, H_PTR, FP8, scale,
                                                    s_act, q_desc))
        if FP8:
            tl.store(max_ptr + tl.program_id(0), top)

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


def fp8_up_product(a_f8: Tensor, w1_f8: Tensor, scale: Tensor, s_act: Tensor, post: Tensor, post_f8: Tensor,
                   maxima: Tensor, cfg: dict[str, int] | None = None) -> None:
    """The FP8 MLP's up-product with its quantisation in the epilogue: post = bf16(relu(bf16((a_f8 ·
    w1_f8ᵀ)·scale))²), post_f8 = e4m3(min(post / s_act, 448)) and maxima[p] = the largest post of program
    p's tiles; a_f8 (N, D) and w1_f8 (F, D) e4m3, scale and s_act 0-d float32, post (N, F) bf16, post_f8
    (N, F) e4m3, maxima (`programs(...)`,) float32, all contiguous. cfg: a launch (default
    KERNEL_CONFIG["fp8"])."""
    _launch(a_f8, w1_f8, post, post, False, cfg or KERNEL_CONFIG["fp8"], (scale, s_act, post_f8, maxima))


def programs(device: torch.device, rows: int, cols: int, cfg: dict[str, int] | None = None) -> int:
    """How many programs the FP8 up-product launches for an (rows, cols) output: the length of its maxima."""
    cfg = cfg or KERNEL_CONFIG["fp8"]
    tiles = -(-rows // cfg["BLOCK_M"]) * -(-cols // cfg["BLOCK_N"])
    return _programs(device, tiles, bool(cfg["PERSISTENT"]))


def _launch(a: Tensor, b: Tensor, saved: Tensor, out: Tensor, backward: bool, cfg: dict[str, int],
            fp8: tuple[Tensor, Tensor, Tensor, Tensor] | None = None) -> None:
    """out from P = a @ (b if backward else b.T) with the direction's epilogue; saved: the backward's a
    (the forward passes out, never read); fp8: the FP8 epilogue's (scale, s_act, post_f8, maxima)."""
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
    scale, s_act, q, maxima = fp8 if fp8 is not None else (out, out, out, out)  # unread without FP8
    q_desc = TensorDescriptor.from_tensor(q, store) if fp8 is not None else out_desc
    kernel[(progs,)](a_desc, b_desc, saved_desc, saved, out_desc, M, N, progs, scale, s_act, q_desc, maxima,
                     BACKWARD=backward, FP8=fp8 is not None,
                     BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, K_STEPS=triton.cdiv(K, BK), GROUP_M=cfg["GROUP_M"],
                     EPI_SPLIT=split, ITERS=triton.cdiv(tiles, progs),
                     FLATTEN=bool(cfg["PERSISTENT"]), WIDEN=a.device.type != "cuda", H_PTR=bool(cfg["H_PTR"]),
                     num_stages=cfg["num_stages"], num_warps=cfg["num_warps"])


def compile_offline(direction: str = "fp8", rows: int = 49152, cols: int = 3072, depth: int = 768, sms: int = 132):
    """Compile the kernel for sm_90 as `KERNEL_CONFIG[direction]` launches it at these shapes (the record's
    micro-step by default, on an H100's or H200's 132 SMs) without a GPU (Triton's bundled ptxas); the
    CompiledKernel (`relu2_gluon.resource_usage` reads its registers and spills)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel, cfg = _build_kernel(), KERNEL_CONFIG[direction]
    bm, bn, bk, split = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["EPI_SPLIT"]
    fp8, backward = direction == "fp8", direction == "bwd"
    op, store = "fp8e4nv" if fp8 else "bf16", f"[{bm}, {bn // split}]"
    tiles = -(-rows // bm) * -(-cols // bn)
    consts = dict(BACKWARD=backward, FP8=fp8, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, K_STEPS=-(-depth // bk),
                  GROUP_M=cfg["GROUP_M"], EPI_SPLIT=split, ITERS=-(-tiles // min(tiles, sms)),
                  FLATTEN=bool(cfg["PERSISTENT"]), WIDEN=False, H_PTR=bool(cfg["H_PTR"]))
    types = {"a_desc": f"tensordesc<{op}[{bm}, {bk}]>",
             "b_desc": f"tensordesc<{op}[{bk}, {bn}]>" if backward else f"tensordesc<{op}[{bn}, {bk}]>",
             "saved_desc": f"tensordesc<bf16{store}>", "out_desc": f"tensordesc<bf16{store}>",
             "q_desc": f"tensordesc<{'fp8e4nv' if fp8 else 'bf16'}{store}>", "saved_ptr": "*bf16",
             "scale_ptr": "*fp32", "s_act_ptr": "*fp32", "max_ptr": "*fp32", "M": "i32", "N": "i32", "num_progs": "i32"}
    signature = {a: "constexpr" if a in consts else types[a] for a in kernel.arg_names}
    return triton.compile(ASTSource(kernel, signature, consts, {}), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
