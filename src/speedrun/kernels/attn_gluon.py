"""The record's attention, forward and backward, as Hopper kernels of its own in Gluon, on FlexAttention's
block lists.

Why: on a power-capped H200 the step's time is its energy over the cap, and FlexAttention spends 3.2-3.3
J per TFLOP, 2.7-2.9 times a bf16 product's (docs/performance.md, "Where the step's energy goes"). These
kernels spend 2.2-2.7 at the long windows and took 10 ms and 5-7 J from the step (docs/performance.md,
"The attention's own kernels"); `attention.backend=auto` picks them on Hopper. FlexAttention stays the
path elsewhere, and the GPU tests hold these kernels to it and to the dense reference.

What they compute: FlexAttention's attention with `attention.flex_block_mask`'s masks, exactly as the model
calls it. Per 64-row query block of one head, the key blocks of its lists: first the partial blocks (the
mask function, causal and same document, applied inside the tile: `docs[q] == docs[k] and q >= k`), then
the full blocks (no mask). The lists carry the window, so the kernels never see it. The forward returns o
(bfloat16) and the log-sum-exp (natural log, float32, per head and row: what `flex_attention(...,
return_lse=True)` returns); the backward dq, dk, dv by FlexAttention's formulas and roundings.

How (one program per 64-row block and head, one warpgroup, no warp specialisation):
- Q comes once by TMA; K and V tiles by TMA into a ring of STAGES slots, each slot's load issued as soon
  as the tile STAGES earlier in the list is done (the lists are walked in the same order by the loads and
  the products, so a slot's index and mbarrier parity follow from the tile's position);
- S = Q Kᵀ on wgmma (64 x 64 x 128; Q loaded once from shared memory into registers as the A operand,
  `_a_operand`, so each product reads only K from shared memory), scaled by scale·log2(e), masked on
  partial tiles; the online softmax in registers in base 2 (exp2); P rounded to bfloat16 (as FlexAttention
  rounds it) and fed to the second wgmma from registers (its accumulator layout is the A operand's);
- O = diag(1/l) Σ P V; stored through Q's shared buffer (free after the last QKᵀ) by TMA;
- the backward in two kernels with no atomics: dQ per query block on the same walk (delta = rowsum(dO·O)
  computed there first; Q in registers as in the forward), dK and dV per key block on the block mask's
  query lists (each query tile's lse, delta and document ids staged through shared memory and read back
  only where used);
- the three walk their lists through one function (`_walk`), each with its own tile function (`_tile`,
  `_dq_tile`, `_dkdv_tile`) and its own loop-carried values. `scripts/attn_gluon_ptx.py` shows that a
  refactor leaves the PTX as it was.
Two or more programs share an SM (82-115 KB of shared memory each with two stages), so one's softmax runs
while another's products do.

Each kernel is the one variant that measured best against its alternatives, all with the same bits out
(docs/performance.md): Q in registers in the forward (2-6% less time and 1-7% less energy a call, 38a67e2)
and in dQ (223-235 registers, no spills; the backward 1.2-3.4% faster, 0d63ee6; with dO in registers too
dQ spills under Triton 3.9, 79c3465 and 0d63ee6); dK/dV's per-tile values through shared memory (no spill
under Triton 3.6 where registers spilled 32 bytes; the backward 2.6-5.5% faster, 866abcc); the document
ids as int32 where the largest fits (`attention.narrow_ids`: fewer registers; the forward 0.7-1.8% and the
backward 1.2-3.7% faster, 0d63ee6), int64 otherwise. A forward that issues the next tile's QKᵀ before this
tile's PV (FlashAttention-3's overlap within a warpgroup) measured slower and spent more energy (a7ed907).

The row index of a (token, head) in q, k, v and o is `token + head * head_rows` and its first column
`head * head_cols`: (1, H, T, D) views of (1, T, H, D) tensors (the model's) are (T, H·D) with
head_rows 0, contiguous (1, H, T, D) tensors are (H·T, D) with head_cols 0. Triton is imported on first
use (`_build`); importing this module needs only torch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from speedrun.kernels import relu2_gluon

BLOCK = 64  # rows of a query block and of a key block: the 64-token block mask's granularity
# The launchers' defaults for callers that pass none (the model's): STAGES, the K/V (or Q/dO) ring's depth
# (the benches also time 3); num_warps, one warpgroup.
CONFIG = {"STAGES": 2, "num_warps": 4}
LN2 = math.log(2.0)

_KERNEL = None
gluon = gl = tma = mbarrier = fence_async_shared = warpgroup_mma = warpgroup_mma_wait = tma_load = tma_store = None
_kv_block = _issue_kv = _tile = _ring = _load_pair = _store_tile = _visible = _dq_tile = _dkdv_tile = _load_one = _row_dot = None
_fwd_kernel = _dq_kernel = _dkdv_kernel = _walk_start = _wait_slot = _program = None
_walk = _a_operand = _mma_layout = None


def available() -> bool:
    """Whether Triton's Gluon with its Hopper support imports here."""
    return relu2_gluon.defines(_build)


