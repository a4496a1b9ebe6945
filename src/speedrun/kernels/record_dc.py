"""Layer 10's DC correction of the 2026 record as three Triton kernels: forward, dQ, dK/dV.

The term (spec "Attention sublayer", DC; `record_parts.dc_correction` is the reference) is

    term_h(t) = w2_h(t)·Σ_j M(t, j)·v_h(j),   M(t, j) = Σ_g w1n_g(t)·P_g(t, j),

with P_g head g's softmax of scale·q_g(t)·k_g(j) over the keys j ∈ [t − W, t] of t's document (W =
keys − 1 = 111). Through an attention kernel it costs one attention per value head, each over all six
query heads: 36 head pairs, six launches each way, six (n, H, D) copies and float32 mixes (85 ms a
step of device time at the record's stage 2 on an H200, 2026-12-06, where these kernels take 28.5).
M is one (n, W + 1) band shared by every value head, so here a
program of 64 queries makes the six heads' scores for its three 64-key tiles (the band's 175 keys),
sums them into M in registers, and multiplies M by the values of all heads: six score products and
six value products a block, not 36 and 36. Why the pieces are as they are:

- The three tiles (keys t0 − 128 … t0 + 63 for queries t0 … t0 + 63) hold a row's whole band, so the
  softmax needs no running maximum: each head's row maximum and sum come from the three tiles at
  once. That is what bounds the window: W ≤ 128 (`MAX_WINDOW`).
- Visibility needs only each query's document start (`doc_starts`): key j is seen by query t iff
  start(t) ≤ j ≤ t and t − j ≤ W. No mask or block list is built.
- Scores are bf16 products with float32 sums (the spec's tf32 has less precision than that); the
  products with M, dM and dS run in tf32, below the bf16 rounding of the output they feed.
- The forward keeps M (n, 192) float32 and each head's log-sum-exp for the backward: 0.8 KB a token.
  The dQ kernel (a program per query block) recomputes P from the log-sum-exp, writes dM, the
  gradients of the coefficients and dQ; the dK/dV kernel (a program per key block) reads M and dM of
  the three query blocks that see its keys. No atomics: every gradient is written by one program, in
  a fixed order, so the backward is deterministic.
- dS = P ⊙ (dP − Σ_j P dP) with dP = w1n·dM, and Σ_j P_g dM = ∂L/∂w1n_g, which the dQ kernel writes:
  the dK/dV kernel reads it back instead of summing rows it does not hold.

`dc_correction` is `RecordKernels.dc` on a GPU (`record_attention.pick`); the CPU tests run the
kernels under Triton's interpreter against the reference, and a GPU test holds them to it at the
record's size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from speedrun.kernels.choice import built_once
from speedrun.model.record_parts import norm

BLOCK = 64  # queries a program, keys a tile
MAX_WINDOW = 2 * BLOCK  # the three key tiles of a query block cover t − W … t for W ≤ this
TILES = 3 * BLOCK  # the band's columns as the kernels store M and dM
NUM_WARPS = 8
NUM_STAGES = 1  # deeper pipelining takes the dK/dV kernel past Hopper's 227 KB of shared memory (234 KB at two stages, Triton 3.6)

triton = tl = None  # set by built_once on first use
_dc_forward = _dc_backward_q = _dc_backward_kv = _block = _rows = _scores = _tf32 = None


@built_once
def _build(interpreted: bool):
    """Define the kernels once (`built_once`); their helpers are module globals, as the interpreter needs."""
    global _dc_forward, _dc_backward_q, _dc_backward_kv, _block, _rows, _scores, _tf32

    @triton.jit
    def _block(START, n, B: tl.constexpr):
        """This program's query block: its first row, rows, which exist, rows as int64, their
        documents' starts, and the offsets 0 … B − 1."""
        t0 = tl.program_id(0) * B
        rows = t0 + tl.arange(0, B)
        live = rows < n
        return t0, rows, live, rows.to(tl.int64), tl.load(START + rows, mask=live, other=0), tl.arange(0, B)

    @triton.jit
    def _rows(P, idx, n, stride, h, D: tl.constexpr):
        """Head h of the rows idx of an (n, H, D) tensor with row stride `stride` (zeros outside 0 … n − 1)."""
        ok = (idx >= 0) & (idx < n)
        d = tl.arange(0, D)
        return tl.load(P + idx.to(tl.int64)[:, None] * stride + h * D + d[None, :], mask=ok[:, None], other=0.0)

    @triton.jit
    def _scores(q, k, rows, cols, start, scale, W: tl.constexpr, WIDEN: tl.constexpr):
        """scale·q·kᵀ of one tile, −inf where key `cols` is not visible to query `rows`. WIDEN: the
        product of float32 copies (Triton's interpreter multiplies bfloat16 operands wrongly)."""
        if WIDEN:
            s = tl.dot(q.to(tl.float32), tl.trans(k).to(tl.float32)) * scale
        else:
            s = tl.dot(q, tl.trans(k)) * scale
        seen = (cols[None, :] <= rows[:, None]) & (cols[None, :] >= start[:, None]) & (rows[:, None] - cols[None, :] <= W)
        return tl.where(seen, s, float("-inf"))

    @triton.jit
    def _tf32(a, b):
        return tl.dot(a, b.to(tl.float32), input_precision="tf32")

    @triton.jit
    def _dc_forward(Q, K, V, START, W1N, W2, OUT, LSE, MIX, n, sq, sk, sv, scale,
                    H: tl.constexpr, D: tl.constexpr, B: tl.constexpr, W: tl.constexpr,
                    WIDEN: tl.constexpr):
        t0, rows, live, r64, start, c = _block(START, n, B)
        m0 = tl.zeros((B, B), tl.float32)
        m1 = tl.zeros((B, B), tl.float32)
        m2 = tl.zeros((B, B), tl.float32)
        for g in range(H):
            q = _rows(Q, rows, n, sq, g, D)
            s0 = _scores(q, _rows(K, t0 - 2 * B + c, n, sk, g, D), rows, t0 - 2 * B + c, start, scale, W, WIDEN)
            s1 = _scores(q, _rows(K, t0 - B + c, n, sk, g, D), rows, t0 - B + c, start, scale, W, WIDEN)
            s2 = _scores(q, _rows(K, t0 + c, n, sk, g, D), rows, t0 + c, start, scale, W, WIDEN)
            top = tl.maximum(tl.maximum(tl.max(s0, 1), tl.max(s1, 1)), tl.max(s2, 1))
            top = tl.where(live, top, 0.0)  # rows past n see no key; every other row sees itself
            e0, e1, e2 = tl.exp(s0 - top[:, None]), tl.exp(s1 - top[:, None]), tl.exp(s2 - top[:, None])
            total = tl.where(live, tl.sum(e0, 1) + tl.sum(e1, 1) + tl.sum(e2, 1), 1.0)
            coef = tl.load(W1N + r64 * H + g, mask=live, other=0.0) / total
            m0 += coef[:, None] * e0
            m1 += coef[:, None] * e1
            m2 += coef[:, None] * e2
            tl.store(LSE + r64 * H + g, top + tl.log(total), mask=live)
        mix = MIX + r64[:, None] * (3 * B) + c[None, :]
        tl.store(mix, m0, mask=live[:, None])
        tl.store(mix + B, m1, mask=live[:, None])
        tl.store(mix + 2 * B, m2, mask=live[:, None])
        d = tl.arange(0, D)
        for h in range(H):
            u = _tf32(m0, _rows(V, t0 - 2 * B + c, n, sv, h, D))
            u += _tf32(m1, _rows(V, t0 - B + c, n, sv, h, D))
            u += _tf32(m2, _rows(V, t0 + c, n, sv, h, D))
            w2 = tl.load(W2 + r64 * H + h, mask=live, other=0.0)
            tl.store(OUT + r64[:, None] * (H * D) + h * D + d[None, :], u * w2[:, None], mask=live[:, None])

    @triton.jit
    def _dc_backward_q(Q, K, V, START, W1N, W2, LSE, MIX, G, DQ, DW1N, DW2, DMIX, n, sq, sk, sv, scale,
                       H: tl.constexpr, D: tl.constexpr, B: tl.constexpr, W: tl.constexpr,
                       WIDEN: tl.constexpr):
        t0, rows, live, r64, start, c = _block(START, n, B)
        d = tl.arange(0, D)
        mix = MIX + r64[:, None] * (3 * B) + c[None, :]
        m0 = tl.load(mix, mask=live[:, None], other=0.0)
        m1 = tl.load(mix + B, mask=live[:, None], other=0.0)
        m2 = tl.load(mix + 2 * B, mask=live[:, None], other=0.0)
        dm0 = tl.zeros((B, B), tl.float32)
        dm1 = tl.zeros((B, B), tl.float32)
        dm2 = tl.zeros((B, B), tl.float32)
        for h in range(H):  # one value tile live at a time: three at once pass Hopper's shared memory
            gh = tl.load(G + r64[:, None] * (H * D) + h * D + d[None, :], mask=live[:, None], other=0.0)
            du = gh * tl.load(W2 + r64 * H + h, mask=live, other=0.0)[:, None]
            v = _rows(V, t0 - 2 * B + c, n, sv, h, D).to(tl.float32)
            u = _tf32(m0, v)
            dm0 += _tf32(du, tl.trans(v))
            v = _rows(V, t0 - B + c, n, sv, h, D).to(tl.float32)
            u += _tf32(m1, v)
            dm1 += _tf32(du, tl.trans(v))
            v = _rows(V, t0 + c, n, sv, h, D).to(tl.float32)
            u += _tf32(m2, v)
            dm2 += _tf32(du, tl.trans(v))
            tl.store(DW2 + r64 * H + h, tl.sum(gh * u, 1), mask=live)
        dmix = DMIX + r64[:, None] * (3 * B) + c[None, :]
        tl.store(dmix, dm0, mask=live[:, None])
        tl.store(dmix + B, dm1, mask=live[:, None])
        tl.store(dmix + 2 * B, dm2, mask=live[:, None])
        for g in range(H):
            q = _rows(Q, rows, n, sq, g, D)
            k0 = _rows(K, t0 - 2 * B + c, n, sk, g, D)
            k1 = _rows(K, t0 - B + c, n, sk, g, D)
            k2 = _rows(K, t0 + c, n, sk, g, D)
            lse = tl.load(LSE + r64 * H + g, mask=live, other=0.0)[:, None]
            p0 = tl.exp(_scores(q, k0, rows, t0 - 2 * B + c, start, scale, W, WIDEN) - lse)
            p1 = tl.exp(_scores(q, k1, rows, t0 - B + c, start, scale, W, WIDEN) - lse)
            p2 = tl.exp(_scores(q, k2, rows, t0 + c, start, scale, W, WIDEN) - lse)
            dw = tl.sum(dm0 * p0, 1) + tl.sum(dm1 * p1, 1) + tl.sum(dm2 * p2, 1)
            tl.store(DW1N + r64 * H + g, dw, mask=live)
            w = tl.load(W1N + r64 * H + g, mask=live, other=0.0)[:, None]
            dq = _tf32(w * p0 * (dm0 - dw[:, None]), k0)
            dq += _tf32(w * p1 * (dm1 - dw[:, None]), k1)
            dq += _tf32(w * p2 * (dm2 - dw[:, None]), k2)
            tl.store(DQ + r64[:, None] * (H * D) + g * D + d[None, :], (dq * scale).to(DQ.dtype.element_ty),
                     mask=live[:, None])

    @triton.jit
    def _dc_backward_kv(Q, K, START, W1N, W2, LSE, MIX, DMIX, G, DW1N, DK, DV, n, sq, sk, scale,
                        H: tl.constexpr, D: tl.constexpr, B: tl.constexpr, W: tl.constexpr,
                       WIDEN: tl.constexpr):
        j0 = tl.program_id(0) * B
        cols = j0 + tl.arange(0, B)
        keep = cols < n
        c64 = cols.to(tl.int64)
        c = tl.arange(0, B)
        d = tl.arange(0, D)
        for g in range(H):
            k = _rows(K, cols, n, sk, g, D)
            dk = tl.zeros((B, D), tl.float32)
            for qt in tl.static_range(3):  # the query blocks whose bands hold these keys, at band tile 2 − qt
                rows = j0 + qt * B + c
                live = rows < n
                r64 = rows.to(tl.int64)
                start = tl.load(START + rows, mask=live, other=0)
                q = _rows(Q, rows, n, sq, g, D)
                lse = tl.load(LSE + r64 * H + g, mask=live, other=0.0)[:, None]
                p = tl.exp(_scores(q, k, rows, cols, start, scale, W, WIDEN) - lse)
                dm = tl.load(DMIX + r64[:, None] * (3 * B) + (2 - qt) * B + c[None, :], mask=live[:, None], other=0.0)
                w = tl.load(W1N + r64 * H + g, mask=live, other=0.0)[:, None]
                dw = tl.load(DW1N + r64 * H + g, mask=live, other=0.0)[:, None]
                dk += _tf32(tl.trans(w * p * (dm - dw)), q)
            tl.store(DK + c64[:, None] * (H * D) + g * D + d[None, :], (dk * scale).to(DK.dtype.element_ty),
                     mask=keep[:, None])
        for h in range(H):
            dv = tl.zeros((B, D), tl.float32)
            for qt in tl.static_range(3):
                rows = j0 + qt * B + c
                live = rows < n
                r64 = rows.to(tl.int64)
                m = tl.load(MIX + r64[:, None] * (3 * B) + (2 - qt) * B + c[None, :], mask=live[:, None], other=0.0)
                gh = tl.load(G + r64[:, None] * (H * D) + h * D + d[None, :], mask=live[:, None], other=0.0)
                du = gh * tl.load(W2 + r64 * H + h, mask=live, other=0.0)[:, None]
                dv += _tf32(tl.trans(m), du)
            tl.store(DV + c64[:, None] * (H * D) + h * D + d[None, :], dv.to(DV.dtype.element_ty), mask=keep[:, None])

    return _dc_forward, _dc_backward_q, _dc_backward_kv


