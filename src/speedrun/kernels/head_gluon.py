"""The FP8 head's forward product as a warp-specialised Hopper kernel in Gluon, optionally with the
soft-capped cross-entropy's row sums in its epilogue.

    z = bf16((x_f8 @ w_f8.T) * scale)   x_f8 (M, K), w_f8 (N, K) float8_e4m3fn; scale a float32 tensor

is what `torch._scaled_mm(..., use_fast_accum=True)` computes for `fp8._forward_impl`; this kernel
gives the same bits (measured at the record's shape, 2026-12-01, 2c51899).

Why: at the record's shape (M = 49,152, K = 768, N = 50,304) cuBLAS takes ~3.58 ms on an H200 where
its backward products of the same FLOPs, with small outputs, take ~2.7: the 4.9 GB bf16 store of z
is not overlapped with the tensor-core work. This kernel is `speedrun.kernels.relu2_gluon`'s persistent
warp-specialised design with e4m3 operands (read that docstring for the barriers and phases): two
consumer warpgroups run the wgmma tiles (128 x 256, 128-wide k-steps) and hand bf16(acc * scale) to a
shared-memory buffer; a 4-warp epilogue partition TMA-stores it while they compute the next tile.

The row sums (ROWSUM): the CE kernel's first pass (`softcap_ce._softcap_ce_lean_kernel`) sums, per
row, 2^(c log2e (s - 1)) with s = sigmoid(z / 7.5) over the whole vocabulary; the record's soft cap
bounds s, so the sum needs no running max and splits into independent per-tile sums. With ROWSUM the
kernel computes those sums for each tile from the bf16 z still in shared memory (the bits the CE
kernel would load), with the lean kernel's per-element math (one reciprocal for two sigmoids; every
exponential on the special-function unit: the CE kernel's FMA polynomial for a share of them was
measured here in 2c51899 (2026-12-01) and lost), and writes two float32 partial sums per row and
column tile into `rowsums` (M, 2 cdiv(N, 256)). The CE kernel then skips its first pass and a whole
read of z (`softcap_ce.launch(..., rowsums=...)`). Padded columns beyond N (zero-filled operands) are
masked out of the last tile's sums; rows beyond M are not written.

Which warps sum: a tile's four 64-column slices are split, the first RS_EPI_SLICES (2) summed by the
epilogue warps beside their TMA stores, the rest by the consumer warpgroups, each group writing its own
partial sum (the CE kernel adds up whatever columns it is given). One epilogue warp per scheduler
issues the ~11 instructions an element slower than the consumers compute the next tile; the consumer
warpgroups mostly wait on their wgmmas: `_mma_rowsum_partition` has them read the previous tile's z
back from the buffer (it is overwritten only after the current tile's mainloop) and sum slices between
issuing one k-step's wgmma and waiting for the one before, spread over the unrolled k-steps. Measured
on one H200 (57860f8, 2026-12-01): two and two 4,116 us, three on the epilogue 4,728, all four there
4,772 (~1.2 ms more than z alone), all four on the consumers 4,797 (their special-function work per
k-step is about a wgmma's time, so the mainloop slows as much); the step with the split 608.1 / 611.4
against 613.1 / 613.7 ms with all on the epilogue (1a09427). The all-epilogue and all-consumer forms
are gone.

Triton is imported on first use (`_build`); importing this module needs only torch.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from speedrun.kernels import relu2_gluon
from speedrun.kernels.softcap_ce import SIGMOID_TEMPERATURE

# MAXNREG: registers a thread at launch (12 warps x 32 x 168 <= 65,536); EPI_REGS: the epilogue warpgroup's
# after setmaxnreg (152-168 spill). GROUP_M: row blocks walked together (L2 reuse of x's rows). BLOCK_K 128 =
# one 128-byte fp8 row, the 128-byte swizzle. POLY 1 (removed in 57860f8, 2026-12-01) took the b columns'
# softmax exponentials by the CE kernel's FMA polynomial (fewer special-function operations, more
# instructions) and lost: the epilogue is bound by issue. Measured on H200s at the record's shape
# (2c51899, 2026-12-01), z alone: GROUP_M 8 3,888 us, 32 3,486 (cuBLAS 3,580); SUB_N 128
# 3,824; EPI_REGS 40 3,663; BLOCK_K 64 with 6 stages 4,545. With the row sums (machine B, z alone 3,472,
# cuBLAS 3,733): POLY 1 5,216 us, POLY 0 4,486; with POLY 1, GROUP_M 16 5,141, 32 5,216, 64 5,248. Machine C
# (z alone 3,327, cuBLAS 3,580), POLY 0: GROUP_M 32 4,687, 16 4,514. RS_EPI_SLICES: the 64-column slices of a
# tile whose row sums the epilogue warps take, the consumers the rest (1 to 3). 57860f8 (z alone 3,521):
# 3 4,728 us, 2 4,116.
CONFIG = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "SUB_N": 64, "GROUP_M": 16, "STAGES": 3,
          "EPI_WARPS": 4, "EPI_REGS": 128, "MAXNREG": 168, "STORE": True,
          "RS_EPI_SLICES": 2}
NUM_WARPS = 8  # the consumer (default) partition: two warpgroups

_KERNEL = None
gluon = gl = tma = mbarrier = tma_store = None
_tile_origin = _shared_state = _mma_partition = None
_rcp_approx = _tile_rowsum = _epilogue = _slice_terms = _slices_at = _mma_rowsum_partition = None
_issue_load = warpgroup_mma = warpgroup_mma_wait = fence_async_shared = None


def config(cfg: dict | None = None) -> dict:
    """CONFIG with `cfg`'s entries over it."""
    return {**CONFIG, **(cfg or {})}