def _build():
    """Import Triton/Gluon and define the kernel (once); the jit functions find each other and the Gluon
    modules through this module's globals."""
    global _KERNEL, gluon, gl, tma, mbarrier, fence_async_shared, warpgroup_mma, warpgroup_mma_wait, tma_load, tma_store
    global _kv_block, _issue_kv, _walk, _tile, _ring, _load_pair, _store_tile, _visible, _dq_tile, _dkdv_tile, _load_one, _row_dot
    global _fwd_kernel, _dq_kernel, _dkdv_kernel, _walk_start, _wait_slot, _program
    global _a_operand, _mma_layout
    if _KERNEL is not None:
        return _KERNEL
    from triton.experimental import gluon as _gluon
    from triton.experimental.gluon import language as _gl
    from triton.experimental.gluon.language.nvidia import hopper as _hopper

    gluon, gl = _gluon, _gl
    tma, mbarrier, fence_async_shared = _hopper.tma, _hopper.mbarrier, _hopper.fence_async_shared
    warpgroup_mma, warpgroup_mma_wait = _hopper.warpgroup_mma, _hopper.warpgroup_mma_wait
    tma_load, tma_store = relu2_gluon.tma_copies(tma)

    @gluon.constexpr_function
    def _mma_layout(num_warps, n):
        """The wgmma accumulator layout of tiles n columns wide, 16 rows a warp (a warpgroup's 64 rows)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])

    @gluon.jit
    def _kv_block(t, n_p, row_off, kv_idx_ptr, fkv_idx_ptr):
        """The key block of the t-th tile of a query block's walk: its partial list, then its full list."""
        if t < n_p:
            kb = gl.load(kv_idx_ptr + row_off + t)
        else:
            kb = gl.load(fkv_idx_ptr + row_off + (t - n_p))
        return kb

    @gluon.jit
    def _issue_kv(t, n_p, n, row_off, idx_ptr, fidx_ptr, a_desc, b_desc, a_bufs, b_bufs, ready, head_row, col):
        """TMA loads of the t-th tile of a block's walk (its partial list, then its full list: `_kv_block`)
        into ring slot t % STAGES, one tile of a_desc and one of b_desc (K and V; in dK/dV's walk Q and dO);
        nothing past the walk's end."""
        STAGES: gl.constexpr = a_bufs.shape[0]
        BN: gl.constexpr = a_bufs.shape[1]
        live = t < n
        kb = _kv_block(gl.minimum(t, n - 1), n_p, row_off, idx_ptr, fidx_ptr)
        s = t % STAGES
        bar = ready.index(s)
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=live)
        tma_load(a_desc, [head_row + kb * BN, col], bar, a_bufs.index(s), pred=live)
        tma_load(b_desc, [head_row + kb * BN, col], bar, b_bufs.index(s), pred=live)

    @gluon.jit
    def _walk_start(blk, nb, num_ptr, idx_ptr, fnum_ptr, fidx_ptr, a_desc, b_desc, a_bufs, b_bufs, ready, head_row,
                    col):
        """Block blk's walk: (n_p partial tiles, n in all, its lists' row offset), with the loads of its first
        STAGES tiles issued."""
        STAGES: gl.constexpr = a_bufs.shape[0]
        n_p = gl.load(num_ptr + blk)
        n = n_p + gl.load(fnum_ptr + blk)
        row_off = blk * nb
        for t in gl.static_range(STAGES):
            _issue_kv(t, n_p, n, row_off, idx_ptr, fidx_ptr, a_desc, b_desc, a_bufs, b_bufs, ready, head_row, col)
        return n_p, n, row_off

    @gluon.jit
    def _walk(tile: gl.constexpr, acc, ctx, n_p, n, row_off, idx_ptr, fidx_ptr, a_desc, b_desc, a_bufs, b_bufs,
              ready, head_row, col):
        """The rest of a walk `_walk_start` began, the same in all three kernels: per tile, its partial list
        then its full list, wait for its ring slot, acc = tile(a tile, b tile, acc, ctx, the tile's block,
        MASKED: a partial tile), then issue the loads of the tile STAGES ahead into the slot; the last acc."""
        STAGES: gl.constexpr = a_bufs.shape[0]
        for t in range(n_p):
            blk = gl.load(idx_ptr + row_off + t)
            s = _wait_slot(ready, t)
            acc = tile(a_bufs.index(s), b_bufs.index(s), acc, ctx, blk, True)
            _issue_kv(t + STAGES, n_p, n, row_off, idx_ptr, fidx_ptr, a_desc, b_desc, a_bufs, b_bufs, ready,
                      head_row, col)
        for t in range(n_p, n):
            blk = gl.load(fidx_ptr + row_off + (t - n_p))
            s = _wait_slot(ready, t)
            acc = tile(a_bufs.index(s), b_bufs.index(s), acc, ctx, blk, False)
            _issue_kv(t + STAGES, n_p, n, row_off, idx_ptr, fidx_ptr, a_desc, b_desc, a_bufs, b_bufs, ready,
                      head_row, col)
        return acc

    @gluon.jit
    def _program(head_rows, head_cols):
        """This program's block (program_id 0) and head (program_id 1), and the head's first row and column
        in the rows views (module docstring)."""
        blk = gl.program_id(0)
        h = gl.program_id(1)
        return blk, h, h * head_rows, h * head_cols

    @gluon.jit
    def _wait_slot(ready, t):
        """The ring slot of the walk's t-th tile, once its loads have landed."""
        STAGES: gl.constexpr = ready.shape[0]
        s = t % STAGES
        mbarrier.wait(ready.index(s), (t // STAGES) & 1)
        return s

    @gluon.jit
    def _a_operand(smem, acc_layout: gl.constexpr):
        """A 64 x D tile in shared memory loaded once into registers as the A operand of products into
        acc_layout (a product then reads only B from shared memory)."""
        return smem.load(gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2))

    @gluon.jit
    def _ring(a_desc, STAGES: gl.constexpr):
        """Two rings of STAGES 64 x D tiles (a_desc's layout) and their `ready` barriers, initialised."""
        a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES] + a_desc.block_type.shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES] + a_desc.block_type.shape, a_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        return a_bufs, b_bufs, ready

    @gluon.jit
    def _load_pair(a_desc, b_desc, row, col):
        """One 64 x D tile of a_desc and one of b_desc at (row, col) into new shared buffers (one barrier,
        returned armed: wait on it with parity 0)."""
        a_smem = gl.allocate_shared_memory(gl.bfloat16, a_desc.block_type.shape, a_desc.layout)
        b_smem = gl.allocate_shared_memory(gl.bfloat16, a_desc.block_type.shape, a_desc.layout)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        fence_async_shared()
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma_load(a_desc, [row, col], bar, a_smem)
        tma_load(b_desc, [row, col], bar, b_smem)
        return a_smem, b_smem, bar

    @gluon.jit
    def _load_one(desc, row, col):
        """One 64 x D tile of desc at (row, col) into a new shared buffer; its barrier (wait with parity 0)."""
        smem = gl.allocate_shared_memory(gl.bfloat16, desc.block_type.shape, desc.layout)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        fence_async_shared()
        mbarrier.expect(bar, desc.block_type.nbytes)
        tma_load(desc, [row, col], bar, smem)
        return smem, bar

    @gluon.jit
    def _row_dot(a_smem, b_smem, out_layout: gl.constexpr, num_warps: gl.constexpr):
        """Per row of two 64 x D bfloat16 tiles in shared memory, the float32 sum of their product."""
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        a = a_smem.load(layout).to(gl.float32)
        b = b_smem.load(layout).to(gl.float32)
        return gl.convert_layout(gl.sum(a * b, axis=1), out_layout)

    @gluon.jit
    def _store_tile(x, smem, desc, row, col):
        """x (registers) rounded to bfloat16 into smem, then TMA-stored at (row, col); waits for the store."""
        smem.store(x.to(gl.bfloat16))
        fence_async_shared()
        tma_store(desc, [row, col], smem)
        tma.store_wait(0)

    @gluon.jit
    def _visible(rows_q, rows_k, docs_ptr):
        """The mask function on a (q, k) tile: query rows_q may see key rows_k (causal, same document)."""
        doc_q = gl.load(docs_ptr + rows_q)
        doc_k = gl.load(docs_ptr + rows_k)
        return (rows_q[:, None] >= rows_k[None, :]) & (doc_q[:, None] == doc_k[None, :])

    @gluon.jit
    def _tile(k_buf, v_buf, state, ctx, kb, MASKED: gl.constexpr):
        """One key tile of the online softmax (`_walk`'s tile): state (m, l, acc) updated in base 2 (m and S
        carry log2(e)); ctx (q_op, qk_scale, rows, doc_q, docs_ptr), q_op Q's tile in registers
        (`_a_operand`)."""
        m_i, l_i, acc = state
        q_op, qk_scale, rows, doc_q, docs_ptr = ctx
        s_layout: gl.constexpr = rows.type.layout.parent
        o_layout: gl.constexpr = acc.type.layout
        BM: gl.constexpr = q_op.shape[0]
        BN: gl.constexpr = k_buf.shape[0]
        zero = gl.zeros([BM, BN], gl.float32, s_layout)
        qk = warpgroup_mma(q_op, k_buf.permute((1, 0)), zero, use_acc=False) * qk_scale
        if MASKED:
            cols = kb * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
            doc_k = gl.load(docs_ptr + cols)
            ok = (rows[:, None] >= cols[None, :]) & (doc_q[:, None] == doc_k[None, :])
            qk = gl.where(ok, qk, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(qk, axis=1))
        m_use = gl.where(m_new == -float("inf"), 0.0, m_new)  # a row with nothing visible yet: no NaN
        p = gl.exp2(qk - m_use[:, None])
        alpha = gl.exp2(m_i - m_use)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p16 = gl.convert_layout(p.to(gl.bfloat16), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
        acc = warpgroup_mma(p16, v_buf, acc)
        return m_new, l_i, acc

    @gluon.jit
    def _attn_fwd_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, docs_ptr, kv_num_ptr, kv_idx_ptr,
                         fkv_num_ptr, fkv_idx_ptr, T, nbk, head_rows, head_cols, qk_scale,
                         STAGES: gl.constexpr, num_warps: gl.constexpr):
        """o and lse of query block program_id(0), head program_id(1) (module docstring)."""
        BM: gl.constexpr = q_desc.block_type.shape[0]
        D: gl.constexpr = q_desc.block_type.shape[1]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        s_layout: gl.constexpr = _mma_layout(num_warps, BN)
        o_layout: gl.constexpr = _mma_layout(num_warps, D)
        pid_m, h, head_row, col = _program(head_rows, head_cols)
        q_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, D], q_desc.layout)
        k_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, D], k_desc.layout)
        v_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        fence_async_shared()
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma_load(q_desc, [head_row + pid_m * BM, col], q_bar, q_smem)
        n_p, n, row_off = _walk_start(pid_m, nbk, kv_num_ptr, kv_idx_ptr, fkv_num_ptr, fkv_idx_ptr, k_desc, v_desc,
                                      k_bufs, v_bufs, ready, head_row, col)

        rows = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
        doc_q = gl.load(docs_ptr + rows)
        m_i = gl.full([BM], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
        acc = gl.zeros([BM, D], gl.float32, o_layout)
        mbarrier.wait(q_bar, 0)
        q_op = _a_operand(q_smem, s_layout)
        m_i, l_i, acc = _walk(_tile, (m_i, l_i, acc), (q_op, qk_scale, rows, doc_q, docs_ptr), n_p, n, row_off,
                              kv_idx_ptr, fkv_idx_ptr, k_desc, v_desc, k_bufs, v_bufs, ready, head_row, col)

        o = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
        q_smem.store(o.to(gl.bfloat16))  # every QKᵀ is done (the products are synchronous)
        fence_async_shared()
        tma_store(o_desc, [head_row + pid_m * BM, col], q_smem)
        gl.store(lse_ptr + h * T + rows, (m_i + gl.log2(l_i)) * 0.6931471805599453)
        tma.store_wait(0)

    @gluon.jit
    def _dq_tile(k_buf, v_buf, dq, ctx, kb, MASKED: gl.constexpr):
        """dQ += dS K over one key tile (`_walk`'s tile; ctx (q_op, do_smem, lse2, delta, qk_scale, rows,
        docs_ptr), q_op Q's tile in registers), with P = exp2(S - lse) and dS = P (dO Vᵀ - delta) recomputed
        (dS rounded to bfloat16 for the product, as FlexAttention's backward rounds it; dQ's scale later).
        S and dO Vᵀ are issued together (asynchronous), the mask computed while they run."""
        q_op, do_smem, lse2, delta, qk_scale, rows, docs_ptr = ctx
        s_layout: gl.constexpr = rows.type.layout.parent
        o_layout: gl.constexpr = dq.type.layout
        BM: gl.constexpr = q_op.shape[0]
        BN: gl.constexpr = k_buf.shape[0]
        zero = gl.zeros([BM, BN], gl.float32, s_layout)
        qk = warpgroup_mma(q_op, k_buf.permute((1, 0)), zero, use_acc=False, is_async=True)
        dp = warpgroup_mma(do_smem, v_buf.permute((1, 0)), zero, use_acc=False, is_async=True)
        if MASKED:
            cols = kb * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
            ok = _visible(rows, cols, docs_ptr)
        qk = warpgroup_mma_wait(1, deps=(qk, )) * qk_scale
        if MASKED:
            qk = gl.where(ok, qk, -float("inf"))
        p = gl.exp2(qk - lse2[:, None])
        dp = warpgroup_mma_wait(0, deps=(dp, ))
        ds = gl.convert_layout((p * (dp - delta[:, None])).to(gl.bfloat16),
                               gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
        return warpgroup_mma(ds, k_buf, dq)

    @gluon.jit
    def _attn_dq_kernel(q_desc, k_desc, v_desc, do_desc, o_desc, dq_desc, lse_ptr, delta_ptr, docs_ptr, kv_num_ptr,
                        kv_idx_ptr, fkv_num_ptr, fkv_idx_ptr, T, nbk, head_rows, head_cols, qk_scale, scale,
                        STAGES: gl.constexpr, num_warps: gl.constexpr):
        """dQ of query block program_id(0), head program_id(1): the forward's walk of the key lists; first
        delta = rowsum(dO · O) of the block, kept in registers and written for the dK/dV kernel. Q in
        registers as QKᵀ's A operand (`_a_operand`), as in the forward."""
        BM: gl.constexpr = q_desc.block_type.shape[0]
        D: gl.constexpr = q_desc.block_type.shape[1]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        s_layout: gl.constexpr = _mma_layout(num_warps, BN)
        o_layout: gl.constexpr = _mma_layout(num_warps, D)
        pid_m, h, head_row, col = _program(head_rows, head_cols)
        k_bufs, v_bufs, ready = _ring(k_desc, STAGES)
        q_smem, do_smem, q_bar = _load_pair(q_desc, do_desc, head_row + pid_m * BM, col)
        o_smem, o_bar = _load_one(o_desc, head_row + pid_m * BM, col)
        n_p, n, row_off = _walk_start(pid_m, nbk, kv_num_ptr, kv_idx_ptr, fkv_num_ptr, fkv_idx_ptr, k_desc, v_desc,
                                      k_bufs, v_bufs, ready, head_row, col)
        rows = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
        lse2 = gl.load(lse_ptr + h * T + rows) * 1.4426950408889634
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(o_bar, 0)
        delta = _row_dot(do_smem, o_smem, gl.SliceLayout(1, s_layout), num_warps)
        gl.store(delta_ptr + h * T + rows, delta)  # for the dK/dV kernel, launched after this one
        q_op = _a_operand(q_smem, s_layout)
        dq = _walk(_dq_tile, gl.zeros([BM, D], gl.float32, o_layout),
                   (q_op, do_smem, lse2, delta, qk_scale, rows, docs_ptr), n_p, n, row_off, kv_idx_ptr,
                   fkv_idx_ptr, k_desc, v_desc, k_bufs, v_bufs, ready, head_row, col)
        _store_tile(dq * scale, o_smem, dq_desc, head_row + pid_m * BM, col)

    @gluon.jit
    def _dkdv_tile(q_buf, do_buf, acc, ctx, qb, MASKED: gl.constexpr):
        """dV += Pᵀ dO and dK += dSᵀ Q over one query tile (`_walk`'s tile; acc (dk, dv); ctx (k_smem, v_smem,
        qk_scale, rows, lse_ptr, delta_ptr, docs_ptr, lse_smem, delta_smem, doc_smem), lse_ptr and delta_ptr at
        the head's first row), Sᵀ = K Qᵀ and dPᵀ = V dOᵀ recomputed in the key block's rows (Pᵀ and dSᵀ
        rounded to bfloat16 for the products). Sᵀ and dPᵀ are issued together; while they run the tile's 64
        lse, delta (and query doc ids) are loaded one a thread into shared memory, each read back in the
        products' layout only where it is used (held in registers from the load, those values cost each
        thread 16 registers across the products, and Triton 3.6 spilled). dV's product runs while dSᵀ is
        formed."""
        dk, dv = acc
        k_smem, v_smem, qk_scale, rows, lse_ptr, delta_ptr, docs_ptr, lse_smem, delta_smem, doc_smem = ctx
        s_layout: gl.constexpr = rows.type.layout.parent
        o_layout: gl.constexpr = dk.type.layout
        BN: gl.constexpr = k_smem.shape[0]
        BM: gl.constexpr = q_buf.shape[0]
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
        zero = gl.zeros([BN, BM], gl.float32, s_layout)
        st = warpgroup_mma(k_smem, q_buf.permute((1, 0)), zero, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_smem, do_buf.permute((1, 0)), zero, use_acc=False, is_async=True)
        one_each = qb * BM + gl.arange(0, BM, layout=gl.BlockedLayout([1], [32], [gl.num_warps()], [0]))
        lse_smem.store(gl.load(lse_ptr + one_each))  # natural log: the log2(e) product stays at its use
        delta_smem.store(gl.load(delta_ptr + one_each))
        if MASKED:
            doc_smem.store(gl.load(docs_ptr + one_each))
        st = warpgroup_mma_wait(1, deps=(st, )) * qk_scale
        if MASKED:  # `_visible` on a (k, q) tile, its causal test as column - qb·BM >= row - qb·BM
            doc_k = gl.load(docs_ptr + rows)
            doc_q = doc_smem.load(col_layout)
            ok = (gl.arange(0, BM, layout=col_layout)[None, :] >= (rows - qb * BM)[:, None]) & (
                doc_q[None, :] == doc_k[:, None])
            st = gl.where(ok, st, -float("inf"))
        lse2 = lse_smem.load(col_layout) * 1.4426950408889634
        pt = gl.exp2(st - lse2[None, :])
        dv = warpgroup_mma(gl.convert_layout(pt.to(gl.bfloat16), a_layout), do_buf, dv, is_async=True)
        dpt = warpgroup_mma_wait(1, deps=(dpt, ))
        delta = delta_smem.load(col_layout)
        dst = gl.convert_layout((pt * (dpt - delta[None, :])).to(gl.bfloat16), a_layout)
        dk = warpgroup_mma(dst, q_buf, dk, is_async=True)
        dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
        return dk, dv

    @gluon.jit
    def _attn_dkdv_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_ptr, delta_ptr, docs_ptr,
                          q_num_ptr, q_idx_ptr, fq_num_ptr, fq_idx_ptr, T, nbq, head_rows, head_cols, qk_scale,
                          scale, STAGES: gl.constexpr, num_warps: gl.constexpr):
        """dK and dV of key block program_id(0), head program_id(1): a walk of the query blocks that see it
        (the block mask's q lists: partial, then full), Q and dO through the ring, each tile's lse, delta
        and ids through shared memory (`_dkdv_tile`)."""
        BN: gl.constexpr = k_desc.block_type.shape[0]
        D: gl.constexpr = k_desc.block_type.shape[1]
        BM: gl.constexpr = q_desc.block_type.shape[0]
        s_layout: gl.constexpr = _mma_layout(num_warps, BM)
        o_layout: gl.constexpr = _mma_layout(num_warps, D)
        pid_n, h, head_row, col = _program(head_rows, head_cols)
        q_bufs, do_bufs, ready = _ring(q_desc, STAGES)
        k_smem, v_smem, kv_bar = _load_pair(k_desc, v_desc, head_row + pid_n * BN, col)
        n_p, n, row_off = _walk_start(pid_n, nbq, q_num_ptr, q_idx_ptr, fq_num_ptr, fq_idx_ptr, q_desc, do_desc,
                                      q_bufs, do_bufs, ready, head_row, col)
        rows = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, s_layout))
        dk = gl.zeros([BN, D], gl.float32, o_layout)
        dv = gl.zeros([BN, D], gl.float32, o_layout)
        vec_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        ctx = (k_smem, v_smem, qk_scale, rows, lse_ptr + h * T, delta_ptr + h * T, docs_ptr,
               gl.allocate_shared_memory(gl.float32, [BM], vec_layout),
               gl.allocate_shared_memory(gl.float32, [BM], vec_layout),
               gl.allocate_shared_memory(docs_ptr.dtype.element_ty, [BM], vec_layout))
        mbarrier.wait(kv_bar, 0)
        dk, dv = _walk(_dkdv_tile, (dk, dv), ctx, n_p, n, row_off, q_idx_ptr, fq_idx_ptr, q_desc, do_desc,
                       q_bufs, do_bufs, ready, head_row, col)
        _store_tile(dv, v_smem, dv_desc, head_row + pid_n * BN, col)
        _store_tile(dk * scale, k_smem, dk_desc, head_row + pid_n * BN, col)

    # module globals too: `triton_bundle` finds a speedrun module's kernels there for the portable cache
    _fwd_kernel, _dq_kernel, _dkdv_kernel = _attn_fwd_kernel, _attn_dq_kernel, _attn_dkdv_kernel
    _KERNEL = {"fwd": _attn_fwd_kernel, "dq": _attn_dq_kernel, "dkdv": _attn_dkdv_kernel}
    return _KERNEL