def compile_offline(which: str):
    """Compile kernel `which` ("forward", "dq", "dkdv") for sm_90 at the record's shapes without a GPU
    (Triton's bundled ptxas), as the GPU compiles it; the CompiledKernel (its shared memory and
    registers are what a launch needs: `relu2_gluon.resource_usage`)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = dict(zip(("forward", "dq", "dkdv"), _build()))[which]
    consts = dict(H=6, D=128, B=BLOCK, W=111, WIDEN=False)
    types = {"START": "*i32", "n": "i32", "sq": "i32", "sk": "i32", "sv": "i32", "scale": "fp32"}
    types.update({name: "*bf16" for name in ("Q", "K", "V", "DQ", "DK", "DV")})
    signature = {a: "constexpr" if a in consts else types.get(a, "*fp32") for a in kernel.arg_names}
    # the launch's specialisations at the record's shapes: 16-byte aligned tensors, n and the row
    # strides multiples of 16
    aligned = [a for a in kernel.arg_names if signature[a].startswith("*")] + ["n", "sq", "sk", "sv"]
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned if a in kernel.arg_names}
    return triton.compile(ASTSource(kernel, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": NUM_WARPS, "num_stages": NUM_STAGES})


def doc_starts(cu_seqlens: Tensor, n: int) -> Tensor:
    """int32 (n,): the first position of each token's document (cu_seqlens padded by repeating n): each
    start marked at its own position, then the running maximum. (Inductor 2.11 cannot lower
    `searchsorted` on a slice of cu_seqlens.)"""
    cu = cu_seqlens.reshape(-1).to(torch.int64)
    marks = torch.zeros(n + 1, dtype=torch.int64, device=cu.device).scatter_reduce(0, cu, cu, reduce="amax")
    return marks[:n].cummax(0).values.to(torch.int32)


def _heads_last(t: Tensor) -> Tensor:
    """t (n, H, D) with heads D apart and unit steps inside a head, as the kernels address it."""
    return t if t.stride(2) == 1 and t.stride(1) == t.shape[2] else t.contiguous()


def _check(q: Tensor, k: Tensor, v: Tensor, window: int) -> None:
    if not 0 <= window <= MAX_WINDOW:
        raise ValueError(f"record_dc: the window (keys - 1) must be in 0 … {MAX_WINDOW}, got {window}")
    if not (q.shape == k.shape == v.shape) or q.dim() != 3:
        raise ValueError(f"record_dc: q, k, v must be (n, H, D) alike, got {q.shape}, {k.shape}, {v.shape}")


@torch.library.custom_op("speedrun::record_dc", mutates_args=())
def record_dc(q: Tensor, k: Tensor, v: Tensor, start: Tensor, w1n: Tensor, w2: Tensor, scale: float, window: int
              ) -> tuple[Tensor, Tensor, Tensor]:
    """(term (n, H, D) float32, each head's log-sum-exp (n, H), M (n, 192)): the forward kernel."""
    forward, _, _ = _build()
    _check(q, k, v, window)
    q, k, v = (_heads_last(t) for t in (q, k, v))
    n, H, D = q.shape
    term = torch.empty((n, H, D), dtype=torch.float32, device=q.device)
    lse = torch.empty((n, H), dtype=torch.float32, device=q.device)
    mix = torch.empty((n, TILES), dtype=torch.float32, device=q.device)
    if n:
        forward[(triton.cdiv(n, BLOCK),)](q, k, v, start.contiguous(), w1n.contiguous(), w2.contiguous(), term, lse,
                                          mix, n, q.stride(0), k.stride(0), v.stride(0), scale, H=H, D=D, B=BLOCK,
                                          W=window, WIDEN=q.device.type != "cuda", num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return term, lse, mix


@record_dc.register_fake
def _(q, k, v, start, w1n, w2, scale, window):
    n, H, D = q.shape
    f32 = torch.float32
    return q.new_empty((n, H, D), dtype=f32), q.new_empty((n, H), dtype=f32), q.new_empty((n, TILES), dtype=f32)


@torch.library.custom_op("speedrun::record_dc_backward", mutates_args=())
def record_dc_backward(g: Tensor, q: Tensor, k: Tensor, v: Tensor, start: Tensor, w1n: Tensor, w2: Tensor,
                       lse: Tensor, mix: Tensor, scale: float, window: int
                       ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv in q's dtype, d w1n, d w2 float32) for the term's gradient g (n, H, D)."""
    _, backward_q, backward_kv = _build()
    q, k, v = (_heads_last(t) for t in (q, k, v))
    n, H, D = q.shape
    g = g.to(torch.float32).contiguous()
    dq, dk, dv = (torch.empty((n, H, D), dtype=q.dtype, device=q.device) for _ in range(3))
    dw1n, dw2 = (torch.empty((n, H), dtype=torch.float32, device=q.device) for _ in range(2))
    dmix = torch.empty_like(mix)
    if n:
        grid = (triton.cdiv(n, BLOCK),)
        start, w1n, w2 = start.contiguous(), w1n.contiguous(), w2.contiguous()
        backward_q[grid](q, k, v, start, w1n, w2, lse, mix, g, dq, dw1n, dw2, dmix, n, q.stride(0), k.stride(0),
                         v.stride(0), scale, H=H, D=D, B=BLOCK, W=window, WIDEN=q.device.type != "cuda", num_warps=NUM_WARPS, num_stages=NUM_STAGES)
        backward_kv[grid](q, k, start, w1n, w2, lse, mix, dmix, g, dw1n, dk, dv, n, q.stride(0), k.stride(0), scale,
                          H=H, D=D, B=BLOCK, W=window, WIDEN=q.device.type != "cuda", num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return dq, dk, dv, dw1n, dw2


@record_dc_backward.register_fake
def _(g, q, k, v, start, w1n, w2, lse, mix, scale, window):
    n, H, _ = q.shape
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), w1n.new_empty((n, H)),
            w2.new_empty((n, H)))


def _setup_context(ctx, inputs, output):
    q, k, v, start, w1n, w2, scale, window = inputs
    _, lse, mix = output
    ctx.mark_non_differentiable(lse, mix)
    ctx.save_for_backward(q, k, v, start, w1n, w2, lse, mix)
    ctx.scale, ctx.window = scale, window


def _backward(ctx, g, _g_lse, _g_mix):
    dq, dk, dv, dw1n, dw2 = torch.ops.speedrun.record_dc_backward(g, *ctx.saved_tensors, ctx.scale, ctx.window)
    return dq, dk, dv, None, dw1n, dw2, None, None


record_dc.register_autograd(_backward, setup_context=_setup_context)


def dc_correction(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, w1: Tensor, w2: Tensor, scale: float,
                  keys: int = 112, eps: float = 1e-6, longest: int | None = None) -> Tensor:
    """`record_parts.dc_correction`'s term (n, H, D) float32 by the kernels: q, k, v (n, H, D) or
    (1, n, H, D) half precision, w1 (raw, normed here over the heads) and w2 (n, H) or (1, n, H).
    `longest` is the seam's argument; the band needs no grid bound."""
    if q.dim() == 4:
        shape = q.shape[1:3]
        return dc_correction(q[0], k[0], v[0], cu_seqlens, w1.reshape(shape), w2.reshape(shape), scale, keys,
                             eps, longest)[None]
    start = doc_starts(cu_seqlens, q.shape[0])
    return torch.ops.speedrun.record_dc(q, k, v, start, norm(w1.float(), eps), w2.float(), float(scale), keys - 1)[0]
