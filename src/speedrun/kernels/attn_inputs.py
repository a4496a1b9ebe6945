"""The attention's inputs from its projection: QK RMS-norm + rotary, and the value mixing.

`Attention.project` turns the (tokens x 3·H·D) projection into q, k, v:

    q, k:  n = rms_norm(x)  (float32 math, eps = float32's),  then rotated:
           y1 = n1*cos + n2*sin,  y2 = -n1*sin + n2*cos   (n = (n1, n2), the halves of D)
    v:     λ0*v + λ1*ve   (ve: the layer's value embedding), or λ0*v in a layer without one

Why a kernel: compiled, Inductor fuses each part separately. At the record's
size (49,152 tokens, H = 6, D = 128) on an H200 its q/k kernels take 171 µs
forward and 209 µs backward per layer call:
- the forward reads every row three times (two reductions, then masked loads
  of each half);
- the backward writes the un-rotated gradients to float32 and reads them back
  (302 MB a call);
- the value mixing is one more kernel each way, and λ's gradients two more
  reductions.

Measured (2026-11-30, 2b0a890): this module's kernels take
132 µs forward and 214 µs backward in the model (3.7–4.0 TB/s). The step is
1.75 ms faster in the bench and 2.2 ms in full runs: less than their bytes
promised, because Inductor's backward was already close to even.

Here one launch does all three tensors each way. Rows are (token, head)
pairs of D elements, flattened, so no head dimension is padded to a power
of two; a program takes BLOCK_R rows of one tensor (q, k or v: the grid is
three runs of row blocks), loads each half of D once, reduces in registers
and writes each output once. The backward writes the whole gradient of the
projection (its q, k and v columns), the value embedding's and λ's, so
nothing is copied into place afterwards.

Two implementations (`kernel_choice`): "torch" (`reference`, the model's own
operations) and "triton" (`torch.ops.speedrun.attn_inputs`, a custom op with
a fake and an autograd formula, so `torch.compile(fullgraph=True)` keeps it
whole). The kernel computes what the compiled reference computes: float32
throughout with one rounding per output (Inductor does not round rms_norm's
output before the rotation, nor λ to bfloat16); the backward treats every
intermediate rounding as the identity, as autograd does.

Under Triton's interpreter (3.x) a float32 -> bfloat16 conversion truncates;
there the kernels round in integer arithmetic (`_emulate_rne`), so the CPU
tests see the GPU's rounding.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import Tensor

from speedrun.kernels import bf16_rounding
from speedrun.kernels.choice import IMPLS, TRITON_FOUND, built_once, pick_impl  # noqa: F401 (its interface)

KERNEL_DTYPES = (torch.bfloat16, torch.float32)

# Launch: rows (token, head pairs) per program and warps, forward and backward. Read at each launch
# (the ops are opaque to the compiler). Swept on an H200 at the record's size (49,152 tokens x 6 heads x
# 128; scripts/bench/attn_inputs_bench.py, 12 launches): 16 rows, 4 warps forward: 142.8 us (3.7 TB/s);
# 16 rows, 8 warps backward: 240.6 us (3.45 TB/s); 64 rows: 157.6 / 285.8 us, 128 rows slower still.
KERNEL_CONFIG = {"BLOCK_R": 16, "num_warps": 4, "BLOCK_R_BWD": 16, "num_warps_bwd": 8}


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


def split_heads(qkv: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """(B, T, 3·H·D) projection -> q, k, v views (B, T, H, D)."""
    B, T = qkv.shape[:2]
    return qkv.view(B, T, 3 * num_heads, -1).chunk(3, dim=-2)


def reference(qkv: Tensor, ve: Tensor | None, lambdas: Tensor, cos: Tensor, sin: Tensor, num_heads: int
              ) -> tuple[Tensor, Tensor, Tensor]:
    """What `Attention.project` computes after its projection (QK norm and rotary on, value lambdas on)."""
    q, k, v = split_heads(qkv, num_heads)
    q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    v = lambdas[0] * v + lambdas[1] * ve.view_as(v) if ve is not None else lambdas[0] * v
    return q, k, v


def reference_float64(qkv: Tensor, ve: Tensor | None, lambdas: Tensor, cos: Tensor, sin: Tensor,
                      num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """The same math in float64 without intermediate rounding (float32's eps): what the kernel's
    backward differentiates, for the tests to measure gradients against."""
    q, k, v = split_heads(qkv.double(), num_heads)
    c, s = cos.double()[None, :, None, :], sin.double()[None, :, None, :]
    outs = []
    for x in (q, k):
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + rms_eps(torch.float32))
        n1, n2 = n.chunk(2, -1)
        outs.append(torch.cat((n1 * c + n2 * s, -n1 * s + n2 * c), -1))
    lam = lambdas.double()
    v = lam[0] * v + lam[1] * ve.double().view_as(v) if ve is not None else lam[0] * v
    return outs[0], outs[1], v


# --------------------------------------------------------------------------- dispatch


def attention_inputs(qkv: Tensor, ve: Tensor | None, lambdas: Tensor, cos: Tensor, sin: Tensor, num_heads: int,
                     impl: str = "auto") -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (B, T, H, D) from the projection qkv (B, T, 3·H·D), differentiable in qkv, ve and lambdas.

    ve: (B, T, H·D) value embedding or None; lambdas: (2,) float32 (λ1 unused without ve); cos, sin:
    (T, D/2) float32 angles of the tokens. impl: "torch" (`reference`), "triton" (the kernels: CUDA, or
    a CPU under TRITON_INTERPRET=1), "auto". The kernels' outputs are contiguous.
    """
    if pick_impl(qkv, impl) == "torch":
        return reference(qkv, ve, lambdas, cos, sin, num_heads)
    if not TRITON_FOUND:
        raise RuntimeError("attention_inputs impl='triton' needs Triton installed")
    B, T, width = qkv.shape
    flat = qkv.reshape(B * T, width)
    ve_flat = None if ve is None else ve.reshape(B * T, -1)
    cos, sin = cos.repeat(B, 1) if B > 1 else cos, sin.repeat(B, 1) if B > 1 else sin
    q, k, v = torch.ops.speedrun.attn_inputs(flat, ve_flat, lambdas, cos, sin, num_heads)
    shape = (B, T, num_heads, width // (3 * num_heads))
    return q.view(shape), k.view(shape), v.view(shape)


# --------------------------------------------------------------------------- Triton kernels

triton = tl = None  # set by built_once on first use
_INTERPRETED = False  # set by _build_kernel: TRITON_INTERPRET=1 when the kernels were defined
_rne_bf16 = _cast = _rows = _halves_at = _store_halves = _norm_rotate = _unrotate_norm_grad = None
_fwd_kernel = _bwd_kernel = None


@built_once
def _build_kernel(interpreted: bool):
    """Define the kernels (once, `built_once`); interpreted: TRITON_INTERPRET=1 now."""
    global _INTERPRETED, _rne_bf16, _cast, _rows, _halves_at, _store_halves  # module
    global _norm_rotate, _unrotate_norm_grad, _fwd_kernel, _bwd_kernel  # globals: the interpreter re-runs them
    _INTERPRETED = interpreted

    _rne_bf16 = bf16_rounding.build()  # called from the kernels below through this module's globals

    @triton.jit
    def _cast(x, P, EMULATE_RNE: tl.constexpr):
        """float32 x converted to the element type of pointer P, rounded to nearest even."""
        if EMULATE_RNE:
            return _rne_bf16(x).to(P.dtype.element_ty)  # exact: truncating a bfloat16 value
        else:
            return x.to(P.dtype.element_ty)

    @triton.jit
    def _rows(blk, H, N_ROWS, BLOCK_R: tl.constexpr, D2: tl.constexpr):
        """Row block blk: rows r (token t, head h), their mask [BLOCK_R, 1] and the half-row columns."""
        r = blk * BLOCK_R + tl.arange(0, BLOCK_R)
        ok = r < N_ROWS
        r = tl.where(ok, r, 0)
        return r, r // H, r % H, ok[:, None], tl.arange(0, D2)[None, :]

    @triton.jit
    def _halves_at(P, row_off, cols, ok, D2: tl.constexpr):
        """The two halves [BLOCK_R, D/2] of the rows starting at P + row_off ([BLOCK_R] int64), float32."""
        ptr = P + row_off[:, None] + cols
        return tl.load(ptr, mask=ok, other=0.0).to(tl.float32), tl.load(ptr + D2, mask=ok, other=0.0).to(tl.float32)

    @triton.jit
    def _norm_rotate(x1, x2, c, s, eps, D2: tl.constexpr):
        """rms_norm then the rotation, in float32 (no rounding in between, as Inductor compiles it)."""
        r = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * D2) + eps)[:, None]
        n1 = x1 * r
        n2 = x2 * r
        return n1 * c + n2 * s, n1 * (-s) + n2 * c

    @triton.jit
    def _unrotate_norm_grad(x1, x2, g1, g2, c, s, eps, D2: tl.constexpr):
        """d/dx of the rows given the output gradient: un-rotate, then dx = r*(dn - n*mean(dn*n))."""
        r = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * D2) + eps)[:, None]
        n1 = x1 * r
        n2 = x2 * r
        dn1 = g1 * c - g2 * s
        dn2 = g1 * s + g2 * c
        m = ((tl.sum(dn1 * n1, axis=1) + tl.sum(dn2 * n2, axis=1)) / (2 * D2))[:, None]
        return (dn1 - n1 * m) * r, (dn2 - n2 * m) * r

    @triton.jit
    def _store_halves(P, row_off, cols, ok, y1, y2, D2: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """Store the two float32 halves [BLOCK_R, D/2] at P + row_off, rounded to P's element type."""
        ptr = P + row_off[:, None] + cols
        tl.store(ptr, _cast(y1, P, EMULATE_RNE), mask=ok)
        tl.store(ptr + D2, _cast(y2, P, EMULATE_RNE), mask=ok)

    @triton.jit
    def _fwd_kernel(QKV, VE, LAM, COS, SIN, QO, KO, VO, N_ROWS, H, stride_t, stride_lam, eps, NUM_BLOCKS,
                    BLOCK_R: tl.constexpr, D2: tl.constexpr, HAS_VE: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """grid (3 * NUM_BLOCKS,): row blocks of q, then of k, then of v. Outputs (N, H, D) contiguous."""
        part = tl.program_id(0) // NUM_BLOCKS
        r, t, h, ok, cols = _rows(tl.program_id(0) % NUM_BLOCKS, H, N_ROWS, BLOCK_R, D2)
        src = t.to(tl.int64) * stride_t + ((part * H + h) * (2 * D2)).to(tl.int64)
        dst = r.to(tl.int64) * (2 * D2)
        x1, x2 = _halves_at(QKV, src, cols, ok, D2)
        if part < 2:
            tab = t[:, None] * D2 + cols
            c = tl.load(COS + tab, mask=ok, other=0.0)
            s = tl.load(SIN + tab, mask=ok, other=0.0)
            y1, y2 = _norm_rotate(x1, x2, c, s, eps, D2)
            if part == 0:
                _store_halves(QO, dst, cols, ok, y1, y2, D2, EMULATE_RNE)
            else:
                _store_halves(KO, dst, cols, ok, y1, y2, D2, EMULATE_RNE)
        else:
            lam0 = tl.load(LAM)
            y1 = lam0 * x1
            y2 = lam0 * x2
            if HAS_VE:
                lam1 = tl.load(LAM + stride_lam)
                e1, e2 = _halves_at(VE, dst, cols, ok, D2)
                y1 = y1 + lam1 * e1
                y2 = y2 + lam1 * e2
            _store_halves(VO, dst, cols, ok, y1, y2, D2, EMULATE_RNE)

    @triton.jit
    def _bwd_kernel(QKV, VE, LAM, COS, SIN, GQ, GK, GV, DQKV, DVE, PART, N_ROWS, H, stride_t, stride_lam, eps,
                    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, NUM_BLOCKS,
                    BLOCK_R: tl.constexpr, D2: tl.constexpr, HAS_VE: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """grid (3 * NUM_BLOCKS,) as the forward. DQKV is the projection's gradient (N, 3·H·D); the v
        programs also write DVE (N, H·D) and PART[block] = (sum g*v, sum g*ve) for the λ gradients."""
        part = tl.program_id(0) // NUM_BLOCKS
        blk = tl.program_id(0) % NUM_BLOCKS
        r, t, h, ok, cols = _rows(blk, H, N_ROWS, BLOCK_R, D2)
        src = t.to(tl.int64) * stride_t + ((part * H + h) * (2 * D2)).to(tl.int64)
        x1, x2 = _halves_at(QKV, src, cols, ok, D2)
        if part == 0:
            g1, g2 = _halves_at(GQ, t.to(tl.int64) * sq_t + (h * sq_h).to(tl.int64), cols, ok, D2)
        elif part == 1:
            g1, g2 = _halves_at(GK, t.to(tl.int64) * sk_t + (h * sk_h).to(tl.int64), cols, ok, D2)
        else:
            g1, g2 = _halves_at(GV, t.to(tl.int64) * sv_t + (h * sv_h).to(tl.int64), cols, ok, D2)
        if part < 2:
            tab = t[:, None] * D2 + cols
            c = tl.load(COS + tab, mask=ok, other=0.0)
            s = tl.load(SIN + tab, mask=ok, other=0.0)
            d1, d2 = _unrotate_norm_grad(x1, x2, g1, g2, c, s, eps, D2)
        else:
            lam0 = tl.load(LAM)
            d1 = lam0 * g1
            d2 = lam0 * g2
            p0 = tl.sum(tl.sum(g1 * x1 + g2 * x2, axis=1), axis=0)
            p1 = p0 * 0.0
            if HAS_VE:
                lam1 = tl.load(LAM + stride_lam)
                e1, e2 = _halves_at(VE, r.to(tl.int64) * (2 * D2), cols, ok, D2)
                p1 = tl.sum(tl.sum(g1 * e1 + g2 * e2, axis=1), axis=0)
                _store_halves(DVE, r.to(tl.int64) * (2 * D2), cols, ok, lam1 * g1, lam1 * g2, D2, EMULATE_RNE)
            tl.store(PART + 2 * blk, p0)
            tl.store(PART + 2 * blk + 1, p1)
        _store_halves(DQKV, src, cols, ok, d1, d2, D2, EMULATE_RNE)

    return _fwd_kernel, _bwd_kernel


def _check(qkv: Tensor, ve: Tensor | None, lambdas: Tensor, cos: Tensor, sin: Tensor, num_heads: int) -> int:
    """Validate the op's inputs; the head dimension D."""
    N, width = qkv.shape
    if qkv.dtype not in KERNEL_DTYPES or width % (3 * num_heads):
        raise ValueError(f"attn_inputs: qkv must be (N, 3*H*D) in {KERNEL_DTYPES}, got {tuple(qkv.shape)} {qkv.dtype}")
    D = width // (3 * num_heads)
    if D % 2 or (D // 2) & (D // 2 - 1):
        raise ValueError(f"attn_inputs: the kernel needs D/2 a power of two, got D = {D}")
    if tuple(cos.shape) != (N, D // 2) or tuple(sin.shape) != (N, D // 2):
        raise ValueError(f"attn_inputs: cos, sin must be (N, D/2) = {(N, D // 2)}, got {tuple(cos.shape)}, {tuple(sin.shape)}")
    if ve is not None and (tuple(ve.shape) != (N, num_heads * D) or ve.dtype != qkv.dtype):
        raise ValueError(f"attn_inputs: ve must be (N, H*D) = {(N, num_heads * D)} in {qkv.dtype}, got {tuple(ve.shape)}")
    if tuple(lambdas.shape) != (2,) or lambdas.dtype != torch.float32:
        raise ValueError(f"attn_inputs: lambdas must be two float32 values, got {tuple(lambdas.shape)} {lambdas.dtype}")
    return D


def _emulate_rne(dtype: torch.dtype) -> bool:
    """Round to bfloat16 in integer arithmetic? Only under the interpreter, whose float32 -> bfloat16
    conversion truncates (Triton 3.x); on a GPU the conversion is one round-to-nearest-even instruction."""
    return _INTERPRETED and dtype == torch.bfloat16


def _prepared(qkv: Tensor, ve: Tensor | None, cos: Tensor, sin: Tensor):
    contiguous = lambda t: t if t is None or t.is_contiguous() else t.contiguous()
    return contiguous(qkv), contiguous(ve), cos.to(torch.float32).contiguous(), sin.to(torch.float32).contiguous()


def _blocks(rows: int, block: int) -> int:
    return max(1, -(-rows // block))


def launch_forward(qkv: Tensor, ve: Tensor | None, lambdas: Tensor, cos: Tensor, sin: Tensor, num_heads: int
                   ) -> tuple[Tensor, Tensor, Tensor]:
    fwd, _ = _build_kernel()
    D = _check(qkv, ve, lambdas, cos, sin, num_heads)
    qkv, ve, cos, sin = _prepared(qkv, ve, cos, sin)
    N = qkv.shape[0]
    outs = [qkv.new_empty((N, num_heads, D)) for _ in range(3)]
    if N:
        cfg = KERNEL_CONFIG
        nb = _blocks(N * num_heads, cfg["BLOCK_R"])
        fwd[(3 * nb,)](qkv, qkv if ve is None else ve, lambdas, cos, sin, *outs, N * num_heads, num_heads,
                       qkv.stride(0), lambdas.stride(0), rms_eps(qkv.dtype), nb,
                       BLOCK_R=cfg["BLOCK_R"], D2=D // 2, HAS_VE=ve is not None,
                       EMULATE_RNE=_emulate_rne(qkv.dtype), num_warps=cfg["num_warps"])
    return tuple(outs)


def _grad_rows(g: Tensor) -> Tensor:
    """An upstream gradient (N, H, D) with a unit last stride (the kernel takes token and head strides)."""
    return g if g.stride(-1) == 1 else g.contiguous()


def lambda_blocks(rows: int, num_heads: int) -> int:
    """Rows of the backward's λ partial sums: one per program of BLOCK_R_BWD (token, head) rows."""
    return _blocks(rows * num_heads, KERNEL_CONFIG["BLOCK_R_BWD"])


def launch_backward(gq: Tensor, gk: Tensor, gv: Tensor, qkv: Tensor, ve: Tensor | None, lambdas: Tensor,
                    cos: Tensor, sin: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """(d qkv, d ve, λ partial sums (blocks, 2)): the caller sums the partials over dim 0. Summed
    here, that was an eager 12 µs reduction a layer (1.1 ms/step on an H200, 4343345, 2026-12-01);
    summed in the traced backward, Inductor compiles it into its own kernels."""
    _, bwd = _build_kernel()
    D = _check(qkv, ve, lambdas, cos, sin, num_heads)
    qkv, ve, cos, sin = _prepared(qkv, ve, cos, sin)
    gq, gk, gv = _grad_rows(gq), _grad_rows(gk), _grad_rows(gv)
    N = qkv.shape[0]
    d_qkv = torch.empty_like(qkv)
    d_ve = torch.empty_like(ve) if ve is not None else qkv.new_empty((0,))
    cfg = KERNEL_CONFIG
    nb = lambda_blocks(N, num_heads)
    parts = (torch.empty if N else torch.zeros)((nb, 2), dtype=torch.float32, device=qkv.device)
    if N:
        bwd[(3 * nb,)](qkv, qkv if ve is None else ve, lambdas, cos, sin, gq, gk, gv, d_qkv,
                       qkv if ve is None else d_ve, parts, N * num_heads, num_heads, qkv.stride(0),
                       lambdas.stride(0), rms_eps(qkv.dtype), gq.stride(0), gq.stride(1), gk.stride(0),
                       gk.stride(1), gv.stride(0), gv.stride(1), nb, BLOCK_R=cfg["BLOCK_R_BWD"], D2=D // 2,
                       HAS_VE=ve is not None, EMULATE_RNE=_emulate_rne(qkv.dtype), num_warps=cfg["num_warps_bwd"])
    return d_qkv, d_ve, parts


# --------------------------------------------------------------------------- the ops


@torch.library.custom_op("speedrun::attn_inputs", mutates_args=())
def attn_inputs_op(qkv: Tensor, ve: Tensor | None, lambdas: Tensor, cos: Tensor, sin: Tensor, num_heads: int
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (N, H, D) contiguous in qkv's dtype from the projection qkv (N, 3·H·D)."""
    return launch_forward(qkv, ve, lambdas, cos, sin, num_heads)


@attn_inputs_op.register_fake
def _(qkv, ve, lambdas, cos, sin, num_heads):
    shape = (qkv.shape[0], num_heads, qkv.shape[1] // (3 * num_heads))
    return qkv.new_empty(shape), qkv.new_empty(shape), qkv.new_empty(shape)


@torch.library.custom_op("speedrun::attn_inputs_backward", mutates_args=())
def attn_inputs_backward(gq: Tensor, gk: Tensor, gv: Tensor, qkv: Tensor, ve: Tensor | None, lambdas: Tensor,
                         cos: Tensor, sin: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """(d qkv (N, 3·H·D), d ve (N, H·D), or (0,) without ve, λ partial sums (blocks, 2)) given the
    outputs' gradients; d lambdas is the partials' sum over dim 0."""
    return launch_backward(gq, gk, gv, qkv, ve, lambdas, cos, sin, num_heads)


@attn_inputs_backward.register_fake
def _(gq, gk, gv, qkv, ve, lambdas, cos, sin, num_heads):
    d_ve = torch.empty_like(ve) if ve is not None else qkv.new_empty((0,))
    parts = lambdas.new_empty((lambda_blocks(qkv.shape[0], num_heads), 2))
    return torch.empty_like(qkv), d_ve, parts


def _setup_context(ctx, inputs, output):
    qkv, ve, lambdas, cos, sin, num_heads = inputs
    ctx.save_for_backward(qkv, ve, lambdas, cos, sin)
    ctx.num_heads = num_heads


def _backward(ctx, gq, gk, gv):
    qkv, ve, lambdas, cos, sin = ctx.saved_tensors
    zeros = lambda: qkv.new_zeros((qkv.shape[0], ctx.num_heads, qkv.shape[1] // (3 * ctx.num_heads)))
    gq, gk, gv = (zeros() if g is None else g for g in (gq, gk, gv))
    d_qkv, d_ve, parts = torch.ops.speedrun.attn_inputs_backward(gq, gk, gv, qkv, ve, lambdas, cos, sin, ctx.num_heads)
    return d_qkv, (d_ve if ve is not None else None), parts.sum(0), None, None, None


attn_inputs_op.register_autograd(_backward, setup_context=_setup_context)
