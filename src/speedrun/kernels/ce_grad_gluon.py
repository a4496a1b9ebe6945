"""The CE's gradient pass writing the e5m2 gradient in both layouts, in Gluon (`softcap_ce.launch_transposed`).

grad_w's FP8 product needs the head's gradient g (tokens x vocabulary, e5m2) with the tokens
contiguous. Without this kernel the backward copies g transposed (`transpose.py`: 2.47 GB read and
written, ~1.27 ms a 49,152-token micro-step on an H200). Writing g^T from the CE kernel saves the
copy's read: the pass moves 9.9 GB where the lean kernel and the copy move 12.4.

Register layout, fixed by hand (Gluon): a thread owns, for each of four row sets 4j + r (r = 0..3),
CPT = 8 consecutive columns of row 4j + r, TPC = 8 threads side by side along the columns:
- z: one 16-byte load a row (bf16 x 8), 128 bytes a row per warp instruction;
- g row-major: the row's 8 e5m2 bytes as one 8-byte store, 64 bytes a row per warp instruction;
- g^T: rows 4j..4j+3 of one column are four consecutive bytes of g^T, one 32-bit word, built from the
  four row sets' values by two `cvt.rn.satfinite.e5m2x2.f32` (`_word`: the conversion Triton's own
  float8 cast uses, so its bytes are g's). One layout conversion (through
  shared memory) hands each thread four words of one column, stored as 16 bytes: 128 bytes a column
  per warp instruction, whole cache lines.
Measured on an H200 (4f2d00e, 2026-12-02; docs/performance.md): storing the words straight from the
compute layout (32 bytes a column per warp, no shared memory at all) ran at 1.5 TB/s, 6.2-6.8 ms a
call; narrower rows or columns per warp instruction were slower still, and loading the next step's z
ahead (registers 106 -> 171) was slower. This form: 3.02-3.04 ms, the lean kernel and the copy 3.04;
in full runs on a power-capped H200 the step ran at a higher clock with it (580.7 / 581.3 against
584.0 / 584.9 / 583.5 ms/step, 4f2d00e), so it is the head's path on Hopper GPUs; other GPUs run the
lean kernel and the copy.

The math is the lean kernel's gradient pass (`softcap_ce._softcap_ce_lean_kernel`) exactly: the same
sigmoid pairs (column c with c + HALF, HALF = half the lean kernel's BLOCK_V, sharing one hardware
reciprocal), the same exponent shift per row (`softcap_ce._ce_rows_kernel`, run first), the same
roundings. The target column, which the lean kernel writes again after a barrier, is written afterwards
by `softcap_ce._ce_target_kernel` into both layouts with the lean kernel's formula. So both outputs
equal the lean kernel's g and its transposed copy byte for byte; the GPU tests require it.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import torch
from torch import Tensor

# Launch parameters: columns a thread owns (CPT), threads along the columns (TPC; 32 / TPC along the
# rows), warps (stacked along the rows). A CTA covers 4 * (32 / TPC) * num_warps rows, which must be
# 128 (the words' conversion gives a column's 32 words to 8 threads), and one lean block of columns
# (both halves), in steps of TPC * CPT columns a half. Timed on an H200 (4f2d00e, 2026-12-02):
# (8, 8, 8) 3,044 us, (8, 16, 16) 3,021, (8, 4, 4) 5,090, (16, 8, 8) 4,097.
CONFIG = {"CPT": 8, "TPC": 8, "num_warps": 8}

_KERNEL = None
gluon = gl = None
_rcp = _sigmoid_pair = _word = _load_z = _grad_pair = _store_words_t = None


def _build():
    """Import Gluon and define the kernel (once); the jit functions find each other through this module's globals."""
    global _KERNEL, gluon, gl, _rcp, _sigmoid_pair, _word, _load_z, _grad_pair, _store_words_t
    if _KERNEL is not None:
        return _KERNEL
    from triton.experimental import gluon as _gluon
    from triton.experimental.gluon import language as _gl

    gluon, gl = _gluon, _gl

    @gluon.jit
    def _rcp(x):
        return gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=gl.float32,
                                         is_pure=True, pack=1)

    @gluon.jit
    def _sigmoid_pair(za, zb, k):
        """The lean kernel's sigmoid of two tiles with one reciprocal (softcap_ce._sigmoid_pair)."""
        da = 1.0 + gl.exp2(gl.minimum(za * k, 63.0))
        db = 1.0 + gl.exp2(gl.minimum(zb * k, 63.0))
        r = _rcp(da * db)
        return db * r, da * r

    @gluon.jit
    def _word(g0, g1, g2, g3):
        """Four float32 tiles as the e5m2 bytes of 32-bit words, g0 in the low byte."""
        return gl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; cvt.rn.satfinite.e5m2x2.f32 lo, $2, $1; "
            "cvt.rn.satfinite.e5m2x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }",
            "=r,f,f,f,f", [g0, g1, g2, g3], dtype=gl.int32, is_pure=True, pack=1)

    @gluon.jit
    def _load_z(Z, rows, ca, cb, oka, okb, stride_z):
        """z of `rows` at the columns ca and cb = ca + HALF (bfloat16; zeros where masked)."""
        z_rows = Z + rows[:, None].to(gl.int64) * stride_z
        return gl.load(z_rows + ca[None, :], mask=oka, other=0.0), gl.load(z_rows + cb[None, :], mask=okb, other=0.0)

    @gluon.jit
    def _grad_pair(GRAD, rows, shift, za, zb, ca, cb, oka, okb, cap2, k, V: gl.constexpr):
        """g of `rows` at columns ca and cb = ca + HALF (a lean pair) from their z, stored row-major as e5m2;
        the float32 tiles returned for the transposed words."""
        sa, sb = _sigmoid_pair(za.to(gl.float32), zb.to(gl.float32), k)
        ga = gl.exp2(cap2 * sa - shift) * gl.fma(-sa, sa, sa)
        gb = gl.exp2(cap2 * sb - shift) * gl.fma(-sb, sb, sb)
        g_rows = GRAD + rows[:, None].to(gl.int64) * V
        gl.store(g_rows + ca[None, :], ga.to(gl.float8e5), mask=oka)
        gl.store(g_rows + cb[None, :], gb.to(gl.float8e5), mask=okb)
        return ga, gb

    @gluon.jit
    def _ce_grad_both_kernel(Z, SHIFT, GRAD, GRAD_T, N, stride_z, cap, inv_scale, V: gl.constexpr, HALF: gl.constexpr,
                             CPT: gl.constexpr, TPC: gl.constexpr, num_warps: gl.constexpr):
        """Program (i, j): rows 4 * [i * BW, (i + 1) * BW) as four row sets, the lean block of columns
        [j * 2 HALF, (j + 1) * 2 HALF). g into GRAD (N, V) e5m2, g^T into GRAD_T, the same memory as
        int32 (V, N // 4). SHIFT: the rows' exponent shifts (+inf for ignored rows: g = 0). The constants
        are made in float32 here, as the lean kernel makes them."""
        cap2 = cap * 1.4426950408889634
        k = -1.4426950408889634 * inv_scale
        layout: gl.constexpr = gl.BlockedLayout([1, CPT], [32 // TPC, TPC], [num_warps, 1], [1, 0])
        # g^T's words: 4 (16 bytes) a thread along the rows, 8 threads a column's 128 bytes (BW = 32)
        t_layout: gl.constexpr = gl.BlockedLayout([4, 1], [8, 4], [1, num_warps], [0, 1])
        BW: gl.constexpr = (32 // TPC) * num_warps
        CW: gl.constexpr = TPC * CPT
        NW = N // 4
        w0 = gl.program_id(0) * BW
        w = w0 + gl.arange(0, BW, layout=gl.SliceLayout(1, layout))
        wok = w < NW
        inf = float("inf")
        s0 = gl.load(SHIFT + 4 * w, mask=wok, other=inf)[:, None]
        s1 = gl.load(SHIFT + 4 * w + 1, mask=wok, other=inf)[:, None]
        s2 = gl.load(SHIFT + 4 * w + 2, mask=wok, other=inf)[:, None]
        s3 = gl.load(SHIFT + 4 * w + 3, mask=wok, other=inf)[:, None]
        cols = gl.arange(0, CW, layout=gl.SliceLayout(0, layout))
        v0 = gl.program_id(1) * (2 * HALF)
        end = gl.minimum(v0 + HALF, V)
        for c0 in range(v0, end, CW):
            ca = c0 + cols
            cb = ca + HALF
            oka = wok[:, None] & (ca < end)[None, :]
            okb = oka & (cb < V)[None, :]
            za0, zb0 = _load_z(Z, 4 * w, ca, cb, oka, okb, stride_z)  # the four row sets' loads first
            za1, zb1 = _load_z(Z, 4 * w + 1, ca, cb, oka, okb, stride_z)
            za2, zb2 = _load_z(Z, 4 * w + 2, ca, cb, oka, okb, stride_z)
            za3, zb3 = _load_z(Z, 4 * w + 3, ca, cb, oka, okb, stride_z)
            ga0, gb0 = _grad_pair(GRAD, 4 * w, s0, za0, zb0, ca, cb, oka, okb, cap2, k, V)
            ga1, gb1 = _grad_pair(GRAD, 4 * w + 1, s1, za1, zb1, ca, cb, oka, okb, cap2, k, V)
            ga2, gb2 = _grad_pair(GRAD, 4 * w + 2, s2, za2, zb2, ca, cb, oka, okb, cap2, k, V)
            ga3, gb3 = _grad_pair(GRAD, 4 * w + 3, s3, za3, zb3, ca, cb, oka, okb, cap2, k, V)
            _store_words_t(GRAD_T, _word(ga0, ga1, ga2, ga3), c0, w0, NW, V, t_layout)
            _store_words_t(GRAD_T, _word(gb0, gb1, gb2, gb3), c0 + HALF, w0, NW, V, t_layout)

    @gluon.jit
    def _store_words_t(GRAD_T, words, c0, w0, NW, V: gl.constexpr, t_layout: gl.constexpr):
        """Words (BW, CW) of columns c0.. and word rows w0.. stored into GRAD_T (V, NW) from t_layout."""
        BW: gl.constexpr = words.shape[0]
        CW: gl.constexpr = words.shape[1]
        wt = gl.convert_layout(words, t_layout)
        r = w0 + gl.arange(0, BW, layout=gl.SliceLayout(1, t_layout))
        c = c0 + gl.arange(0, CW, layout=gl.SliceLayout(0, t_layout))
        gl.store(GRAD_T + c[None, :].to(gl.int64) * NW + r[:, None], wt, mask=(r < NW)[:, None] & (c < V)[None, :])

    _KERNEL = _ce_grad_both_kernel
    return _KERNEL


def available() -> bool:
    """Whether Triton's Gluon imports here and the kernel defines."""
    try:
        _build()
    except Exception:  # noqa: BLE001 - any import or definition failure means "not here"
        return False
    return True


def applies(z: Tensor, grad_dtype: torch.dtype) -> bool:
    """Can `launch` run for this z: a CUDA GPU of capability 9.0 or newer (the kernel itself is plain loads and
    stores, but only Hopper has been measured), an e5m2 gradient, rows a multiple of four, and Gluon here."""
    if z.device.type != "cuda" or grad_dtype != torch.float8_e5m2 or z.shape[0] % 4:
        return False
    return torch.cuda.get_device_capability(z.device)[0] >= 9 and available()


def grid(n: int, v: int, half: int, cfg: dict) -> tuple[int, int]:
    """Programs along the rows (128 rows a CTA) and along the lean blocks of columns."""
    rows = 4 * (32 // cfg["TPC"]) * cfg["num_warps"]
    if rows != 128 or cfg["CPT"] * cfg["TPC"] > 2 * half:
        raise ValueError(f"ce_grad_gluon: 4 x (32 / TPC) x num_warps must be 128 rows and CPT x TPC at most the lean "
                         f"block, got CPT={cfg['CPT']} TPC={cfg['TPC']} num_warps={cfg['num_warps']}")
    return -(-n // rows), -(-v // (2 * half))


def launch(z: Tensor, shift: Tensor, grad: Tensor, grad_t: Tensor, cap: float, inv_scale: float, half: int,
           cfg: dict | None = None) -> None:
    """Fill grad (N, V) and grad_t (V, N), both e5m2, with the lean kernel's gradient pass given each row's
    exponent shift (`softcap_ce._ce_rows_kernel`); the target columns are left to `softcap_ce._ce_target_kernel`."""
    cfg = dict(CONFIG, **(cfg or {}))
    kernel = _build()
    N, V = z.shape
    if not N:
        return
    kernel[grid(N, V, half, cfg)](z, shift, grad, grad_t.view(torch.int32), N, z.stride(0), float(cap), inv_scale, V=V,
                                  HALF=half, CPT=cfg["CPT"], TPC=cfg["TPC"], num_warps=cfg["num_warps"])


# --------------------------------------------------------------------------- offline compile (no GPU)


def compile_offline(v: int = 50304, half: int = 2048, cfg: dict | None = None):
    """Compile the kernel for sm_90 without a GPU (Triton's bundled ptxas) at the record's vocabulary;
    the CompiledKernel. The launcher's specialisations are assumed: 16-aligned pointers, N and stride_z."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    cfg = dict(CONFIG, **(cfg or {}))
    kernel = _build()
    consts = dict(V=v, HALF=half, CPT=cfg["CPT"], TPC=cfg["TPC"], num_warps=cfg["num_warps"])
    signature = {"Z": "*bf16", "SHIFT": "*fp32", "GRAD": "*fp8e5", "GRAD_T": "*i32", "N": "i32", "stride_z": "i32",
                 "cap": "fp32", "inv_scale": "fp32"}
    signature.update({name: "constexpr" for name in consts})
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]]
             for n in ("Z", "SHIFT", "GRAD", "GRAD_T", "N", "stride_z")}
    return triton.compile(GluonASTSource(kernel, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg["num_warps"]})


def sass_counts(cubin: bytes) -> dict[str, int]:
    """How many of the SASS instructions that matter here a cubin holds: global loads and stores by width,
    shared-memory accesses, special-function (MUFU) ops, from Triton's bundled `cuobjdump -sass`."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    ops = re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)
    count = lambda pred: sum(1 for op in ops if pred(op))  # noqa: E731
    return {"LDG.128": count(lambda o: o.startswith("LDG") and o.endswith(".128")),
            "LDG": count(lambda o: o.startswith("LDG")),
            "STG.64": count(lambda o: o.startswith("STG") and o.endswith(".64")),
            "STG": count(lambda o: o.startswith("STG")),
            "shared": count(lambda o: o.startswith(("LDS", "STS", "LDSM", "STSM"))),
            "MUFU": count(lambda o: o.startswith("MUFU")), "all": len(ops)}
