"""The embedding tables' gradients added into the step's sums row by row (`embeddings.lookups`).

Inductor's dense embedding backward, in every micro-step and for each of the record's four (V, D)
tables: fill a float32 (V, D) buffer with zeros (154 MB at V = 50,304, D = 768), add each token's
gradient row into it with float32 atomics (fused into the kernel that makes those rows), then read the
whole buffer again to round it to bfloat16 and add it into the step's sum. About 460 MB a table, 15 GB a
step on one GPU, although a micro-step's 49,152 tokens touch only some of the rows (8,521 of the
50,304 on average, a sixth, over 200 micro-steps of the proxy's first shard).

A trainer keeps the sums as buffers for the run (`train/grad_accum.py`), and then the dense table is not
needed. Here each table gets a float32 scratch table of its own, also kept for the run and zero between
micro-steps, and its lookup's backward (`_LookupInto`) does two things:
1. it adds the gradient rows into the scratch table: on the GPU by `index_put_(accumulate=True)`, which
   Inductor compiles into the same fused atomics as the dense path, minus the fill; on the CPU by
   `index_add_`, which adds each row's tokens in their order at any thread count, as the CPU's dense
   backward does, where eager `index_put_(accumulate=True)` splits the tokens between threads that add
   with atomics once the gradient has 32,768 elements (the demo's 256 tokens of 128 columns), and two
   runs of one seed drift apart (Inductor compiles `index_add_` into the same atomics as `index_put_`);
2. `speedrun::add_rows_` visits only the rows the tokens touched: each row's float32 sum is rounded to
   bfloat16, added into the step's sum as `grad_accum.add_gradient` adds it, and set back to zero.

The values are the dense path's: the same float32 sums of the same rows, the same rounding and the
same add. Compiled, both paths' sums are atomics (in an order that neither fixes); eager on the CPU,
both add in the tokens' order, so a float32 table gets the dense path's bits at any thread count (a
bfloat16 one differs there: the CPU's eager dense backward sums in bfloat16). A row no token touched
would get the dense path's +0 added; here it is left as it is, which differs only where a sum is -0
(then -0, not +0). The CPU tests hold the whole path to the dense one bit for bit, compiled and eager
on two threads, and the kernel to the reference under Triton's interpreter.

`add_rows_` runs one of two implementations (`kernel_choice`): "torch" (the reference: the tokens'
distinct rows by `torch.unique`, gathered, added and scattered back) and "triton" (CUDA, or the CPU
under TRITON_INTERPRET=1): `_claim_kernel` writes each token's position into an owner table at its
row, so that one position owns each row, and `_add_rows_kernel` has only the owners read and write
their rows, so a row repeated by many tokens is visited once and no row is visited by two programs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from speedrun.train.grad_accum import add_gradient
from speedrun.kernels.choice import built_once, pick_impl

TOTAL_DTYPES = (torch.bfloat16, torch.float32)
# tokens and columns a program takes, warps
KERNEL_CONFIG = {"BLOCK_T": 16, "BLOCK_D": 256, "num_warps": 4}


def lookup_into(tokens: Tensor, table: Tensor, total: Tensor, scratch: Tensor, impl: str = "auto") -> Tensor:
    """F.embedding(tokens, table), whose backward adds the table's gradient into `total` in place (with
    the float32 `scratch`, zero on entry and again on exit) and gives the table none; impl: `add_rows_`'s."""
    return _LookupInto.apply(tokens, table, total, scratch, impl)


class _LookupInto(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens: Tensor, table: Tensor, total: Tensor, scratch: Tensor, impl: str) -> Tensor:
        ctx.save_for_backward(tokens, total, scratch)
        ctx.impl = impl
        return F.embedding(tokens, table)

    @staticmethod
    def backward(ctx, grad: Tensor):
        tokens, total, scratch = ctx.saved_tensors
        flat = tokens.reshape(-1)
        rows = grad.reshape(flat.shape[0], -1).float()
        if scratch.device.type == "cpu":  # in the tokens' order, at any thread count (module docstring)
            scratch.index_add_(0, flat, rows)
        else:
            scratch.index_put_((flat,), rows, accumulate=True)
        torch.ops.speedrun.add_rows_(flat, scratch, total, ctx.impl)
        return None, None, None, None, None


def _check(tokens: Tensor, scratch: Tensor, total: Tensor) -> None:
    if tokens.dim() != 1 or tokens.is_floating_point() or tokens.is_complex():
        raise ValueError(f"add_rows_: tokens must be 1-D integers, got {tuple(tokens.shape)} {tokens.dtype}")
    if scratch.dtype != torch.float32 or scratch.dim() != 2 or not scratch.is_contiguous():
        raise ValueError(f"add_rows_: scratch must be a contiguous 2-D float32 table, got "
                         f"{tuple(scratch.shape)} {scratch.dtype}")
    if total.shape != scratch.shape or total.dtype not in TOTAL_DTYPES or not total.is_contiguous():
        raise ValueError(f"add_rows_: total must be a contiguous {tuple(scratch.shape)} table in one of "
                         f"{TOTAL_DTYPES}, got {tuple(total.shape)} {total.dtype}")
    if not tokens.device == scratch.device == total.device:
        raise ValueError("add_rows_: tokens, scratch and total must be on one device")


