"""QK RMS-norm + rotary of the attention layer, with a fused Triton kernel.

`Attention.project` normalises q and k (parameter-free RMS norm over the head
dimension) and then rotates them:

    n = rms_norm(x)                                  # float32 math, rounded to x's dtype
    y1 = n1*cos + n2*sin,  y2 = -n1*sin + n2*cos     # float32 math, n = (n1, n2) halves of D
    y = cat(y1, y2) rounded to x's dtype

with (cos, sin) the (T, D/2) float32 angles of `Rotary`. Why this module:
Inductor fuses the pattern, but its kernels cost about 3x their memory-bound
time on an H200 (at T = 49152, H = 6, D = 128, bfloat16, q and k together:
~195 us forward and ~208 us backward per layer against ~70 us and ~110 us of
memory traffic; see `Rotary`'s docstring and docs/benchmarks.md). The kernels
here read each q/k row once, reduce it in registers and write it once.

Two implementations of `qk_norm_rotary`:

* ``torch``: `reference`, the exact operations `Attention.project` runs
  (`F.rms_norm`, then `Rotary.rotate`'s float32 math): bit-identical to them,
  forward and backward.
* ``triton``: `torch.ops.speedrun.qk_norm_rotary`, one launch for q and k.
  Each program takes BLOCK_T tokens x all heads of both tensors (3-D tiles
  [BLOCK_T, heads (padded to a power of two), D/2], the two halves of D loaded
  separately, cos/sin loaded once per token and broadcast over heads and over
  q and k). It computes in float32 and, like the eager code, rounds the
  normalised value to the input dtype before rotating. The backward
  (`torch.ops.speedrun.qk_norm_rotary_backward`, also one launch) un-rotates
  the upstream gradient and applies the RMS-norm backward
  dx = r*dn - x*r^3*mean(dn*x), r = rsqrt(mean(x^2) + eps), recomputing r from
  the saved inputs and treating the intermediate rounding of n as the identity
  (as autograd of the eager code does). Both are `torch.library.custom_op`s
  with fakes, so `torch.compile(fullgraph=True)` keeps them whole.

eps: `F.rms_norm(x, shape)` with eps=None uses the epsilon of its *computation*
dtype, float32 for bfloat16/float16/float32 inputs (torch.finfo(torch.float32)
.eps = 1.19e-7; not bfloat16's 2^-7), see `rms_eps`.

Under Triton's interpreter (3.x) a float32 -> bfloat16 conversion truncates
instead of rounding to nearest even; there the kernels round in integer
arithmetic instead (`_emulate_rne`), so the CPU tests see the GPU's rounding.

`impl` chooses between them as `kernel_choice` says ("auto": the kernels for
CUDA tensors when Triton is installed); the kernels are built on first use.
`reference_float64` is the same math in float64 without the intermediate
rounding: what the kernel's backward differentiates, for the tests and the
GPU benchmark to measure both paths' gradients against.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor

from speedrun.kernel_choice import IMPLS, TRITON_FOUND, pick_impl  # noqa: F401 (this module's interface)

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Kernel launch parameters, read at each launch (also under torch.compile: the ops are opaque).
# BLOCK_T: tokens per program (a power of two; each program does all heads of q and k for them);
# *_BWD: the backward's. Not yet tuned on a GPU (scripts/device/qk_rotary_bench.py sweeps them);
# compiled offline for sm_90 at H=6, D=128, bf16: 80 registers for both defaults, no spills
# (BLOCK_T_BWD=8 with 4 warps takes 167).
KERNEL_CONFIG = {"BLOCK_T": 8, "num_warps": 4, "BLOCK_T_BWD": 4, "num_warps_bwd": 4}


# --------------------------------------------------------------------------- reference


def rms_eps(dtype: torch.dtype) -> float:
    """The eps `F.rms_norm(x, shape)` (eps=None) uses for x of this dtype: that of its computation dtype."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """`Rotary.rotate(x, (cos, sin))`: the same float32 operations in the same order."""
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    x1, x2 = x.to(torch.float32).chunk(2, dim=-1)
    y1 = x1 * cos + x2 * sin
    y2 = x1 * (-sin) + x2 * cos
    return torch.cat((y1, y2), dim=-1).type_as(x)


def reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """What `Attention.project` computes: rms_norm(q), rms_norm(k), then the rotation of both."""
    q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
    return rotate(q, cos, sin), rotate(k, cos, sin)


def reference_float64(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> list[Tensor]:
    """The op's math in float64 with no intermediate rounding (float32's eps, as `rms_eps`)."""
    c, s = cos.double()[None, :, None, :], sin.double()[None, :, None, :]
    outs = []
    for x in (q, k):
        x = x.double()
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + rms_eps(torch.float32))
        n1, n2 = n.chunk(2, -1)
        outs.append(torch.cat((n1 * c + n2 * s, -n1 * s + n2 * c), -1))
    return outs


# --------------------------------------------------------------------------- dispatch


def qk_norm_rotary(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, impl: str = "auto") -> tuple[Tensor, Tensor]:
    """(rotate(rms_norm(q)), rotate(rms_norm(k))), differentiable with respect to q and k.

    q, k: (B, T, H, D), any strides with the last dimension contiguous (the
    model's views into its (B, T, 3H, D) projection); cos, sin: (T, D/2)
    float32. Returns q and k outputs (B, T, H, D) in the input dtype
    (contiguous on the Triton path). impl: "torch" (the reference), "triton"
    (the fused kernels; CUDA, or a CPU under TRITON_INTERPRET=1), "auto".
    """
    if pick_impl(q, impl) == "torch":
        return reference(q, k, cos, sin)
    if not TRITON_FOUND:
        raise RuntimeError("qk_norm_rotary impl='triton' needs Triton installed")
    return torch.ops.speedrun.qk_norm_rotary(q, k, cos, sin)


# --------------------------------------------------------------------------- Triton kernels

triton = None  # set by _build_kernel on first use
tl = None
_KERNELS = None
_INTERPRETED = False  # set by _build_kernel: TRITON_INTERPRET=1 when the kernels were defined
_load_rows = _rne_bf16 = _cast = _fwd_rows = _bwd_rows = _tile = _at = _qk_fwd_kernel = _qk_bwd_kernel = None


def _build_kernel():
    """Import Triton and define the kernels (once). Reads TRITON_INTERPRET at this moment."""
    global triton, tl, _KERNELS, _INTERPRETED  # the defs below bind module globals:
    global _load_rows, _rne_bf16, _cast, _fwd_rows, _bwd_rows, _tile, _at, _qk_fwd_kernel, _qk_bwd_kernel
    if _KERNELS is not None:
        return _KERNELS
    import triton as _triton
    import triton.language as _tl

    triton, tl = _triton, _tl
    _INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
    # The kernels are defined here, not at import, and bound as module globals:
    # the interpreter re-executes their source with the module's globals only.

    @triton.jit
    def _load_rows(ptrs, mask, D2: tl.constexpr):
        """The two halves [BLOCK_T, HP, D/2] of the rows at ptrs (first-half addresses), as float32."""
        x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptrs + D2, mask=mask, other=0.0).to(tl.float32)
        return x1, x2

    @triton.jit
    def _rne_bf16(x):
        """float32 x rounded to bfloat16's precision (to nearest, ties to even), still float32."""
        u = x.to(tl.uint32, bitcast=True)
        u = u + (((u >> 16) & 1) + 0x7FFF)
        return ((u >> 16) << 16).to(tl.float32, bitcast=True)

    @triton.jit
    def _cast(x, P, EMULATE_RNE: tl.constexpr):
        """float32 x converted to the element type of pointer P, rounded to nearest even."""
        if EMULATE_RNE:
            return _rne_bf16(x).to(P.dtype.element_ty)  # exact: truncating a bfloat16 value
        else:
            return x.to(P.dtype.element_ty)

    @triton.jit
    def _fwd_rows(x_ptrs, y_ptrs, mask, c, s, eps, D2: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """Normalise + rotate one tensor's [BLOCK_T, HP] rows; c, s: [BLOCK_T, 1, D/2]."""
        x1, x2 = _load_rows(x_ptrs, mask, D2)
        ms = (tl.sum(x1 * x1, axis=2) + tl.sum(x2 * x2, axis=2)) / (2 * D2)
        r = tl.rsqrt(ms + eps)[:, :, None]
        # the eager code rounds rms_norm's output to the input dtype, then rotates in float32
        n1 = _cast(x1 * r, y_ptrs, EMULATE_RNE).to(tl.float32)
        n2 = _cast(x2 * r, y_ptrs, EMULATE_RNE).to(tl.float32)
        y1 = n1 * c + n2 * s
        y2 = n2 * c - n1 * s
        tl.store(y_ptrs, _cast(y1, y_ptrs, EMULATE_RNE), mask=mask)
        tl.store(y_ptrs + D2, _cast(y2, y_ptrs, EMULATE_RNE), mask=mask)

    @triton.jit
    def _bwd_rows(x_ptrs, g_ptrs, dx_ptrs, mask, c, s, eps, D2: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """Gradient of one tensor's [BLOCK_T, HP] rows: un-rotate dy, then the RMS-norm backward."""
        x1, x2 = _load_rows(x_ptrs, mask, D2)
        g1, g2 = _load_rows(g_ptrs, mask, D2)
        ms = (tl.sum(x1 * x1, axis=2) + tl.sum(x2 * x2, axis=2)) / (2 * D2)
        r = tl.rsqrt(ms + eps)[:, :, None]
        n1 = x1 * r
        n2 = x2 * r
        dn1 = g1 * c - g2 * s
        dn2 = g1 * s + g2 * c
        m = ((tl.sum(dn1 * n1, axis=2) + tl.sum(dn2 * n2, axis=2)) / (2 * D2))[:, :, None]
        # dx = r*dn - x*r^3*mean(dn*x) = r*(dn - n*mean(dn*n))
        tl.store(dx_ptrs, _cast(r * (dn1 - n1 * m), dx_ptrs, EMULATE_RNE), mask=mask)
        tl.store(dx_ptrs + D2, _cast(r * (dn2 - n2 * m), dx_ptrs, EMULATE_RNE), mask=mask)

    @triton.jit
    def _tile(T, H, COS, SIN, BLOCK_T: tl.constexpr, HP: tl.constexpr, D2: tl.constexpr):
        """This program's batch row b, first token t0, the index ranges, the mask and cos/sin [BLOCK_T, 1, D/2]."""
        t0 = tl.program_id(0) * BLOCK_T
        b = tl.program_id(1)
        lt = tl.arange(0, BLOCK_T)
        heads = tl.arange(0, HP)
        cols = tl.arange(0, D2)
        t_ok = (t0 + lt) < T
        mask = (t_ok[:, None] & (heads < H)[None, :])[:, :, None]  # [BLOCK_T, HP, 1]: whole rows, so loads stay vectorised
        tab = (t0 + lt)[:, None] * D2 + cols[None, :]  # int32: T * D/2 < 2^31
        c = tl.load(COS + tab, mask=t_ok[:, None], other=0.0)[:, None, :]
        s = tl.load(SIN + tab, mask=t_ok[:, None], other=0.0)[:, None, :]
        return t0, b, lt, heads, cols, mask, c, s

    @triton.jit
    def _at(P, b, t0, sb, st, sh, lt, heads, cols):
        """Pointers [BLOCK_T, HP, D/2] to P[b, t0 + lt, h, d]: an int64 base, int32 offsets inside the block."""
        base = P + (b.to(tl.int64) * sb + t0.to(tl.int64) * st)
        return base + ((lt * st)[:, None, None] + (heads * sh)[None, :, None] + cols[None, None, :])

    @triton.jit
    def _qk_fwd_kernel(
        Q, K, COS, SIN, YQ, YK, T, H, eps,
        sqb, sqt, sqh, skb, skt, skh, syb, syt, syh,
        BLOCK_T: tl.constexpr, HP: tl.constexpr, D2: tl.constexpr, EMULATE_RNE: tl.constexpr,
    ):
        """grid (cdiv(T, BLOCK_T), B): BLOCK_T tokens x all heads of q and of k; YQ, YK share strides."""
        t0, b, lt, heads, cols, mask, c, s = _tile(T, H, COS, SIN, BLOCK_T, HP, D2)
        _fwd_rows(_at(Q, b, t0, sqb, sqt, sqh, lt, heads, cols), _at(YQ, b, t0, syb, syt, syh, lt, heads, cols),
                  mask, c, s, eps, D2, EMULATE_RNE)
        _fwd_rows(_at(K, b, t0, skb, skt, skh, lt, heads, cols), _at(YK, b, t0, syb, syt, syh, lt, heads, cols),
                  mask, c, s, eps, D2, EMULATE_RNE)

    @triton.jit
    def _qk_bwd_kernel(
        Q, K, GQ, GK, COS, SIN, DQ, DK, T, H, eps,
        sqb, sqt, sqh, skb, skt, skh, sgqb, sgqt, sgqh, sgkb, sgkt, sgkh, sdb, sdt, sdh,
        BLOCK_T: tl.constexpr, HP: tl.constexpr, D2: tl.constexpr, EMULATE_RNE: tl.constexpr,
    ):
        """grid (cdiv(T, BLOCK_T), B), as the forward; DQ, DK share strides."""
        t0, b, lt, heads, cols, mask, c, s = _tile(T, H, COS, SIN, BLOCK_T, HP, D2)
        _bwd_rows(_at(Q, b, t0, sqb, sqt, sqh, lt, heads, cols), _at(GQ, b, t0, sgqb, sgqt, sgqh, lt, heads, cols),
                  _at(DQ, b, t0, sdb, sdt, sdh, lt, heads, cols), mask, c, s, eps, D2, EMULATE_RNE)
        _bwd_rows(_at(K, b, t0, skb, skt, skh, lt, heads, cols), _at(GK, b, t0, sgkb, sgkt, sgkh, lt, heads, cols),
                  _at(DK, b, t0, sdb, sdt, sdh, lt, heads, cols), mask, c, s, eps, D2, EMULATE_RNE)

    _KERNELS = (_qk_fwd_kernel, _qk_bwd_kernel)
    return _KERNELS


def _check(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> None:
    if q.dim() != 4 or q.shape != k.shape or q.dtype != k.dtype or q.device != k.device:
        raise ValueError(f"qk_norm_rotary: q, k must be (B, T, H, D) of one dtype/device, got {tuple(q.shape)}, {tuple(k.shape)}")
    if q.dtype not in KERNEL_DTYPES:
        raise ValueError(f"qk_norm_rotary: the kernel takes {KERNEL_DTYPES}, got {q.dtype}")
    _, T, _, D = q.shape
    if D % 2 or (D // 2) & (D // 2 - 1):
        raise ValueError(f"qk_norm_rotary: the kernel needs D/2 a power of two, got D = {D}")
    if tuple(cos.shape) != (T, D // 2) or tuple(sin.shape) != (T, D // 2):
        raise ValueError(f"qk_norm_rotary: cos, sin must be (T, D/2) = {(T, D // 2)}, got {tuple(cos.shape)}, {tuple(sin.shape)}")


def _emulate_rne(dtype: torch.dtype) -> bool:
    """Round to bfloat16 in integer arithmetic? Only under the interpreter, whose float32 -> bfloat16
    conversion truncates (Triton 3.x); on a GPU the conversion is one round-to-nearest-even instruction."""
    return _INTERPRETED and dtype == torch.bfloat16


def _rowwise(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _table(x: Tensor) -> Tensor:
    return x.to(torch.float32).contiguous()


def _grid(q: Tensor, block_t: int) -> tuple[int, int]:
    return triton.cdiv(q.shape[1], block_t), q.shape[0]


def _strides(*ts: Tensor) -> list[int]:
    """(batch, token, head) strides of each (B, T, H, D) tensor, in order."""
    return [st for t in ts for st in t.stride()[:3]]


def _output(x: Tensor) -> Tensor:
    """A contiguous (B, T, H, D) tensor like x (x itself may be a strided view)."""
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _launch(kernel, q: Tensor, pointers: tuple, strided: tuple, block: str, warps: str) -> None:
    """Run a kernel over q's (B, T, H, D) shape: `pointers` are its tensor arguments in order, `strided`
    the tensors whose (batch, token, head) strides follow T, H and eps; `block`/`warps` name the
    KERNEL_CONFIG entries for the launch."""
    if not q.numel():
        return
    cfg = KERNEL_CONFIG
    B, T, H, D = q.shape
    kernel[_grid(q, cfg[block])](
        *pointers, T, H, rms_eps(q.dtype), *_strides(*strided),
        BLOCK_T=cfg[block], HP=triton.next_power_of_2(H), D2=D // 2, EMULATE_RNE=_emulate_rne(q.dtype),
        num_warps=cfg[warps],
    )


def launch_forward(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    fwd, _ = _build_kernel()
    _check(q, k, cos, sin)
    q, k, cos, sin = _rowwise(q), _rowwise(k), _table(cos), _table(sin)
    yq, yk = _output(q), _output(k)
    _launch(fwd, q, (q, k, cos, sin, yq, yk), (q, k, yq), "BLOCK_T", "num_warps")
    return yq, yk


def launch_backward(gq: Tensor, gk: Tensor, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    _, bwd = _build_kernel()
    _check(q, k, cos, sin)
    q, k, gq, gk, cos, sin = _rowwise(q), _rowwise(k), _rowwise(gq), _rowwise(gk), _table(cos), _table(sin)
    dq, dk = _output(q), _output(k)
    _launch(bwd, q, (q, k, gq, gk, cos, sin, dq, dk), (q, k, gq, gk, dq), "BLOCK_T_BWD", "num_warps_bwd")
    return dq, dk


@torch.library.custom_op("speedrun::qk_norm_rotary", mutates_args=())
def qk_norm_rotary_op(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """(rotate(rms_norm(q)), rotate(rms_norm(k))), contiguous (B, T, H, D) in q's dtype."""
    return launch_forward(q, k, cos, sin)


@qk_norm_rotary_op.register_fake
def _(q, k, cos, sin):
    return q.new_empty(q.shape), k.new_empty(k.shape)  # contiguous, input dtype, as the op


@torch.library.custom_op("speedrun::qk_norm_rotary_backward", mutates_args=())
def qk_norm_rotary_backward(gq: Tensor, gk: Tensor, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """(d/dq, d/dk) given the upstream gradients gq, gk of the two outputs; contiguous, q's dtype."""
    return launch_backward(gq, gk, q, k, cos, sin)


@qk_norm_rotary_backward.register_fake
def _(gq, gk, q, k, cos, sin):
    return q.new_empty(q.shape), k.new_empty(k.shape)


def _setup_context(ctx, inputs, output):
    q, k, cos, sin = inputs
    ctx.save_for_backward(q, k, cos, sin)


def _backward(ctx, gq, gk):
    q, k, cos, sin = ctx.saved_tensors
    gq = torch.zeros_like(q) if gq is None else gq
    gk = torch.zeros_like(k) if gk is None else gk
    dq, dk = torch.ops.speedrun.qk_norm_rotary_backward(gq, gk, q, k, cos, sin)
    return dq, dk, None, None


qk_norm_rotary_op.register_autograd(_backward, setup_context=_setup_context)