def config(cfg: dict | None = None) -> dict:
    """CONFIG with `cfg`'s entries over it."""
    return {**CONFIG, **(cfg or {})}


def _rows_view(x: Tensor, name: str) -> tuple[Tensor, int, int]:
    """A (1, H, T, D) tensor as the 2-D (rows, columns) view the kernel's TMA reads, with its per-head row
    and column offsets (module docstring); ValueError naming `name` where no such view exists."""
    if x.dim() != 4 or x.shape[0] != 1:
        raise ValueError(f"attn_gluon: {name} must be (1, heads, tokens, head_dim), got {tuple(x.shape)}")
    _, h, t, d = x.shape
    _, sh, st, sd = x.stride()
    if sd != 1 or x.dtype != torch.bfloat16:
        raise ValueError(f"attn_gluon: {name} must be bfloat16 with a contiguous head_dim")
    if sh == d and st % 8 == 0:  # (T, H, D) memory: the model's
        return x.as_strided((t, h * d), (st, 1)), 0, d
    if st == d and sh == t * d:  # (H, T, D) memory
        return x.as_strided((h * t, d), (d, 1)), t, 0
    raise ValueError(f"attn_gluon: {name}'s strides {tuple(x.stride())} are neither (T, H, D) nor (H, T, D) memory")