SLICE = 64  # the row sums' slice of a tile: 64 columns (a 128-byte row of bf16)


def rowsum_tiles(n: int, cfg: dict | None = None) -> int:
    """Columns of the row-sum partials for a vocabulary of n: two per BLOCK_N-wide tile (the epilogue
    warps' first, the consumers' second)."""
    return -(-n // config(cfg)["BLOCK_N"]) * 2


def supports(k: int, n: int) -> bool:
    """Can TMA describe the operands: 16-byte rows of x_f8 and w_f8 (K % 16) and of z (N % 8)?"""
    return k % 16 == 0 and n % 8 == 0 and k > 0 and n > 0


def available() -> bool:
    """Whether Triton's Gluon with its Hopper support imports and the kernel defines here."""
    return relu2_gluon.defines(_build)


def _build():
    """Define the kernel (once). The tile order, the TMA ring's loads (B as (N, K)), the shared state
    and the consumer partition (SCALED: bf16(acc * scale)) are `relu2_gluon`'s and resolve their names
    in its globals; the jit functions below find theirs in this module's."""
    global _KERNEL, gluon, gl, tma, mbarrier, tma_store, _tile_origin, _shared_state, _mma_partition
    global _rcp_approx, _tile_rowsum, _epilogue, _slice_terms, _slices_at, _mma_rowsum_partition
    global _issue_load, warpgroup_mma, warpgroup_mma_wait, fence_async_shared
    if _KERNEL is not None:
        return _KERNEL
    relu2_gluon._build()
    gluon, gl, tma, mbarrier = relu2_gluon.gluon, relu2_gluon.gl, relu2_gluon.tma, relu2_gluon.mbarrier
    tma_store = relu2_gluon.tma_store
    _tile_origin, _shared_state, _mma_partition = (relu2_gluon._tile_origin, relu2_gluon._shared_state,
                                                   relu2_gluon._mma_partition)
    _issue_load, fence_async_shared = relu2_gluon._issue_load, relu2_gluon.fence_async_shared
    warpgroup_mma, warpgroup_mma_wait = relu2_gluon.warpgroup_mma, relu2_gluon.warpgroup_mma_wait

    @gluon.jit
    def _rcp_approx(x):
        """1 / x by the hardware's approximate reciprocal (1 ulp), as the lean CE kernel on CUDA."""
        return gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=gl.float32,
                                         is_pure=True, pack=1)

    @gluon.jit
    def _slice_terms(e_buf, j: gl.constexpr, SUB: gl.constexpr, off_n, N, cap2, k, layout: gl.constexpr,
                     MASKED: gl.constexpr):
        """The lean CE kernel's first-pass terms 2^(cap2 s - cap2), s = sigmoid(z / 7.5) (k = -log2e / 7.5),
        of the buffer's columns [j SUB, (j + 1) SUB), summed in pairs: the slice is loaded once and split
        into its even (a) and odd (b) columns, a pair sharing one reciprocal. MASKED: columns at or past N
        add 0. (BM, SUB / 2) float32."""
        BM: gl.constexpr = e_buf.shape[0]
        z = e_buf.slice(j * SUB, SUB, 1).load(layout).to(gl.float32)
        za, zb = gl.split(gl.reshape(z, [BM, SUB // 2, 2]))
        da = 1.0 + gl.exp2(gl.minimum(za * k, 63.0))
        db = 1.0 + gl.exp2(gl.minimum(zb * k, 63.0))
        r = _rcp_approx(da * db)
        ea = gl.exp2(cap2 * (db * r) - cap2)
        eb = gl.exp2(cap2 * (da * r) - cap2)
        if MASKED:
            cols = off_n + j * SUB + gl.arange(0, SUB, layout=gl.SliceLayout(0, layout))
            ok_a, ok_b = gl.split(gl.reshape(gl.zeros([BM, SUB], gl.int32, layout) + cols[None, :], [BM, SUB // 2, 2]))
            ea = gl.where(ok_a < N, ea, 0.0)
            eb = gl.where(ok_b < N, eb, 0.0)
        return ea + eb

    @gluon.jit
    def _tile_rowsum(e_buf, off_n, N, cap2, k, MASKED: gl.constexpr,
                     EPI_WARPS: gl.constexpr, J1: gl.constexpr):
        """Per row of the buffer's bf16 tile: the sum of `_slice_terms` over its first J1 64-column slices."""
        SUB: gl.constexpr = 64
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [EPI_WARPS, 1], [1, 0])
        for j in gl.static_range(J1):
            if j == 0:
                acc = _slice_terms(e_buf, j, SUB, off_n, N, cap2, k, layout, MASKED)
            else:
                acc += _slice_terms(e_buf, j, SUB, off_n, N, cap2, k, layout, MASKED)
        return gl.sum(acc, axis=1)

    @gluon.jit
    def _slices_at(e_buf, ks: gl.constexpr, K_STEPS: gl.constexpr, J0: gl.constexpr, rsum, off_n, N, cap2, k,
                   layout: gl.constexpr):
        """rsum plus the row sums of the buffer's 64-column slices J0, J0 + 1, ... that k-step ks of K_STEPS
        takes (spread evenly over the tile's k-steps); masked past N. Slice J0 falls to k-step 0 and
        replaces rsum (any placeholder there)."""
        SUB: gl.constexpr = 64
        NS: gl.constexpr = e_buf.shape[1] // SUB
        for j in gl.static_range(J0, NS):
            if ((j - J0) * K_STEPS) // (NS - J0) == ks:
                part = gl.sum(_slice_terms(e_buf, j, SUB, off_n, N, cap2, k, layout, True), axis=1)
                if j == J0:
                    rsum = part
                else:
                    rsum = rsum + part
        return rsum

    @gluon.jit
    def _mma_rowsum_partition(a_desc, b_desc, a_bufs, b_bufs, e_buf, ready, acc_ready, acc_free, scale_ptr,
                              rowsum_ptr, M, N, cap, inv_scale, GROUP_M: gl.constexpr, K_STEPS: gl.constexpr,
                              J0: gl.constexpr, num_warps: gl.constexpr):
        """relu2_gluon's consumer partition (SCALED, B as (N, K)) with the row sums on the consumers: while
        the tensor cores run tile t's wgmmas, the warpgroups read tile t - 1's bf16 z back from the epilogue
        buffer (it is overwritten only after tile t's mainloop) and sum its slices, a share per k-step,
        between issuing one wgmma and waiting for the one before; the sums are stored after the k-loop, the
        last tile's after the tile loop. The k-loop is unrolled (K_STEPS = cdiv(K, BK) is a constexpr).
        Slices J0.. only (0 < J0): the epilogue warps sum the first J0; of a tile's two partial sums
        these are the second."""
        BM: gl.constexpr = e_buf.shape[0]
        BN: gl.constexpr = e_buf.shape[1]
        STAGES: gl.constexpr = a_bufs.shape[0]
        INSTR_K: gl.constexpr = 256 // a_bufs.dtype.primitive_bitwidth
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                          instr_shape=[16, BN, INSTR_K])
        rs_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        row_layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        cap2 = cap * 1.4426950408889634
        kz = -1.4426950408889634 * inv_scale
        scale = gl.load(scale_ptr)
        num_m = gl.cdiv(M, BM)
        num_n = gl.cdiv(N, BN)
        pid = gl.program_id(0)
        progs = gl.num_programs(0)
        total = ((num_m * num_n - pid + progs - 1) // progs) * K_STEPS
        for i in gl.static_range(STAGES - 1):
            _issue_load(i, total, K_STEPS, num_m, num_n, a_desc, b_desc, a_bufs, b_bufs, ready, True, GROUP_M)
        acc = gl.zeros([BM, BN], gl.float32, layout)
        it = 0
        t = 0
        prev_m = 0
        prev_n = 0
        for tile in range(pid, num_m * num_n, progs):
            rsum = 0.0  # a placeholder: k-step 0 replaces it
            for ks in gl.static_range(K_STEPS):
                s = it % STAGES
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, use_acc=ks > 0,
                                    is_async=True)
                rsum = _slices_at(e_buf, ks, K_STEPS, J0, rsum, prev_n, N, cap2, kz, rs_layout)
                acc = warpgroup_mma_wait(1, deps=(acc, ))
                _issue_load(it + STAGES - 1, total, K_STEPS, num_m, num_n, a_desc, b_desc, a_bufs, b_bufs, ready,
                            True, GROUP_M)
                it += 1
            rows = prev_m + gl.arange(0, BM, layout=row_layout)
            gl.store(rowsum_ptr + rows.to(gl.int64) * (num_n * 2) + (prev_n // BN) * 2 + 1,
                     gl.convert_layout(rsum, row_layout),
                     mask=(rows < M) & (t > 0))
            acc = warpgroup_mma_wait(0, deps=(acc, ))
            mbarrier.wait(acc_free, (t & 1) ^ 1)  # passes at once for the first tile
            e_buf.store((acc * scale).to(gl.bfloat16))
            fence_async_shared()  # the epilogue's TMA stores read what these generic stores wrote
            mbarrier.arrive(acc_ready)
            prev_m, prev_n = _tile_origin(tile, M, N, BM, BN, GROUP_M)
            t += 1
        if t > 0:  # the last tile's sums
            rsum = 0.0
            for ks in gl.static_range(K_STEPS):
                rsum = _slices_at(e_buf, ks, K_STEPS, J0, rsum, prev_n, N, cap2, kz, rs_layout)
            rows = prev_m + gl.arange(0, BM, layout=row_layout)
            gl.store(rowsum_ptr + rows.to(gl.int64) * (num_n * 2) + (prev_n // BN) * 2 + 1,
                     gl.convert_layout(rsum, row_layout),
                     mask=rows < M)

    @gluon.jit
    def _epilogue(out_desc, e_buf, acc_ready, acc_free, rowsum_ptr, M, N, cap, inv_scale, GROUP_M: gl.constexpr,
                  STORE: gl.constexpr, J1: gl.constexpr,
                  EPI_WARPS: gl.constexpr):
        """Per tile: TMA-store the buffer in SUB-wide column slices (none wholly right of N; TMA clips the
        rest), with J1 > 0 the row sums of the tile's first J1 slices (`_tile_rowsum`) into
        rowsum_ptr[row, 2 x tile column] (the tile's first partial sum), then
        hand the buffer back once the bulk copies have read it."""
        BM: gl.constexpr = e_buf.shape[0]
        BN: gl.constexpr = e_buf.shape[1]
        SUB: gl.constexpr = out_desc.block_type.shape[1]
        row_layout: gl.constexpr = gl.BlockedLayout([1], [32], [EPI_WARPS], [0])
        cap2 = cap * 1.4426950408889634  # as the lean CE kernel: base-2 units
        k = -1.4426950408889634 * inv_scale
        n_tiles = gl.cdiv(N, BN)
        t = 0
        for tile in range(gl.program_id(0), gl.cdiv(M, BM) * n_tiles, gl.num_programs(0)):
            off_m, off_n = _tile_origin(tile, M, N, BM, BN, GROUP_M)
            mbarrier.wait(acc_ready, t & 1)
            if STORE:
                for j in gl.static_range(BN // SUB):
                    if off_n + j * SUB < N:
                        tma_store(out_desc, [off_m, off_n + j * SUB],
                                                        e_buf.slice(j * SUB, SUB, 1))
            if J1 > 0:
                if off_n + BN <= N:
                    sums = _tile_rowsum(e_buf, off_n, N, cap2, k, False, EPI_WARPS, J1)
                else:
                    sums = _tile_rowsum(e_buf, off_n, N, cap2, k, True, EPI_WARPS, J1)
                rows = off_m + gl.arange(0, BM, layout=row_layout)
                gl.store(rowsum_ptr + rows.to(gl.int64) * (n_tiles * 2) + (off_n // BN) * 2,
                         gl.convert_layout(sums, row_layout),
                         mask=rows < M)
            if STORE:
                tma.store_wait(0)  # every slice read out of shared memory: the buffer is free
            mbarrier.arrive(acc_free)
            t += 1

    @gluon.jit
    def _head_fwd_kernel(a_desc, b_desc, out_desc, scale_ptr, rowsum_ptr, M, N, K, cap, inv_scale,
                         GROUP_M: gl.constexpr, STAGES: gl.constexpr, EPI_WARPS: gl.constexpr,
                         EPI_REGS: gl.constexpr, STORE: gl.constexpr, ROWSUM: gl.constexpr,
                         RS_EPI: gl.constexpr, K_STEPS: gl.constexpr, num_warps: gl.constexpr):
        """z = bf16((A @ B.T) * scale), A (M, K) and B (N, K) fp8 e4m3 (K-major), tile by tile, and with
        ROWSUM the CE row sums: the epilogue warps sum a tile's first RS_EPI 64-column slices, the consumer
        warpgroups the rest (their partition unrolls the K_STEPS k-steps). Persistent: grid <= tiles."""
        a_bufs, b_bufs, e_buf, ready, acc_ready, acc_free = _shared_state(a_desc, b_desc, out_desc,
                                                                          b_desc.block_type.shape[0], STAGES)
        if ROWSUM:
            gl.warp_specialize([
                (_mma_rowsum_partition, (a_desc, b_desc, a_bufs, b_bufs, e_buf, ready, acc_ready, acc_free,
                                         scale_ptr, rowsum_ptr, M, N, cap, inv_scale, GROUP_M, K_STEPS, RS_EPI, num_warps)),
                (_epilogue, (out_desc, e_buf, acc_ready, acc_free, rowsum_ptr, M, N, cap, inv_scale, GROUP_M, STORE,
                             RS_EPI, EPI_WARPS)),
            ], [EPI_WARPS], [EPI_REGS])
        else:
            gl.warp_specialize([
                (_mma_partition, (a_desc, b_desc, a_bufs, b_bufs, e_buf, ready, acc_ready, acc_free, scale_ptr, M,
                                  N, K, True, GROUP_M, True, num_warps)),
                (_epilogue, (out_desc, e_buf, acc_ready, acc_free, rowsum_ptr, M, N, cap, inv_scale, GROUP_M, STORE,
                             0, EPI_WARPS)),
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


def kernel_constexprs(cfg: dict, rowsum: bool, k: int) -> dict:
    """The kernel's compile-time arguments for `cfg`, with or without the row sums, for K = k (the
    consumers' k-loop is unrolled where they sum)."""
    if not 0 < cfg["RS_EPI_SLICES"] < cfg["BLOCK_N"] // SLICE:
        raise ValueError(f"head_gluon: RS_EPI_SLICES must leave both the epilogue and the consumers some of a tile's "
                         f"{cfg['BLOCK_N'] // SLICE} slices, got {cfg['RS_EPI_SLICES']}")
    return {"GROUP_M": cfg["GROUP_M"], "STAGES": cfg["STAGES"], "EPI_WARPS": cfg["EPI_WARPS"],
            "EPI_REGS": cfg["EPI_REGS"], "STORE": cfg["STORE"], "ROWSUM": rowsum, "RS_EPI": cfg["RS_EPI_SLICES"],
            "K_STEPS": -(-k // cfg["BLOCK_K"]) if rowsum else 0}


def _check(x_f8: Tensor, w_f8: Tensor, scale: Tensor, out: Tensor, rowsums: Tensor | None, cfg: dict) -> None:
    m, k = x_f8.shape
    n = w_f8.shape[0]
    if x_f8.dtype != torch.float8_e4m3fn or w_f8.dtype != torch.float8_e4m3fn or out.dtype != torch.bfloat16:
        raise TypeError("head_gluon.launch: x_f8, w_f8 float8_e4m3fn and out bfloat16 expected")
    if w_f8.shape[1] != k or tuple(out.shape) != (m, n) or k % 16 or n % 8:
        raise ValueError(f"head_gluon.launch: shapes x {tuple(x_f8.shape)} w {tuple(w_f8.shape)} "
                         f"out {tuple(out.shape)} (K % 16 == 0, N % 8 == 0 needed)")
    if not (x_f8.is_contiguous() and w_f8.is_contiguous() and out.is_contiguous()):
        raise ValueError("head_gluon.launch: contiguous operands expected")
    if scale.numel() != 1 or scale.dtype != torch.float32:
        raise ValueError("head_gluon.launch: scale must be a one-element float32 tensor")
    want = (m, rowsum_tiles(n, cfg))
    if rowsums is not None and (tuple(rowsums.shape) != want or rowsums.dtype != torch.float32
                                or not rowsums.is_contiguous()):
        raise ValueError(f"head_gluon.launch: rowsums must be a contiguous float32 {want}, got "
                         f"{rowsums.dtype} {tuple(rowsums.shape)}")


def launch(x_f8: Tensor, w_f8: Tensor, scale: Tensor, out: Tensor, rowsums: Tensor | None = None,
           cap: float = 30.0, cfg: dict | None = None) -> Tensor:
    """out = bf16((x_f8 @ w_f8.T) * scale); with `rowsums` ((M, rowsum_tiles(N)) float32) also the CE
    kernel's row sums for the soft cap c * sigmoid(z / 7.5), c = cap (0 < cap <= 80, the lean kernel's
    static shift). x_f8 (M, K), w_f8 (N, K) float8_e4m3fn, out (M, N) bfloat16, all contiguous on one
    Hopper GPU; K a multiple of 16, N of 8 (TMA's 16-byte row strides); M any. cfg: CONFIG overrides."""
    kernel = _build()
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    cfg = config(cfg)
    _check(x_f8, w_f8, scale, out, rowsums, cfg)
    m, n = out.shape
    if not m:
        return out
    bm, bn, bk, sub = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SUB_N"]
    a_l, b_l, c_l = descriptor_layouts(cfg)
    a_desc = TensorDescriptor.from_tensor(x_f8, [bm, bk], a_l)
    b_desc = TensorDescriptor.from_tensor(w_f8, [bn, bk], b_l)
    out_desc = TensorDescriptor.from_tensor(out, [bm, sub], c_l)
    tiles = -(-m // bm) * -(-n // bn)
    dev = x_f8.device.index if x_f8.device.index is not None else torch.cuda.current_device()
    progs = min(tiles, relu2_gluon._sm_count(dev))
    kernel[(progs,)](a_desc, b_desc, out_desc, scale, out if rowsums is None else rowsums, m, n, x_f8.shape[1],
                     float(cap), 1.0 / SIGMOID_TEMPERATURE, **kernel_constexprs(cfg, rowsums is not None, x_f8.shape[1]),
                     num_warps=NUM_WARPS, maxnreg=cfg["MAXNREG"])
    return out


_FAILED: list[str] = []  # why the kernel could not be built in this process (empty: not yet failed)


def try_launch(*args, **kwargs) -> bool:
    """`launch`, or False (with one warning) when the kernel cannot be compiled here: Gluon is
    experimental, and a Triton other than the 3.6 it was written on may reject it. The caller then
    runs cuBLAS's product (and the CE kernel's own first pass). A failure is remembered."""
    if _FAILED:
        return False
    try:
        launch(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - any compile failure; CUDA errors resurface on the next op
        _FAILED.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
        warnings.warn(f"head_gluon: the Gluon head kernel failed here ({_FAILED[0]}); using cuBLAS",
                      RuntimeWarning, stacklevel=2)
        return False
    return True


def rowsums_reference(z: Tensor, cap: float, cfg: dict | None = None) -> Tensor:
    """What `launch` writes into rowsums, in float64 from z's values: per row and BLOCK_N-wide column
    tile, the sums of exp(cap (s - 1)) with s = sigmoid(z / 7.5) (= 2^(cap log2e (s - 1))) over its first
    RS_EPI_SLICES 64-column slices and over the rest."""
    cfg = config(cfg)
    bn = cfg["BLOCK_N"]
    m, n = z.shape
    tiles = -(-n // bn)
    e = torch.exp(cap * (torch.sigmoid(z.double() / SIGMOID_TEMPERATURE) - 1.0))
    e = torch.nn.functional.pad(e, (0, tiles * bn - n)).view(m, tiles, bn)
    cut = cfg["RS_EPI_SLICES"] * SLICE
    return torch.stack((e[..., :cut].sum(dim=2), e[..., cut:].sum(dim=2)), dim=2).view(m, 2 * tiles)


# --------------------------------------------------------------------------- offline compile (no GPU)


def compile_offline(cfg: dict | None = None, rowsum: bool = True, k: int = 768):
    """Compile for sm_90 without a GPU (Triton's bundled ptxas); the CompiledKernel. The launcher's
    specialisations at the record's shape are assumed: M, N, K multiples of 16, aligned pointers."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel = _build()
    cfg = config(cfg)
    a_l, b_l, c_l = descriptor_layouts(cfg)
    bm, bn, bk, sub = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SUB_N"]
    consts = dict(kernel_constexprs(cfg, rowsum, k), num_warps=NUM_WARPS)
    signature = {"a_desc": f"tensordesc<fp8e4nv[{bm}, {bk}],{a_l!r}>",
                 "b_desc": f"tensordesc<fp8e4nv[{bn}, {bk}],{b_l!r}>",
                 "out_desc": f"tensordesc<bf16[{bm}, {sub}],{c_l!r}>",
                 "scale_ptr": "*fp32", "rowsum_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
                 "cap": "fp32", "inv_scale": "fp32"}
    signature.update({name: "constexpr" for name in consts})
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]]
             for n in ("scale_ptr", "rowsum_ptr", "M", "N", "K")}
    return triton.compile(GluonASTSource(kernel, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": NUM_WARPS, "maxnreg": cfg["MAXNREG"]})
