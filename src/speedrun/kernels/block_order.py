"""FlexAttention's block lists in order: a Triton kernel for `attention`'s stable argsort of 0/1 rows.

Each micro-step rebuilds both windows' block masks inside the compiled step, and each mask needs
four lists: per query block its kept key blocks, per key block the query blocks that keep it, each
for the partial and the full blocks. A list is a row of a bool (R, N) matrix reordered "True entries
first, then False, each group by column" (nearest first for keys, ascending for queries), which
`reference` computes as a stable argsort. On an H200 the eight sorts of a micro-step took 1.4 ms of
a step, and their copies 0.4 ms more (profiled 2026-12-01, b01c7eb): a radix sort per call, for a
matrix of 768 x 768 bytes.

The order needs no sort. In a row, a True entry's place is the number of True entries before it
in the chosen direction; a False entry's is the row's True count plus the False entries before
it. `order` computes those with one prefix sum per row and scatters each column index to its
place: one program per row, a few microseconds a call. A sort-free form written in PyTorch was
tried before and Inductor (2.11) failed to generate code for its scatter inside the model's graph
(2026-12-01, a400599); as a custom op the kernel is opaque to Inductor, which
only sees its fake.

The op reads the matrix through its strides, so the query lists come from the transposed view
with no copy. "torch" is the reference (the argsort), "triton" the kernel (CUDA, or a CPU under
TRITON_INTERPRET=1), "auto" the kernel on CUDA where Triton is installed. Both give the same
permutation, which is unique: the tests hold the kernel to the reference bit for bit. With the
optimisers' kernels, the step was 2.86 ms faster on an H200 (2026-12-01, 4343345).
"""

from __future__ import annotations

import torch
from torch import Tensor

from speedrun.kernels.choice import IMPLS, TRITON_FOUND, built_once, pick_impl  # noqa: F401 (its interface)

triton = tl = None  # set by built_once on first use
_order_kernel = None


@built_once
def _build_kernel(interpreted: bool):
    """Define the kernel (once, `built_once`); interpreted: TRITON_INTERPRET=1 now."""
    global _order_kernel  # module globals: the interpreter re-executes the source with them

    @triton.jit
    def _order_kernel(M, COUNT, IDX, N, stride_r, stride_c, BLOCK: tl.constexpr, HIGHEST_FIRST: tl.constexpr):
        """Row r of the uint8 0/1 matrix M (strided): COUNT[r] = its ones, IDX[r] its columns, ones
        first, then zeros, each group highest column first (or lowest)."""
        r = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < N
        m = (tl.load(M + r * stride_r + cols.to(tl.int64) * stride_c, mask=ok, other=0) != 0).to(tl.int32)
        z = tl.where(ok, 1 - m, 0)
        ones_upto = tl.cumsum(m, axis=0)  # inclusive prefix sums
        zeros_upto = tl.cumsum(z, axis=0)
        ones = tl.sum(m, axis=0)
        zeros = tl.sum(z, axis=0)
        if HIGHEST_FIRST:
            place = tl.where(m != 0, ones - ones_upto, ones + zeros - zeros_upto)
        else:
            place = tl.where(m != 0, ones_upto - 1, ones + zeros_upto - 1)
        tl.store(IDX + r * N + place, cols, mask=ok)
        tl.store(COUNT + r, ones)

    return _order_kernel


def reference(mask: Tensor, highest_first: bool) -> tuple[Tensor, Tensor]:
    """(ones per row int32 (R,), column order int32 (R, N)) as a stable argsort of the 0/1 values."""
    m = mask.to(torch.int8).contiguous()
    if highest_first:
        idx = m.argsort(dim=-1, stable=True).flip(-1)
    else:
        idx = m.argsort(dim=-1, descending=True, stable=True)
    return mask.sum(dim=-1, dtype=torch.int32), idx.to(torch.int32)


def launch(mask: Tensor, highest_first: bool) -> tuple[Tensor, Tensor]:
    """The kernel: `reference`'s result for a bool (R, N) matrix of any strides."""
    R, N = mask.shape
    count = torch.empty((R,), dtype=torch.int32, device=mask.device)
    idx = torch.empty((R, N), dtype=torch.int32, device=mask.device)
    if R and N:
        kernel = _build_kernel()
        m = mask.view(torch.uint8)
        block = max(16, triton.next_power_of_2(N))
        kernel[(R,)](m, count, idx, N, m.stride(0), m.stride(1), BLOCK=block, HIGHEST_FIRST=highest_first,
                     num_warps=4 if block <= 1024 else 8)
    elif R:
        count.zero_()
    return count, idx


@torch.library.custom_op("speedrun::block_order", mutates_args=())
def block_order_op(mask: Tensor, highest_first: bool) -> tuple[Tensor, Tensor]:
    """`launch` as an op that torch.compile keeps whole (Inductor sees only the fake)."""
    return launch(mask, highest_first)


@block_order_op.register_fake
def _(mask, highest_first):
    R, N = mask.shape
    return mask.new_empty((R,), dtype=torch.int32), mask.new_empty((R, N), dtype=torch.int32)


def order(mask: Tensor, highest_first: bool, impl: str = "auto") -> tuple[Tensor, Tensor]:
    """Per row of a bool (R, N) matrix: the number of True entries (int32), and the column indices,
    int32, the True ones first, then the False ones, each group highest column first (or lowest)."""
    if mask.dim() != 2 or mask.dtype != torch.bool:
        raise ValueError(f"block_order: want a 2-D bool matrix, got {tuple(mask.shape)} {mask.dtype}")
    if pick_impl(mask, impl) == "torch":
        return reference(mask, highest_first)
    if not TRITON_FOUND:
        raise RuntimeError("block_order impl='triton' needs Triton installed")
    return torch.ops.speedrun.block_order(mask, highest_first)