@torch.library.custom_op("speedrun::add_rows_", mutates_args=("scratch", "total"))
def add_rows_(tokens: Tensor, scratch: Tensor, total: Tensor, impl: str = "auto") -> None:
    """For each distinct row v of tokens: total[v] += scratch[v] (as `grad_accum.add_gradient` adds a
    gradient rounded to total's dtype), then scratch[v] = 0. Other rows are not read or written."""
    _check(tokens, scratch, total)
    if pick_impl(tokens, impl) == "triton":
        launch(tokens, scratch, total)
    else:
        reference(tokens, scratch, total)


@add_rows_.register_fake
def _(tokens, scratch, total, impl="auto"):
    return None


def reference(tokens: Tensor, scratch: Tensor, total: Tensor) -> None:
    """add_rows_ in plain PyTorch."""
    rows = torch.unique(tokens).long()
    sums = scratch.index_select(0, rows).to(total.dtype)
    total.index_copy_(0, rows, add_gradient(total.index_select(0, rows), sums))
    scratch.index_fill_(0, rows, 0.0)


# --------------------------------------------------------------------------- Triton kernels

triton = tl = None  # set by built_once on first use
_round_bf16 = _claim_kernel = _add_rows_kernel = None


@built_once
def _build_kernel(interpreted: bool):
    """Define the kernels (once, `built_once`); interpreted: TRITON_INTERPRET=1 now."""
    global _round_bf16, _claim_kernel, _add_rows_kernel  # module globals: the interpreter re-runs them

    @triton.jit
    def _round_bf16(x, EMULATE_RNE: tl.constexpr):
        """float32 x rounded to bfloat16 (nearest, ties to even), kept in float32; in integer arithmetic
        under the interpreter, whose float32 -> bfloat16 conversion truncates (NaN kept)."""
        if EMULATE_RNE:
            u = x.to(tl.uint32, bitcast=True)
            r = (((u + (((u >> 16) & 1) + 0x7FFF)) >> 16) << 16).to(tl.float32, bitcast=True)
            return tl.where(x != x, x, r)
        else:
            return x.to(tl.bfloat16).to(tl.float32)

    @triton.jit
    def _claim_kernel(TOK, OWNER, N, BLOCK: tl.constexpr):
        """OWNER[tokens[p]] = p for every position p: where positions share a row, one of them stays."""
        p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = p < N
        row = tl.load(TOK + p, mask=ok, other=0).to(tl.int64)
        tl.store(OWNER + row, p, mask=ok)

    @triton.jit
    def _add_rows_kernel(TOK, OWNER, SCRATCH, TOTAL, N, D, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                         BF16: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """For the positions that own their row: TOTAL[row] += round(SCRATCH[row]); SCRATCH[row] = 0."""
        p = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        ok = p < N
        row = tl.load(TOK + p, mask=ok, other=0).to(tl.int64)
        own = ok & (tl.load(OWNER + row, mask=ok, other=-1) == p)
        mask = own[:, None] & (cols < D)[None, :]
        at = row[:, None] * D + cols[None, :]
        s = tl.load(SCRATCH + at, mask=mask, other=0.0)
        t = tl.load(TOTAL + at, mask=mask, other=0.0).to(tl.float32)
        if BF16:
            new = _round_bf16(t + _round_bf16(s, EMULATE_RNE), EMULATE_RNE)
        else:
            new = t + s
        # every thread's loads before any thread's stores: the compiler may lay the zeros out over other
        # threads than the loaded sums, and one thread would zero a sum that another has not read yet
        tl.debug_barrier()
        tl.store(TOTAL + at, new.to(TOTAL.dtype.element_ty), mask=mask)
        tl.store(SCRATCH + at, tl.zeros_like(s), mask=mask)

    return _claim_kernel, _add_rows_kernel, interpreted


def launch(tokens: Tensor, scratch: Tensor, total: Tensor, cfg: dict[str, int] | None = None) -> None:
    """add_rows_ by the two Triton kernels; cfg overrides KERNEL_CONFIG."""
    claim_kernel, rows_kernel, interpreted = _build_kernel()
    cfg = dict(KERNEL_CONFIG, **(cfg or {}))
    N, (V, D) = tokens.shape[0], scratch.shape
    if N == 0:
        return
    owner = torch.empty(V, dtype=torch.int32, device=tokens.device)
    claim_kernel[(triton.cdiv(N, 1024),)](tokens, owner, N, BLOCK=1024, num_warps=4)
    bt, bd = cfg["BLOCK_T"], cfg["BLOCK_D"]
    rows_kernel[(triton.cdiv(N, bt), triton.cdiv(D, bd))](
        tokens, owner, scratch, total, N, D, BLOCK_T=bt, BLOCK_D=bd, BF16=total.dtype == torch.bfloat16,
        EMULATE_RNE=interpreted, num_warps=cfg["num_warps"])

