"""Several embedding tables looked up with the same tokens, and their gradients in one sorted pass.

The record looks one row of tokens up in four (V, D) bfloat16 tables: the
token embedding and three value embeddings. Compiled as plain PyTorch, each
table's gradient is Inductor's dense embedding backward: fill a (V, D)
float32 buffer with zeros (154 MB at the record's V = 50,304, D = 768), add
every token's gradient row into it with float32 atomic adds, then round the
buffer to bfloat16 in another pass. Four tables, eight micro-steps a step:
about 20 GB of memory traffic a step, in an order that changes from run to
run (atomics).

Here the lookups stay `F.embedding` inside the compiled graph (Inductor fuses
them with what reads them); one autograd function gives all the tables one
backward op, `speedrun::embedding_backward`:

1. the tokens are sorted once (stably, as 16-bit keys), for every table;
2. `_chunk_kernel`: a program takes C consecutive sorted positions (and a
   block of columns) and, for each table, sums each run of equal tokens in
   them with one matrix product S = M·G, M[i, j] = [t_i = t_j] (0 or 1, so
   the products are exact and the sums float32). A run that starts and ends inside the
   chunk is written straight to its row of the bfloat16 gradient; the
   chunk's first and last runs' partial sums also go to a small float32
   buffer (2 rows a chunk);
3. `_chain_kernel`: each run that crosses a chunk boundary is summed from
   those partials by the chunk where it starts, walking forward, and written
   once.

Rows of tokens absent from the row of tokens are zero: one bfloat16 fill,
half the bytes of the float32 one. Every sum is float32 in a fixed order
and rounded once, so the gradient is the reference's up to the order of its
float32 additions, and the same from run to run.

Measured on an H200 (2026-12-01, 7d32cb7): the sort of
16-bit keys 97.5 µs (int64 150 µs), the bfloat16 fill 103 µs, the kernels
280 µs for the four tables; yet the step was no faster (656.19 against
656.25 ms/step, one GPU, the same machine; an earlier launch: 637.81 against
639.54). Inductor fuses its atomic adds into the kernels that produce the
upstream gradients, so in the model its backward costs less than alone, while
this op needs those gradients written out. It stays an option
(`model.embed_kernel=triton`) for its determinism. The default, "rows"
(`embed_rows.py`), keeps Inductor's fused atomics and drops the dense
table's fill and rounding pass instead.

Two implementations (`kernel_choice`): "torch" (`F.embedding` per table, the
reference; autograd's backward) and "triton" (the function above; CUDA, or
the CPU under TRITON_INTERPRET=1, where the kernels widen bfloat16 products
to float32 and round to bfloat16 in integer arithmetic, as the interpreter's
own conversions truncate).
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import Tensor

from speedrun.kernels.choice import TRITON_FOUND, built_once, pick_impl

KERNEL_DTYPES = (torch.bfloat16, torch.float32)
# Sorted positions a program sums (the side of M), columns a program takes, warps. Swept on an H200 at the
# record's size (scripts/bench/embed_bench.py, 27 launches, one table a launch; 2026-12-01,
# 7d32cb7): 64 x 128 with 2 warps 278 us for four tables, 4 warps 392, 32 x 128 297.
KERNEL_CONFIG = {"CHUNK": 64, "BLOCK_D": 128, "num_warps": 2}


def reference(tokens: Tensor, tables: list[Tensor]) -> list[Tensor]:
    """The lookups as the model writes them without the kernel."""
    return [F.embedding(tokens, w) for w in tables]


def supported(tokens: Tensor, tables: list[Tensor]) -> bool:
    """Can the kernel's backward take these? One or more 2-D tables of one shape and a kernel dtype, and
    integer tokens on their device."""
    if not tables or tokens.is_floating_point() or tokens.is_complex():
        return False
    w0 = tables[0]
    return w0.dim() == 2 and w0.dtype in KERNEL_DTYPES and all(
        w.shape == w0.shape and w.dtype == w0.dtype and w.device == tokens.device for w in tables)


def pick(tokens: Tensor, tables: list[Tensor], impl: str = "auto") -> str:
    """"torch" or "triton" for these tensors; "triton" asked for where it cannot run is an error."""
    choice = pick_impl(tokens, impl)
    if choice == "triton" and not (TRITON_FOUND and supported(tokens, tables)):
        if impl == "auto":
            return "torch"
        raise ValueError("model.embed_kernel=triton needs Triton and tables of one shape, in bfloat16 or "
                         "float32, on the tokens' device")
    return choice


def lookups(tokens: Tensor, tables: list[Tensor], impl: str = "auto",
            sums: list[tuple[Tensor, Tensor] | None] | None = None) -> list[Tensor]:
    """[F.embedding(tokens, w) for w in tables]; impl as `pick`, or "rows". With "triton" the tables'
    gradients come from one sorted pass (`speedrun::embedding_backward`). With "rows", a table whose entry
    of `sums` is a (sum, scratch) pair (a trainer's `grad_accum.GradBuffers`) adds its gradient into the
    sum row by row (`embed_rows.lookup_into`) and gets none; the others (and all, without sums) are the
    reference's lookups."""
    if impl == "rows":
        from speedrun.kernels import embed_rows

        sums = [None] * len(tables) if sums is None else sums
        if len(sums) != len(tables):
            raise ValueError(f"embeddings.lookups: {len(sums)} sums for {len(tables)} tables")
        return [F.embedding(tokens, w) if s is None else embed_rows.lookup_into(tokens, w, *s)
                for w, s in zip(tables, sums)]
    if pick(tokens, tables, impl) == "torch":
        return reference(tokens, tables)
    return list(_Lookups.apply(tokens, *tables))


class _Lookups(torch.autograd.Function):
    """The plain lookups forward (traced and fused by the compiler); the sorted-pass op backward."""

    @staticmethod
    def forward(ctx, tokens: Tensor, *tables: Tensor):
        ctx.save_for_backward(tokens)
        ctx.num_rows = tables[0].shape[0]
        return tuple(F.embedding(tokens, w) for w in tables)

    @staticmethod
    def backward(ctx, *grads: Tensor):
        (tokens,) = ctx.saved_tensors
        flat = [g.reshape(-1, g.shape[-1]) for g in grads]
        return None, *torch.ops.speedrun.embedding_backward(tokens.reshape(-1), flat, ctx.num_rows)


# --------------------------------------------------------------------------- the op


def _check(tokens: Tensor, grads: list[Tensor], num_rows: int) -> None:
    if tokens.dim() != 1 or tokens.is_floating_point():
        raise ValueError(f"embedding_backward: tokens must be 1-D integers, got {tuple(tokens.shape)} {tokens.dtype}")
    if not grads:
        raise ValueError("embedding_backward: no gradients given")
    g0 = grads[0]
    for g in grads:
        if g.dim() != 2 or g.shape[0] != tokens.shape[0] or g.shape != g0.shape or g.dtype != g0.dtype:
            raise ValueError(f"embedding_backward: gradients must all be (N, D) = ({tokens.shape[0]}, D) in one "
                             f"dtype, got {tuple(g.shape)} {g.dtype} beside {tuple(g0.shape)} {g0.dtype}")
    if g0.dtype not in KERNEL_DTYPES:
        raise ValueError(f"embedding_backward: dtype must be one of {KERNEL_DTYPES}, got {g0.dtype}")
    if num_rows < 1:
        raise ValueError(f"embedding_backward: num_rows must be >= 1, got {num_rows}")


@torch.library.custom_op("speedrun::embedding_backward", mutates_args=())
def embedding_backward(tokens: Tensor, grads: list[Tensor], num_rows: int) -> list[Tensor]:
    """For each g in grads ((N, D), one dtype): the (num_rows, D) gradient of the table that tokens (N,)
    looked up, i.e. row v = the sum of g's rows at the positions where tokens == v."""
    _check(tokens, grads, num_rows)
    keys, order = sort_keys(tokens, num_rows)
    outs = [g.new_zeros((num_rows, g.shape[1])) for g in grads]
    if tokens.numel():
        for i in range(0, len(grads), MAX_TABLES):
            launch(keys, order, [g.contiguous() for g in grads[i : i + MAX_TABLES]], outs[i : i + MAX_TABLES])
    return outs


def sort_keys(tokens: Tensor, num_rows: int) -> tuple[Tensor, Tensor]:
    """(sorted keys, the sort's permutation). Only runs of equal tokens matter, not their order, so with
    num_rows <= 65,535 the keys are the tokens wrapped to int16 (one-to-one there; the kernels read a key k
    as the row k & 0xFFFF, and -1, row 65,535, is free for their sentinel): a radix sort of 16-bit keys
    is a quarter of a 64-bit one (156 us for 49,152 int64 tokens on an H200)."""
    keys = tokens.to(torch.int16 if num_rows <= 65535 else torch.int32)
    return torch.sort(keys, stable=True)


@embedding_backward.register_fake
def _(tokens, grads, num_rows):
    return [g.new_empty((num_rows, g.shape[1])) for g in grads]


# --------------------------------------------------------------------------- Triton kernels

MAX_TABLES = 4  # tables one launch takes (pointer arguments); more go in further launches

triton = tl = None  # set by built_once on first use
_INTERPRETED = False  # TRITON_INTERPRET=1 when the kernels were defined
_cast = _row = _pick = _chunk_sums = _chunk_kernel = _chain_kernel = None


@built_once
def _build_kernel(interpreted: bool):
    """Define the kernels (once, `built_once`); interpreted: TRITON_INTERPRET=1 now."""
    global _INTERPRETED, _cast, _row, _pick, _chunk_sums, _chunk_kernel  # module
    global _chain_kernel  # globals: the interpreter re-runs them
    _INTERPRETED = interpreted

    @triton.jit
    def _cast(x, P, EMULATE_RNE: tl.constexpr):
        """float32 x as the element type of pointer P, rounded to nearest even (in integer arithmetic under
        the interpreter, whose float32 -> bfloat16 conversion truncates)."""
        if EMULATE_RNE:
            u = x.to(tl.uint32, bitcast=True)
            u = u + (((u >> 16) & 1) + 0x7FFF)
            return ((u >> 16) << 16).to(tl.float32, bitcast=True).to(P.dtype.element_ty)
        else:
            return x.to(P.dtype.element_ty)

    @triton.jit
    def _row(key, KEY16: tl.constexpr):
        """The table row of a sort key (int32): int16 keys wrapped the tokens."""
        if KEY16:
            return (key & 0xFFFF).to(tl.int64)
        else:
            return key.to(tl.int64)

    @triton.jit
    def _pick(e: tl.constexpr, P0, P1, P2, P3):
        """The e-th of four pointers (e a constant)."""
        if e == 0:
            return P0
        elif e == 1:
            return P1
        elif e == 2:
            return P2
        else:
            return P3

    @triton.jit
    def _chunk_sums(G, OUT, PART, same, rows, dst, inside, ok, last, cols, col_ok, c, D, C: tl.constexpr,
                    WIDEN: tl.constexpr, IEEE: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """One table: S = M G over the chunk; runs inside the chunk to OUT, first and last runs to PART."""
        g = tl.load(G + rows[:, None] * D + cols[None, :], mask=ok[:, None] & col_ok[None, :], other=0.0)
        if WIDEN:
            s = tl.dot(same.to(tl.float32), g.to(tl.float32), input_precision="ieee")
        elif IEEE:
            s = tl.dot(same.to(g.dtype), g, input_precision="ieee")
        else:
            s = tl.dot(same.to(g.dtype), g)
        tl.store(dst, _cast(s, OUT, EMULATE_RNE), mask=inside[:, None] & col_ok[None, :])
        idx = tl.arange(0, C)[:, None]
        tl.store(PART + (2 * c) * D + cols, tl.sum(tl.where(idx == 0, s, 0.0), axis=0), mask=col_ok)
        tl.store(PART + (2 * c + 1) * D + cols, tl.sum(tl.where(idx == last, s, 0.0), axis=0), mask=col_ok)

    @triton.jit
    def _chunk_kernel(TOK, ORDER, G0, G1, G2, G3, O0, O1, O2, O3, PART, N, D, PART_STRIDE, NT: tl.constexpr,
                      C: tl.constexpr, BLOCK_D: tl.constexpr, KEY16: tl.constexpr, WIDEN: tl.constexpr,
                      IEEE: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """Chunk c of the sorted positions, for each of the NT tables: each run of equal tokens summed
        (S = M G); runs inside the chunk written to OUT, the first and last runs' sums to PART[c, 0/1]."""
        c = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        col_ok = cols < D
        p = c * C + tl.arange(0, C)
        ok = p < N
        t = tl.load(TOK + p, mask=ok, other=-1).to(tl.int32)
        before = tl.load(TOK + p - 1, mask=ok & (p > 0), other=-1).to(tl.int32)  # the sorted key before each
        after_chunk = tl.load(TOK + c * C + C, mask=c * C + C < N, other=-1).to(tl.int32)  # next chunk's first
        rows = tl.load(ORDER + p, mask=ok, other=0).to(tl.int64)
        same = (t[:, None] == t[None, :]) & ok[:, None] & ok[None, :]
        inside = ok & (t != before) & (t != after_chunk)  # a run's first position, the run ends in the chunk
        dst = _row(t, KEY16)[:, None] * D + cols[None, :]
        last = tl.minimum(N - c * C, C) - 1
        for e in tl.static_range(NT):
            _chunk_sums(_pick(e, G0, G1, G2, G3), _pick(e, O0, O1, O2, O3), PART + e * PART_STRIDE, same,
                        rows, _pick(e, O0, O1, O2, O3) + dst, inside, ok, last, cols, col_ok, c, D, C, WIDEN,
                        IEEE, EMULATE_RNE)

    @triton.jit
    def _chain_kernel(TOK, O0, O1, O2, O3, PART, N, D, PART_STRIDE, NT: tl.constexpr, C: tl.constexpr,
                      BLOCK_D: tl.constexpr, KEY16: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """If chunk c's last run starts in chunk c and goes on into the next chunk: its sum over the chunks
        it covers (PART[c, 1], then PART[k, 0] for k = c+1, ...), written to its row of each table's OUT."""
        c = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        col_ok = cols < D
        start = c * C
        end = tl.minimum(start + C, N)  # one past the chunk's last position
        tok = tl.load(TOK + end - 1).to(tl.int32)
        first = tl.load(TOK + start).to(tl.int32)
        before = tl.load(TOK + start - 1, mask=start > 0, other=-1).to(tl.int32)
        after = tl.load(TOK + end, mask=end < N, other=-1).to(tl.int32)
        starts_here = (first != tok) | (before != tok)
        if (after == tok) & starts_here:
            for e in tl.static_range(NT):
                part = PART + e * PART_STRIDE
                acc = tl.load(part + (2 * c + 1) * D + cols, mask=col_ok, other=0.0)
                k = c + 1
                go = after == tok
                while go:
                    acc += tl.load(part + (2 * k) * D + cols, mask=col_ok, other=0.0)
                    k_end = tl.minimum(k * C + C, N)
                    k_tail = tl.load(TOK + k_end - 1).to(tl.int32)
                    k_after = tl.load(TOK + k_end, mask=k_end < N, other=-1).to(tl.int32)
                    go = (k_tail == tok) & (k_after == tok)
                    k += 1
                out = _pick(e, O0, O1, O2, O3)
                tl.store(out + _row(tok, KEY16) * D + cols, _cast(acc, out, EMULATE_RNE), mask=col_ok)

    return _chunk_kernel, _chain_kernel


def launch(keys: Tensor, order: Tensor, grads: list[Tensor], outs: list[Tensor],
           cfg: dict[str, int] | None = None) -> None:
    """Add each g's rows (N, D) into its out (V, D), zeros on entry, by the sorted keys (N,; `sort_keys`)
    and order (the sort's permutation: sorted position -> row of g); up to MAX_TABLES tables."""
    chunk_kernel, chain_kernel = _build_kernel()
    if not 1 <= len(grads) == len(outs) <= MAX_TABLES:
        raise ValueError(f"embeddings.launch: 1 to {MAX_TABLES} gradients and as many outputs, got "
                         f"{len(grads)} and {len(outs)}")
    cfg = dict(KERNEL_CONFIG, **(cfg or {}))
    N, D = grads[0].shape
    C, BD = cfg["CHUNK"], cfg["BLOCK_D"]
    chunks = triton.cdiv(N, C)
    part = torch.empty((len(grads), chunks, 2, D), dtype=torch.float32, device=grads[0].device)
    grid = (chunks, triton.cdiv(D, BD))
    g4 = (grads + grads[:1] * MAX_TABLES)[:MAX_TABLES]  # unused slots: never read (NT tables only)
    o4 = (outs + outs[:1] * MAX_TABLES)[:MAX_TABLES]
    key16 = keys.dtype == torch.int16
    widen = grads[0].device.type != "cuda"  # the interpreter's bfloat16 products are wrong; float32's exact
    rne = _INTERPRETED and outs[0].dtype == torch.bfloat16
    chunk_kernel[grid](keys, order, *g4, *o4, part, N, D, part.stride(0), NT=len(grads), C=C, BLOCK_D=BD,
                       KEY16=key16, WIDEN=widen, IEEE=grads[0].dtype == torch.float32, EMULATE_RNE=rne,
                       num_warps=cfg["num_warps"])
    chain_kernel[grid](keys, *o4, part, N, D, part.stride(0), NT=len(grads), C=C, BLOCK_D=BD, KEY16=key16,
                       EMULATE_RNE=rne, num_warps=1)