def check_inputs(q: Tensor, k: Tensor, v: Tensor, docs: Tensor) -> None:
    """ValueError (one line) unless q, k, v and docs have the shapes the kernel takes."""
    if q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"attn_gluon: q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    t, d = q.shape[2], q.shape[3]
    if t % BLOCK or d % 16 or d > 256:
        raise ValueError(f"attn_gluon: tokens ({t}) must be a multiple of {BLOCK}, head_dim ({d}) of 16 up to 256")
    if docs.shape != (t,) or docs.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"attn_gluon: docs must be ({t},) int32 or int64, got {tuple(docs.shape)} {docs.dtype}")


def block_lists(block_mask) -> tuple[Tensor, ...]:
    """The eight lists of a one-sequence, one-head-mask BlockMask as 1-D counts and 2-D rows, int32: per
    query block its partial and full key blocks (kv_num, kv_idx, full_kv_num, full_kv_idx), then per key
    block its partial and full query blocks (q_num, q_idx, full_q_num, full_q_idx)."""
    if tuple(block_mask.BLOCK_SIZE) != (BLOCK, BLOCK):
        raise ValueError(f"attn_gluon: the block mask's blocks must be {BLOCK} tokens, got {block_mask.BLOCK_SIZE}")
    parts = (block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_num_blocks,
             block_mask.full_kv_indices, block_mask.q_num_blocks, block_mask.q_indices,
             block_mask.full_q_num_blocks, block_mask.full_q_indices)
    if any(p is None for p in parts):
        raise ValueError("attn_gluon: the block mask lacks its full-block or query-block lists")
    return tuple(p[0, 0].to(torch.int32).contiguous() for p in parts)


