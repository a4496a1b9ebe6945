"""The 2026 record's training head loss in Triton: the multi-token and prefix cross-entropy of the
soft-capped logits, its gradient written in the forward.

The model's loss (`record_loss.record_training_loss`) is the reference: one float32 log-softmax over
the (n, V) soft-capped logits, each term a gather from it. Compiled, it keeps float32 (n, V) tensors
alive between the forward and the backward and makes them again in the backward: several hundred KB a
token, at the record's 49,152-token micro-batch tens of GiB, and as many sweeps of memory. These
kernels read the bf16 logits twice and write the gradient once:

    ẑ = c·σ((z + a)/d) ≤ c,  so  lse = c + log Σ_j exp(ẑ_j − c)  needs no running maximum;
    loss_t = Σ_k w_k·[t + k < n]·(lse − ẑ[x_{t+k+1}]) + π·[T′(x_{t+1}) exists]·(lse − ẑ[T′(x_{t+1})]);
    ∂loss_t/∂z_j = (S_t·softmax(ẑ)_j − Σ (weights of the targets equal to j))·(c/d)·σ(1 − σ),

with S_t the sum of row t's weights. That is the exact gradient of the loss it reports, as autograd
gives the reference's (the record's own kernel uses Σ_k w_k on the last K − 1 rows too; the spec's
"Unresolved" notes it). A program of the sweeps kernel takes a block of rows and sweeps the
vocabulary in (rows, columns) tiles (`TILES`): once for the lse and the loss, and for the bf16
gradient a second time, writing S_t·softmax·σ′ alone; the (at most `MAX_TERMS` MTP terms and the
prefix) target columns of each row are then written again with their weights subtracted, after a
barrier, so the sweep compares no column with five targets. The e5m2 pair's second sweep is two
kernels of their own instead: a tile kernel over (row block, column block), from the rows' lse and
S that the sweeps kernel wrote, then the target columns' kernel. Written by programs that each swept
their rows, the pair took 7.56 ms a call at stage 2's micro-batch on an H100 (2026-12-07): 384
programs of 128 rows, two an SM, are 1.45 waves of 132 SMs, each program's loads and stores in turn.
The three kernels took 5.96 at 128 × 128 tiles and 5.57 at 64 × 128, the same codes
(`scripts/bench/record_ce_bench.py`). Offsets inside the
block are int32 and only the block's base is int64 (n·V passes 2^31): the tiles' registers stay at
40–160 a thread with no spills (compiled for sm_90 offline under Triton 3.6 and 3.9;
`tests/test_record_kernel_resources.py`).
The e5m2 codes come from a rounding by hand onto e5m2's grid (`_round_e5m2`) and then an exact cast,
on every backend: the hardware's cast of the unrounded values left the transposed copy's codes
non-finite in training (the record trained to NaN at step 2 on an H100, 2026-12-07), and Triton 3.9's
interpreted cast is wrong.

The sweeps are bound by the special-function unit (16 results a clock an SM against 128 issued
instructions), so the arithmetic is `softcap_ce`'s lean kernel's: base-2 exponentials with the
constants folded, the PTX `ex2`/`rcp` instructions without Triton's range fix-ups on NVIDIA GPUs, and
one reciprocal for two columns' sigmoids (`_sigmoid_pair`, columns c and c + BV/2 of a sweep step).
Compiled for sm_90 (Triton 3.6, offline) with the hardware's cast, the e5m2 form's two sweeps took
12.7 + 23.5 instructions an element, 5 of them special-function, where `8f5d585`'s took 24.4 + 42.9
and 6 (9.2 ms a call at the 49,152-row micro-batch on an H200); the rounding by hand, back since
`101a48d`, made it 7.5 ms a call on an H100 where the hardware's cast took 6.9, before the split
above.
The gradient takes one of two forms:

- bf16 (n, V), which the backward multiplies by each row's upstream gradient in place: nothing else
  holds it (`softcap_ce`'s reasoning, which this follows). `fused_training_loss`, `RecordKernels.loss`.
- with the FP8 head in training, the e5m2 pair that the head's two gradient products read: (n, V)
  for grad_x, whose reduction runs along V, and its transpose (V, n) for grad_W, whose reduction runs
  along the tokens (an FP8 tensor-core product reads both operands along the reduction). The tile
  kernel writes both, so the bf16 gradient, and the cast-and-transpose pass that read it (34 ms a step at
  the record's stage 2 on an H100, 2026-12-06), never exist. `fp8_head_training_loss`,
  `RecordKernels.head_loss`: the head's forward product, the kernel, and the two gradient products.

`record_attention.pick` chooses both on a GPU; the CPU tests run the kernel through Triton's
interpreter against the references, and GPU tests hold it there at the record's vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from speedrun.kernels.choice import built_once
from speedrun.model.record_fp8 import (RECORD_FP8, Fp8Config, Product, head_forward, head_grad_w, head_grad_x,
                                       head_quantize_input, head_quantize_weight, reference_product)
from speedrun.model.record_parts import SOFTCAP

MAX_TERMS = 4  # MTP terms the kernel takes (the record has at most 3)
# (rows a program takes, columns of one sweep step, warps) for each gradient form: the sweeps' for none
# and bf16 (the e5m2 pair's sweeps take form 0's), the tile kernel's for the e5m2 pair. Measured at stage
# 2's micro-batch on an H100 (2026-12-07, `record_ce_bench.py`): bf16 5.40 ms a call at 32 × 128, 5.93 at
# 64 × 128; the pair's tile kernel 5.57 at 64 × 128 × 4 warps, 5.96 at 128 × 128 × 8, 5.43 at 64 × 256
# (a tile 256 columns wide pairs other columns' sigmoids, so its codes differ in the last place from the
# tiles the record's three GPU steps ran, 128 wide: not taken)
TILES = {0: (32, 256, 8), 1: (32, 128, 8), 2: (64, 128, 4)}
TARGET_ROWS = 128  # rows a program of the target columns' kernel takes (4 warps)
E5M2_MAX = 57344.0  # e5m2's largest finite value: the saturating gradient's bound

triton = tl = None  # set by built_once on first use
_mtp_ce_kernel = _e5m2_pair_kernel = _target_kernel = _terms = _round_e5m2 = None
_store_grad = _target_grad = _target_grads = _term = _term_loss = None
_ex2 = _rcp = _sigmoid = _sigmoid_pair = _sweep_step = _base2 = None


@built_once
def _build(interpreted: bool):
    """Define the kernel once (`built_once`); its helpers are module globals, as the interpreter needs."""
    global _mtp_ce_kernel, _e5m2_pair_kernel, _target_kernel, _terms, _round_e5m2, _store_grad, _target_grad
    global _target_grads, _term, _term_loss
    global _ex2, _rcp, _sigmoid, _sigmoid_pair, _sweep_step, _base2

    if not interpreted and torch.version.hip is None:
        # the PTX instructions themselves: Triton's 2^x and division add range fix-ups around them (a
        # compare, a select and two multiplies each, in the SASS), which the flushed-to-zero forms skip;
        # a subnormal exponential or reciprocal is 0 either way in the sums and gradients here
        @triton.jit
        def _ex2(x):
            return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                             is_pure=True, pack=1)

        @triton.jit
        def _rcp(x):
            return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                             is_pure=True, pack=1)
    else:
        @triton.jit
        def _ex2(x):
            return tl.exp2(x)

        @triton.jit
        def _rcp(x):
            return 1.0 / x

    @triton.jit
    def _term(TN, W, rows, n, k: tl.constexpr, K: tl.constexpr):
        """(targets, weights) of MTP term k for the block's rows: weight 0 past the batch or past K."""
        valid = rows + k < n
        if k < K:
            t = tl.load(TN + rows + k, mask=valid, other=0).to(tl.int64)
            w = tl.load(W + k) * valid.to(tl.float32)
        else:
            t = rows * 0
            w = valid.to(tl.float32) * 0.0
        return t, w

    @triton.jit
    def _terms(TN, PRE, W, PI, rows, live, n, K: tl.constexpr, HAS_PREFIX: tl.constexpr):
        """(target, weight) of the four MTP terms and the prefix term of each row."""
        t0, w0 = _term(TN, W, rows, n, 0, K)
        t1, w1 = _term(TN, W, rows, n, 1, K)
        t2, w2 = _term(TN, W, rows, n, 2, K)
        t3, w3 = _term(TN, W, rows, n, 3, K)
        if HAS_PREFIX:
            pre = tl.load(PRE + tl.load(TN + rows, mask=live, other=0), mask=live, other=-1)
            tp = tl.where(pre >= 0, pre, 0).to(tl.int64)
            wp = tl.load(PI) * (pre >= 0).to(tl.float32)
        else:
            tp, wp = t0, w0 * 0.0
        return t0, w0, t1, w1, t2, w2, t3, w3, tp, wp

    @triton.jit
    def _round_e5m2(x):
        """x (within ±57,344) rounded to e5m2's grid in float32, to nearest with ties to even, as torch's
        cast rounds: the mantissa's 21 dropped bits by integer carry (into the exponent when it
        overflows, which Triton 3.9's interpreter's own cast misses), subnormals (below 2^-14) on their
        2^-16 grid by one float addition. The cast that follows is then exact on every backend. On a GPU
        too: the hardware's cast of the unrounded values (cvt.rn.satfinite.e5m2x2.f32, Triton 3.6)
        trained the record to NaN at step 2 on an H100 (2026-12-07, `record_kernel_bisect.py`)."""
        b = x.to(tl.int32, bitcast=True)
        b = (b + 0xFFFFF + ((b >> 21) & 1)) & -2097152
        return tl.where(tl.abs(x) < 6.103515625e-05, (x + 192.0) - 192.0, b.to(tl.float32, bitcast=True))

    @triton.jit
    def _base2(x):
        """x·log2(e): a natural exponent or logarithm in base-2 units."""
        return x * 1.4426950408889634

    @triton.jit
    def _sigmoid(z, shift, k2):
        """σ((z + shift)/d) with k2 = −log2(e)/d: one exponential and one reciprocal, base 2."""
        return _rcp(1.0 + _ex2((z + shift) * k2))

    @triton.jit
    def _sigmoid_pair(za, zb, shift, k2):
        """`_sigmoid` of two tiles with one reciprocal: 1/((1 + ea)(1 + eb)) times the other's factor. The
        exponentials are clamped at 2^63 so that the product stays finite (a sigmoid below 1e-19 either
        way): five special-function operations for two elements' σ and softmax terms, not six."""
        da = 1.0 + _ex2(tl.minimum((za + shift) * k2, 63.0))
        db = 1.0 + _ex2(tl.minimum((zb + shift) * k2, 63.0))
        r = _rcp(da * db)
        return db * r, da * r

    @triton.jit
    def _sweep_step(z_tile, v0, cols, live, shift, k2, V: tl.constexpr, HALF: tl.constexpr):
        """One step of either sweep: the two halves' columns (ia, ib), their masks and their σ, the
        logits loaded from the block's rows at v0 + cols and v0 + HALF + cols."""
        ia = v0 + cols
        ib = ia + HALF
        oka = live[:, None] & (ia < V)[None, :]
        okb = live[:, None] & (ib < V)[None, :]
        sa, sb = _sigmoid_pair(tl.load(z_tile + ia[None, :], mask=oka, other=0.0).to(tl.float32),
                               tl.load(z_tile + ib[None, :], mask=okb, other=0.0).to(tl.float32), shift, k2)
        return ia, ib, oka, okb, sa, sb

    @triton.jit
    def _term_loss(z_rows, live, t, w, lse, cap, shift, k2):
        """w·(lse − ẑ[t]) per row."""
        zt = tl.load(z_rows + t, mask=live, other=0.0).to(tl.float32)
        return w * (lse - cap * _sigmoid(zt, shift, k2))

    @triton.jit
    def _store_grad(G, GT, row_off, col_off_t, g, ok, g_mult, g_max, GRAD: tl.constexpr):
        """g at G + row_off (bf16, GRAD 1), or its e5m2 form there and at GT + col_off_t (GRAD 2)."""
        if GRAD == 1:
            tl.store(G + row_off, g.to(G.dtype.element_ty), mask=ok)
        else:
            q = _round_e5m2(tl.minimum(tl.maximum(g * g_mult, -g_max), g_max)).to(G.dtype.element_ty)
            tl.store(G + row_off, q, mask=ok)
            tl.store(GT + col_off_t, q, mask=ok)

    @triton.jit
    def _target_grad(Z, G, GT, rows, live, n, stride_z, t, t0, w0, t1, w1, t2, w2, t3, w3, tp, wp, total, lse2,
                     cap2, slope, shift, k2, g_mult, g_max, V: tl.constexpr, GRAD: tl.constexpr):
        """The gradient at column t of each row, with every target equal to t subtracted: the sweep
        writes (S·p)·σ′ alone, and this overwrites the (at most five) target columns a row has."""
        zt = tl.load(Z + rows * stride_z + t, mask=live, other=0.0).to(tl.float32)
        sig = _sigmoid(zt, shift, k2)
        hit = (tl.where(t0 == t, w0, 0.0) + tl.where(t1 == t, w1, 0.0) + tl.where(t2 == t, w2, 0.0)
               + tl.where(t3 == t, w3, 0.0) + tl.where(tp == t, wp, 0.0))
        g = (total * _ex2(cap2 * sig - lse2) - hit) * slope * sig * (1.0 - sig)
        _store_grad(G, GT, rows * V + t, t * n + rows, g, live, g_mult, g_max, GRAD)

    @triton.jit
    def _target_grads(Z, G, GT, rows, live, n, stride_z, t0, w0, t1, w1, t2, w2, t3, w3, tp, wp, total, lse2,
                      cap2, slope, shift, k2, g_mult, g_max, V: tl.constexpr, GRAD: tl.constexpr):
        """`_target_grad` at each of the row's five target columns (the four MTP terms' and the prefix's)."""
        _target_grad(Z, G, GT, rows, live, n, stride_z, t0, t0, w0, t1, w1, t2, w2, t3, w3, tp, wp, total, lse2,
                     cap2, slope, shift, k2, g_mult, g_max, V, GRAD)
        _target_grad(Z, G, GT, rows, live, n, stride_z, t1, t0, w0, t1, w1, t2, w2, t3, w3, tp, wp, total, lse2,
                     cap2, slope, shift, k2, g_mult, g_max, V, GRAD)
        _target_grad(Z, G, GT, rows, live, n, stride_z, t2, t0, w0, t1, w1, t2, w2, t3, w3, tp, wp, total, lse2,
                     cap2, slope, shift, k2, g_mult, g_max, V, GRAD)
        _target_grad(Z, G, GT, rows, live, n, stride_z, t3, t0, w0, t1, w1, t2, w2, t3, w3, tp, wp, total, lse2,
                     cap2, slope, shift, k2, g_mult, g_max, V, GRAD)
        _target_grad(Z, G, GT, rows, live, n, stride_z, tp, t0, w0, t1, w1, t2, w2, t3, w3, tp, wp, total, lse2,
                     cap2, slope, shift, k2, g_mult, g_max, V, GRAD)

    @triton.jit
    def _mtp_ce_kernel(Z, TN, PRE, W, PI, LOSS, STATS, G, GT, n, stride_z, cap, shift, inv_div, g_mult, g_max,
                       V: tl.constexpr, K: tl.constexpr, HAS_PREFIX: tl.constexpr, GRAD: tl.constexpr,
                       BM: tl.constexpr, BV: tl.constexpr):
        # int64 for the block's first row and whatever is addressed from it across the whole (n, V)
        # (n·V passes 2^31); int32 offsets inside the block keep the tiles' registers down
        row0 = tl.program_id(0).to(tl.int64) * BM
        r = tl.arange(0, BM)
        rows = row0 + r
        live = rows < n
        # a sweep step's columns as two halves, column c of one paired with c + HALF of the other
        HALF: tl.constexpr = BV // 2
        cols = tl.arange(0, HALF)
        z_tile = Z + row0 * stride_z + r[:, None] * stride_z
        # base 2: σ's exponent (z + a)·k2 and the softmax's 2^(cap2·σ − cap2) = exp(ẑ − c)
        k2, cap2 = _base2(-inv_div), _base2(cap)
        acc = tl.zeros((BM, HALF), tl.float32)
        for v0 in range(0, V, BV):
            ia, ib, oka, okb, sa, sb = _sweep_step(z_tile, v0, cols, live, shift, k2, V, HALF)
            acc += tl.where(oka, _ex2(cap2 * sa - cap2), 0.0) + tl.where(okb, _ex2(cap2 * sb - cap2), 0.0)
        lse = cap + tl.log(tl.where(live, tl.sum(acc, axis=1), 1.0))
        lse2 = _base2(lse)

        t0, w0, t1, w1, t2, w2, t3, w3, tp, wp = _terms(TN, PRE, W, PI, rows, live, n, K, HAS_PREFIX)
        z_rows = Z + rows * stride_z
        loss = (_term_loss(z_rows, live, t0, w0, lse, cap, shift, k2)
                + _term_loss(z_rows, live, t1, w1, lse, cap, shift, k2)
                + _term_loss(z_rows, live, t2, w2, lse, cap, shift, k2)
                + _term_loss(z_rows, live, t3, w3, lse, cap, shift, k2)
                + _term_loss(z_rows, live, tp, wp, lse, cap, shift, k2))
        tl.store(LOSS + rows, loss, mask=live)
        total = w0 + w1 + w2 + w3 + wp
        if GRAD == 2:  # the e5m2 pair is the two kernels' that follow: each row's lse and weight sum for them
            tl.store(STATS + rows, lse, mask=live)
            tl.store(STATS + n + rows, total, mask=live)
        if GRAD == 1:
            slope = cap * inv_div  # ∂ẑ/∂z = (c/d)·σ(1 − σ)
            s_tile = total[:, None] * slope
            g_tile = G + row0 * V + r[:, None] * V
            for v0 in range(0, V, BV):
                ia, ib, oka, okb, sa, sb = _sweep_step(z_tile, v0, cols, live, shift, k2, V, HALF)
                ga = s_tile * _ex2(cap2 * sa - lse2[:, None]) * sa * (1.0 - sa)
                gb = s_tile * _ex2(cap2 * sb - lse2[:, None]) * sb * (1.0 - sb)
                _store_grad(g_tile, GT, ia[None, :], 0, ga, oka, g_mult, g_max, 1)
                _store_grad(g_tile, GT, ib[None, :], 0, gb, okb, g_mult, g_max, 1)
            tl.debug_barrier()  # every thread's sweep stores land before the target columns' overwrite
            _target_grads(Z, G, GT, rows, live, n, stride_z, t0, w0, t1, w1, t2, w2, t3, w3, tp, wp, total, lse2,
                          cap2, slope, shift, k2, g_mult, g_max, V, 1)

    @triton.jit
    def _e5m2_pair_kernel(Z, STATS, G, GT, n, stride_z, cap, shift, inv_div, g_mult, g_max,
                          V: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr):
        """The e5m2 pair's (S·p)·σ′ over one tile of BM rows and BV columns, from the rows' lse and S
        that the sweeps wrote; the target columns are `_target_kernel`'s, launched after this."""
        row0 = tl.program_id(0).to(tl.int64) * BM
        v0 = tl.program_id(1) * BV  # a column: int32 (V < 2^31); v0·n is not, so its base is int64
        r = tl.arange(0, BM)
        rows = row0 + r
        live = rows < n
        HALF: tl.constexpr = BV // 2
        cols = tl.arange(0, HALF)
        k2, cap2 = _base2(-inv_div), _base2(cap)
        lse2 = _base2(tl.load(STATS + rows, mask=live, other=0.0))[:, None]
        s_tile = tl.load(STATS + n + rows, mask=live, other=0.0)[:, None] * (cap * inv_div)
        z_tile = Z + row0 * stride_z + r[:, None] * stride_z
        ia, ib, oka, okb, sa, sb = _sweep_step(z_tile, v0, cols, live, shift, k2, V, HALF)
        g_tile = G + row0 * V + r[:, None] * V
        gt_tile = GT + (row0 + v0.to(tl.int64) * n) + r[:, None]
        _store_grad(g_tile, gt_tile, ia[None, :], cols[None, :] * n,
                    s_tile * _ex2(cap2 * sa - lse2) * sa * (1.0 - sa), oka, g_mult, g_max, 2)
        _store_grad(g_tile, gt_tile, ib[None, :], (cols + HALF)[None, :] * n,
                    s_tile * _ex2(cap2 * sb - lse2) * sb * (1.0 - sb), okb, g_mult, g_max, 2)

    @triton.jit
    def _target_kernel(Z, TN, PRE, W, PI, STATS, G, GT, n, stride_z, cap, shift, inv_div, g_mult, g_max,
                       V: tl.constexpr, K: tl.constexpr, HAS_PREFIX: tl.constexpr, BM: tl.constexpr):
        """The e5m2 pair's target columns of BM rows, each with its targets' weights subtracted, over
        what `_e5m2_pair_kernel` wrote there."""
        rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
        live = rows < n
        k2, cap2 = _base2(-inv_div), _base2(cap)
        t0, w0, t1, w1, t2, w2, t3, w3, tp, wp = _terms(TN, PRE, W, PI, rows, live, n, K, HAS_PREFIX)
        total = w0 + w1 + w2 + w3 + wp
        lse2 = _base2(tl.load(STATS + rows, mask=live, other=0.0))
        _target_grads(Z, G, GT, rows, live, n, stride_z, t0, w0, t1, w1, t2, w2, t3, w3, tp, wp, total, lse2,
                      cap2, cap * inv_div, shift, k2, g_mult, g_max, V, 2)

    return _mtp_ce_kernel, _e5m2_pair_kernel, _target_kernel