def _descriptors(tensors: list[tuple[Tensor, str]]):
    """TMA descriptors of 64 x D tiles over each tensor's rows view, and the views' shared per-head offsets."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    d = tensors[0][0].shape[-1]
    layout = gl.NVMMASharedLayout.get_default_for([BLOCK, d], gl.bfloat16)
    views = [_rows_view(x, n) for x, n in tensors]
    if len({(hr, hc) for _, hr, hc in views}) != 1:
        raise ValueError(f"attn_gluon: {', '.join(n for _, n in tensors)} must share one memory layout")
    return [TensorDescriptor.from_tensor(x, [BLOCK, d], layout) for x, _, _ in views], views[0][1], views[0][2]


def _like_q(q: Tensor) -> Tensor:
    """An empty bfloat16 tensor of q's shape in the (1, T, H, D) memory the kernels write."""
    _, h, t, d = q.shape
    return torch.empty(1, t, h, d, dtype=torch.bfloat16, device=q.device).transpose(1, 2)


def launch_forward(q: Tensor, k: Tensor, v: Tensor, docs: Tensor, lists: tuple[Tensor, ...], scale: float,
                   cfg: dict | None = None) -> tuple[Tensor, Tensor]:
    """(o, lse): q, k, v (1, H, T, D) bfloat16 on a Hopper GPU sharing one memory layout; docs (T,) the
    document id per token; lists `block_lists`' eight. o is a (1, H, T, D) view of (1, T, H, D) memory,
    lse (1, H, T) float32 in natural log."""
    check_inputs(q, k, v, docs)
    cfg = config(cfg)
    kernel = _build()["fwd"]
    _, h, t, _ = q.shape
    out, lse = _like_q(q), torch.empty(1, h, t, dtype=torch.float32, device=q.device)
    descs, head_rows, head_cols = _descriptors([(q, "q"), (k, "k"), (v, "v"), (out, "out")])
    kv_num, kv_idx, fkv_num, fkv_idx = lists[:4]
    kernel[(t // BLOCK, h)](*descs, lse, docs, kv_num, kv_idx, fkv_num, fkv_idx, t, kv_idx.shape[1],
                            head_rows, head_cols, scale * math.log2(math.e),
                            STAGES=cfg["STAGES"], num_warps=cfg["num_warps"])
    return out, lse


def _in_layout_of(x: Tensor, like: Tensor) -> Tensor:
    """x in like's memory layout (a gradient from autograd may come in any)."""
    try:
        same = _rows_view(x, "do")[1:] == _rows_view(like, "q")[1:]
    except ValueError:
        same = False
    if same:
        return x
    return x.transpose(1, 2).contiguous().transpose(1, 2) if like.transpose(1, 2).is_contiguous() else x.contiguous()


def launch_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, docs: Tensor,
                    lists: tuple[Tensor, ...], scale: float, cfg: dict | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) given do, the gradient of `launch_forward`'s o: one kernel for delta = rowsum(do · o)
    and dQ (per query block, the key lists), then one for dK and dV (per key block, the query lists); no
    atomics."""
    kernel = _build()
    cfg = config(cfg)
    _, h, t, _ = q.shape
    do = _in_layout_of(do.to(torch.bfloat16), q)
    delta = torch.empty(1, h, t, dtype=torch.float32, device=q.device)  # rowsum(do · o): the dQ kernel's
    dq, dk, dv = _like_q(q), _like_q(q), _like_q(q)
    descs, head_rows, head_cols = _descriptors([(q, "q"), (k, "k"), (v, "v"), (do, "do"), (o, "o"), (dq, "dq"),
                                                (dk, "dk"), (dv, "dv")])
    o_d, dq_d, dk_d, dv_d = descs[4:]
    qk_scale = scale * math.log2(math.e)
    kv_num, kv_idx, fkv_num, fkv_idx, q_num, q_idx, fq_num, fq_idx = lists
    kernel["dq"][(t // BLOCK, h)](*descs[:4], o_d, dq_d, lse, delta, docs, kv_num, kv_idx, fkv_num, fkv_idx, t,
                                  kv_idx.shape[1], head_rows, head_cols, qk_scale, scale,
                                  STAGES=cfg["STAGES"], num_warps=cfg["num_warps"])
    kernel["dkdv"][(t // BLOCK, h)](*descs[:4], dk_d, dv_d, lse, delta, docs, q_num, q_idx, fq_num, fq_idx, t,
                                    q_idx.shape[1], head_rows, head_cols, qk_scale, scale,
                                    STAGES=cfg["STAGES"], num_warps=cfg["num_warps"])
    return dq, dk, dv


def forward(q: Tensor, k: Tensor, v: Tensor, docs: Tensor, block_mask, scale: float,
            cfg: dict | None = None) -> tuple[Tensor, Tensor]:
    """`launch_forward` with the lists of an `attention.flex_block_mask` at 64-token granularity."""
    return launch_forward(q, k, v, docs, block_lists(block_mask), scale, cfg)


# --------------------------------------------------------------------------- the plain-PyTorch reference


def lists_mask(docs: Tensor, lists: tuple[Tensor, ...]) -> Tensor:
    """The (T, T) bool mask the kernels compute from `block_lists`' key lists: key j visible to query i when
    j's 64-token block is in i's block's full list, or in its partial list and the mask function allows it
    (causal, same document)."""
    t = docs.numel()
    nb = t // BLOCK
    blocks = []
    for num, idx in (lists[0:2], lists[2:4]):
        keep = torch.arange(idx.shape[1], device=idx.device)[None, :] < num[:, None]
        m = torch.zeros(nb, nb, dtype=torch.bool, device=docs.device)
        m[torch.arange(nb, device=idx.device)[:, None].expand_as(idx)[keep], idx[keep].long()] = True
        blocks.append(m.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1))
    pos = torch.arange(t, device=docs.device)
    allowed = (pos[:, None] >= pos[None, :]) & (docs[:, None] == docs[None, :])
    return (blocks[0] & allowed) | blocks[1]


def reference(q: Tensor, k: Tensor, v: Tensor, docs: Tensor, lists: tuple[Tensor, ...], scale: float
              ) -> tuple[Tensor, Tensor]:
    """(o, lse) of `launch_forward` in float32 PyTorch (o in q's dtype): what the kernels compute, from the
    same lists."""
    logits = (q.float() @ k.float().transpose(-1, -2)) * scale
    logits = logits.masked_fill(~lists_mask(docs, lists), -math.inf)
    return (torch.softmax(logits, -1) @ v.float()).to(q.dtype), torch.logsumexp(logits, -1)


def reference_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, docs: Tensor, lists: tuple[Tensor, ...],
                       scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of `launch_backward` in float32 PyTorch, in q's dtype, by the formulas the kernels use:
    dV = Pᵀ dO, dS = P (dO Vᵀ - rowsum(dO · O)), dQ = scale · dS K, dK = scale · dSᵀ Q."""
    qf, kf, vf, dof = (x.float() for x in (q, k, v, do))
    logits = ((qf @ kf.transpose(-1, -2)) * scale).masked_fill(~lists_mask(docs, lists), -math.inf)
    p = torch.softmax(logits, -1)
    delta = (dof * (p @ vf)).sum(-1, keepdim=True)
    ds = p * (dof @ vf.transpose(-1, -2) - delta)
    return tuple(g.to(q.dtype) for g in (scale * ds @ kf, scale * ds.transpose(-1, -2) @ qf, p.transpose(-1, -2) @ dof))


# --------------------------------------------------------------------------- the op the model calls


@torch.library.custom_op("speedrun::attn_gluon", mutates_args=())
def attn_gluon_op(q: Tensor, k: Tensor, v: Tensor, docs: Tensor, lists: list[Tensor],
                  scale: float) -> tuple[Tensor, Tensor]:
    """(o, lse) of `launch_forward`; opaque to the compiler, with a fake and an autograd formula."""
    return launch_forward(q, k, v, docs, tuple(lists), scale)


@attn_gluon_op.register_fake
def _(q, k, v, docs, lists, scale):
    return _like_q(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("speedrun::attn_gluon_backward", mutates_args=())
def attn_gluon_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, docs: Tensor,
                        lists: list[Tensor], scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of `launch_backward`."""
    return launch_backward(do, q, k, v, o, lse, docs, tuple(lists), scale)


@attn_gluon_backward.register_fake
def _(do, q, k, v, o, lse, docs, lists, scale):
    return _like_q(q), _like_q(q), _like_q(q)


def _setup_context(ctx, inputs, output):
    q, k, v, docs, lists, scale = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], docs, *lists)
    ctx.scale, ctx.num_lists = scale, len(lists)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse, docs, *lists = ctx.saved_tensors
    dq, dk, dv = torch.ops.speedrun.attn_gluon_backward(do, q, k, v, o, lse, docs, lists, ctx.scale)
    return dq, dk, dv, None, [None] * ctx.num_lists, None


attn_gluon_op.register_autograd(_backward, setup_context=_setup_context)


def attention(q: Tensor, k: Tensor, v: Tensor, docs: Tensor, lists: tuple[Tensor, ...], scale: float) -> Tensor:
    """The record's attention output (1, H, T, D) through the Gluon kernels, differentiable in q, k, v; docs
    int32 or int64 (`attention.narrow_ids`)."""
    return torch.ops.speedrun.attn_gluon(q, k, v, docs, list(lists), scale)[0]


# --------------------------------------------------------------------------- offline compile (no GPU)


_SCALARS = {"T": "i32", "nbk": "i32", "nbq": "i32", "head_rows": "i32", "head_cols": "i32", "qk_scale": "fp32",
            "scale": "fp32"}


def compile_offline(which: str = "fwd", cfg: dict | None = None, head_dim: int = 128, docs_dtype: str = "i32"):
    """Compile kernel `which` ("fwd", "dq", "dkdv") for sm_90 without a GPU (Triton's bundled ptxas), the
    document ids as `docs_dtype` ("i32", the model's where they fit, or "i64"); the CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel = _build()[which]
    cfg = config(cfg)
    layout = gl.NVMMASharedLayout.get_default_for([BLOCK, head_dim], gl.bfloat16)
    desc = f"tensordesc<bf16[{BLOCK}, {head_dim}],{layout!r}>"
    consts = {"STAGES": cfg["STAGES"], "num_warps": cfg["num_warps"]}
    signature = {}
    for name in kernel.arg_names:
        if name in consts:
            signature[name] = "constexpr"
        elif name.endswith("_desc"):
            signature[name] = desc
        elif name == "docs_ptr":
            signature[name] = f"*{docs_dtype}"
        elif name in ("lse_ptr", "delta_ptr"):
            signature[name] = "*fp32"
        elif name.endswith("_ptr"):
            signature[name] = "*i32"
        else:
            signature[name] = _SCALARS[name]
    return triton.compile(GluonASTSource(kernel, signature, consts), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg["num_warps"]})