def launch(z: Tensor, targets_next: Tensor, weights: Tensor, prefix_weight: Tensor, prefix: Tensor,
           has_prefix: bool, want_grad: bool, e5m2_mult: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row losses (n,) float32 and the gradient d loss_t / d z: without want_grad none ((0,)
    tensors); with e5m2_mult 0 in z's dtype (n, V); else e5m2(clamp(g·e5m2_mult)) as (n, V) and
    its transpose (V, n), both contiguous (the two layouts the head's two FP8 gradient products read)."""
    sweeps, pair, targets = _build()
    if weights.numel() > MAX_TERMS:
        raise ValueError(f"record_ce: at most {MAX_TERMS} MTP weights, got {weights.numel()}")
    if z.stride(-1) != 1:
        z = z.contiguous()
    n, V = z.shape
    cap, shift, divisor = SOFTCAP
    mode = 0 if not want_grad else (2 if e5m2_mult else 1)
    dtype = torch.float8_e5m2 if mode == 2 else z.dtype
    losses = torch.empty(n, dtype=torch.float32, device=z.device)
    grad = torch.empty((n, V) if mode else (0,), dtype=dtype, device=z.device)
    grad_t = torch.empty((V, n) if mode == 2 else (0,), dtype=dtype, device=z.device)
    if not n:
        return losses, grad, grad_t
    stats = torch.empty(2 * n if mode == 2 else 0, dtype=torch.float32, device=z.device)
    scalars = (n, z.stride(0), cap, shift, 1.0 / divisor, e5m2_mult, E5M2_MAX)
    tables = (targets_next.contiguous(), prefix, weights.contiguous(), prefix_weight)
    rows, cols, warps = TILES[0 if mode == 2 else mode]
    sweeps[(triton.cdiv(n, rows),)](z, *tables, losses, stats, grad, grad_t, *scalars, V=V, K=weights.numel(),
                                    HAS_PREFIX=has_prefix, GRAD=mode, BM=rows, BV=cols, num_warps=warps)
    if mode == 2:  # the pair's tiles, then its target columns over them (the stream orders the launches)
        rows, cols, warps = TILES[2]
        pair[(triton.cdiv(n, rows), triton.cdiv(V, cols))](z, stats, grad, grad_t, *scalars, V=V, BM=rows, BV=cols,
                                                            num_warps=warps)
        targets[(triton.cdiv(n, TARGET_ROWS),)](z, *tables, stats, grad, grad_t, *scalars, V=V, K=weights.numel(),
                                                HAS_PREFIX=has_prefix, BM=TARGET_ROWS, num_warps=4)
    return losses, grad, grad_t


def compile_offline(grad: int, pair: bool = False):
    """Compile a kernel for sm_90 at the record's vocabulary without a GPU (Triton's bundled ptxas): the
    sweeps with gradient form `grad` (0 none, 1 bf16, 2 the e5m2 pair's row statistics), or with `pair`
    the e5m2 pair's tile kernel; the CompiledKernel."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sweeps, tiles, _ = _build()
    kernel = tiles if pair else sweeps
    rows, cols, warps = TILES[2 if pair else (0 if grad == 2 else grad)]
    consts = dict(V=50304, BM=rows, BV=cols) if pair else dict(V=50304, K=3, HAS_PREFIX=True, GRAD=grad,
                                                               BM=rows, BV=cols)
    types = {"Z": "*bf16", "TN": "*i64", "PRE": "*i64", "G": "*bf16" if grad == 1 else "*fp8e5",
             "GT": "*fp8e5", "n": "i32", "stride_z": "i32"}
    scalars = ("cap", "shift", "inv_div", "g_mult", "g_max")
    signature = {a: "constexpr" if a in consts else ("fp32" if a in scalars else types.get(a, "*fp32"))
                 for a in kernel.arg_names}
    # the launch's specialisations at the record's shapes: 16-byte aligned tensors, n and the row
    # stride multiples of 16
    aligned = [a for a in kernel.arg_names if signature[a].startswith("*")] + ["n", "stride_z"]
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    return triton.compile(ASTSource(kernel, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps})


@torch.library.custom_op("speedrun::record_mtp_ce", mutates_args=())
def record_mtp_ce(z: Tensor, targets_next: Tensor, weights: Tensor, prefix_weight: Tensor, prefix: Tensor,
                  has_prefix: bool, want_grad: bool, e5m2_mult: float) -> tuple[Tensor, Tensor, Tensor]:
    """`launch` as an operator: `torch.compile(fullgraph=True)` keeps it whole."""
    return launch(z, targets_next, weights, prefix_weight, prefix, has_prefix, want_grad, e5m2_mult)


@record_mtp_ce.register_fake
def _(z, targets_next, weights, prefix_weight, prefix, has_prefix, want_grad, e5m2_mult):
    n, V = z.shape
    pair = want_grad and e5m2_mult
    dtype = torch.float8_e5m2 if pair else z.dtype
    grad = z.new_empty((n, V) if want_grad else (0,), dtype=dtype)
    return z.new_empty((n,), dtype=torch.float32), grad, z.new_empty((V, n) if pair else (0,), dtype=dtype)


def _setup_context(ctx, inputs, output):
    _, grad, grad_t = output
    ctx.mark_non_differentiable(grad, grad_t)
    ctx.save_for_backward(grad)
    ctx.want_grad, ctx.e5m2 = inputs[-2], bool(inputs[-1])


def _backward(ctx, g_losses, _g_grad, _g_grad_t):
    """d total / d z: the saved gradient times each row's upstream gradient, in place (module docstring)."""
    if not ctx.want_grad or ctx.e5m2:
        raise RuntimeError("record_mtp_ce: no gradient of z was made (no grad mode, z did not require grad, "
                           "or only its e5m2 form)")
    (grad,) = ctx.saved_tensors
    return grad.mul_(g_losses.unsqueeze(1)), None, None, None, None, None, None, None


record_mtp_ce.register_autograd(_backward, setup_context=_setup_context)


def _loss_arguments(dev: torch.device, mtp_weights, prefix_weight, prefix: Tensor) -> tuple:
    """(weights, π, prefix table, has_prefix) as the operator takes them."""
    w = torch.as_tensor(mtp_weights, dtype=torch.float32, device=dev)
    has_prefix = isinstance(prefix_weight, Tensor) or bool(prefix_weight)
    pi = torch.as_tensor(prefix_weight, dtype=torch.float32, device=dev).reshape(1)
    return w, pi, prefix.to(device=dev, dtype=torch.int64), has_prefix


def fused_training_loss(z: Tensor, targets_next: Tensor, mtp_weights: Sequence[float] | Tensor,
                        prefix_weight: float | Tensor, prefix: Tensor) -> Tensor:
    """`record_loss.record_training_loss` through the kernel: the same arguments, the same float32 sum."""
    w, pi, table, has_prefix = _loss_arguments(z.device, mtp_weights, prefix_weight, prefix)
    want_grad = torch.is_grad_enabled() and z.requires_grad
    losses, _, _ = torch.ops.speedrun.record_mtp_ce(z, targets_next.long(), w, pi, table, has_prefix, want_grad, 0.0)
    return losses.sum()


class _Fp8HeadLoss(torch.autograd.Function):
    """`record_fp8.fp8_head` then the loss, the logit gradient made by the kernel as the e5m2 pair.

    The reference (`record_fp8._Fp8Head`) stores e5m2(g / grad_s) with g the incoming gradient,
    grad_scale·∂loss/∂z, and grad_s = grad_scale·u (u = `head_grad_factor`): the stored value is
    e5m2(∂loss/∂z / u) whatever grad_scale is. The kernel writes exactly that in the forward; the
    backward's upstream scalar ĝ (grad_scale in training) scales the two products by ĝ·u, so the
    gradient is exact for any upstream value (only its saturation assumes ĝ = grad_scale)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, targets_next: Tensor, weights: Tensor, pi: Tensor, table: Tensor,
                has_prefix: bool, cfg: Fp8Config, product: Product) -> Tensor:
        x_f8, w_f8 = head_quantize_input(x, cfg), head_quantize_weight(w, cfg)
        z = head_forward(x_f8, w_f8, cfg, product)
        losses, g_f8, g_f8_t = torch.ops.speedrun.record_mtp_ce(z, targets_next, weights, pi, table, has_prefix,
                                                                True, 1.0 / cfg.head_grad_factor)
        ctx.save_for_backward(x_f8, w_f8, g_f8, g_f8_t)
        ctx.cfg, ctx.product = cfg, product
        return losses.sum()

    @staticmethod
    def backward(ctx, g: Tensor):
        x_f8, w_f8, g_f8, g_f8_t = ctx.saved_tensors
        grad_s = g.float() * ctx.cfg.head_grad_factor  # the stored gradient's scale: ĝ·u
        grad_x = head_grad_x(g_f8, w_f8, grad_s, ctx.cfg, ctx.product)
        # g_f8_t.T: the product reads its transpose, which the kernel wrote contiguous
        grad_w = head_grad_w(x_f8, g_f8_t.T, grad_s, ctx.cfg, ctx.product)
        return grad_x, grad_w, None, None, None, None, None, None, None


def fp8_head_training_loss(h: Tensor, lm_head: Tensor, targets_next: Tensor, mtp_weights: Sequence[float] | Tensor,
                           prefix_weight: float | Tensor, prefix: Tensor, cfg: Fp8Config = RECORD_FP8,
                           product: Product = reference_product) -> Tensor:
    """`record_training_loss(fp8_head(h, lm_head, ...), ...)` (`RecordGPT.head_loss`) through the
    kernel, whose gradient goes to the head's FP8 products as e5m2 without a bf16 (n, V) in between."""
    w, pi, table, has_prefix = _loss_arguments(h.device, mtp_weights, prefix_weight, prefix)
    return _Fp8HeadLoss.apply(h, lm_head, targets_next.long(), w, pi, table, has_prefix, cfg, product)
