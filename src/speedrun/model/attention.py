"""Document-causal, block-sparse sliding-window attention.

The record's mask has three parts: causal, same document (a document starts
at each 50256 token), and a block-sparse window: each 128-token query block
sees at most its W nearest key blocks that the first two parts allow (its own
diagonal block always included). Which blocks are "nearest" is decided on
the block level: blocks entirely inside the query's document ("full") are
taken nearest first, up to W - 1 of them; blocks that are only partly
visible ("partial": the diagonal and document-boundary blocks) fill the rest,
at least one.

Three backends compute the same function:
- `flex`: FlexAttention with a `BlockMask` built from the block structure,
  with the kernel options of `flex_tiles.FLEX_OPTIONS` (tiles that divide
  the mask's blocks). The window is a tensor, so a new window size never
  recompiles. The mask is finer than the window's blocks, with the same
  function: the window is chosen among block_size (128-token) blocks, then
  each kept block is split into MASK_BLOCK (64-token) sub-blocks; those that
  no query can see (the upper half of a diagonal block, the corners of a
  document boundary) are dropped, and those wholly inside one document and
  below the diagonal become "full" (no mask_mod). On FineWeb-like documents
  (~420 tokens) that cuts the tiles the kernel visits by 11-25% and its
  masked tiles by about half: the step 4.8-5.1 ms shorter than on a
  128-token mask (72dcb66); the Gluon kernels are built on it too. The
  masks are rebuilt inside the compiled step every micro-step, so they are
  built cheaply: the window's blocks by rank (prefix sums) as dense (NB, NB)
  matrices, the lists the kernels read by one prefix-sum kernel each
  (`block_order`; its reference is an argsort).
- `gluon`: kernels of this project's own (`attn_gluon`, Hopper only) on the
  same 64-token block lists and document ids, forward and backward; `auto`
  picks it on an H100/H200 at the record's shapes (2026-12-04,
  b892373: -10 ms a step, the same loss).
- `dense`: a plain boolean (T, T) mask and `scaled_dot_product_attention`;
  the reference the tests hold FlexAttention and the Gluon kernels to, and
  the CPU path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from speedrun.config import MASK_BLOCK  # the block mask's granularity: a divisor of the block size
from speedrun.kernels import attn_gluon

from speedrun.kernels import block_order

EOT = 50256


def document_ids(tokens: Tensor) -> Tensor:
    """Document index of every token: increments at each 50256."""
    return (tokens == EOT).cumsum(0)


def narrow_ids(docs: Tensor, bound: int) -> Tensor:
    """docs as int32 when `bound` (known on the host: ids never exceed it) fits, else unchanged. The same
    comparisons either way; the Gluon kernels keep 32-bit ids in fewer registers (`attn_gluon`)."""
    return docs.to(torch.int32) if bound < 2**31 else docs


def segment_ids(num_tokens: int, segment_len: int, device) -> Tensor:
    """Fixed-length segments (independent sequences packed in one row)."""
    return torch.arange(num_tokens, device=device) // segment_len


@dataclass
class BlockStructure:
    """Per pair of (query block i, key block j): may i see some (partial) or every (full) token of
    j, causal and same document; and per query block how many of each."""

    docs: Tensor  # (T,) document id per token
    partial: Tensor  # (NB, NB) bool: some but not every token
    full: Tensor  # (NB, NB) bool: every token (strictly below the diagonal, one document)
    partial_num: Tensor  # (NB,) int32
    full_num: Tensor


def _nearer(mask: Tensor) -> Tensor:
    """Per entry of a bool (R, N) mask: how many True entries lie at higher columns in its row
    (for a True entry, its rank counted from the nearest, 0 = nearest)."""
    c = mask.to(torch.int32).cumsum(dim=-1, dtype=torch.int32)
    return c[..., -1:] - c


def _block_classes(docs: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
    """(NB, NB) bool pair: query block i may see some / every token of key block j
    (causal and same document), from the first and last document id of each block."""
    nb = docs.numel() // block_size
    b = torch.arange(nb, device=docs.device)
    low = docs.view(nb, block_size)[:, 0]
    high = docs.view(nb, block_size)[:, -1]
    any_ = (b[:, None] >= b) & (low[:, None] <= high) & (high[:, None] >= low)
    all_ = (b[:, None] > b) & (low[:, None] == high) & (high[:, None] == low)
    return any_, all_


def block_structure(docs: Tensor, block_size: int) -> BlockStructure:
    """Classify key blocks for every query block from the document ids."""
    any_, all_ = _block_classes(docs, block_size)
    partial = any_ & ~all_
    return BlockStructure(docs, partial, all_, partial.sum(-1, dtype=torch.int32), all_.sum(-1, dtype=torch.int32))


def window_counts(s: BlockStructure, window_blocks: Tensor) -> tuple[Tensor, Tensor]:
    """How many partial and full blocks each query block keeps under window W."""
    w = window_blocks.clamp_min(1)
    full = torch.clamp_max(s.full_num, w - 1)
    partial = torch.clamp_max(s.partial_num, torch.clamp_min(w - s.full_num, 1))
    return partial, full


def kept_blocks(s: BlockStructure, window_blocks: Tensor) -> tuple[Tensor, Tensor]:
    """(NB, NB) bool pair: the partial and full blocks each query block keeps under the window,
    the nearest of each kind (`window_counts` of them)."""
    partial, full = window_counts(s, window_blocks)
    return (s.partial & (_nearer(s.partial) < partial[:, None]),
            s.full & (_nearer(s.full) < full[:, None]))


# ---------------------------------------------------------------- dense reference


def dense_mask(docs: Tensor, window_blocks: int | Tensor, block_size: int) -> Tensor:
    """The full boolean (T, T) mask: query i may attend key j.

    Computed from the token-level rule directly (not from `block_structure`),
    so that it is an independent reference for the FlexAttention block mask.
    """
    t = docs.numel()
    nb = t // block_size
    pos = torch.arange(t, device=docs.device)
    allowed = (pos[:, None] >= pos[None, :]) & (docs[:, None] == docs[None, :])
    blocks = allowed.view(nb, block_size, nb, block_size)
    b = torch.arange(nb, device=docs.device)
    any_ = blocks.any(dim=3).any(dim=1)
    full = blocks.all(dim=3).all(dim=1) & (b[:, None] > b[None, :])
    partial = any_ & ~full
    w = torch.as_tensor(window_blocks, device=docs.device).clamp_min(1)
    # rank of each block among its kind, counted from the nearest (highest index)
    full_rank = full.flip(-1).cumsum(-1).flip(-1) - 1
    partial_rank = partial.flip(-1).cumsum(-1).flip(-1) - 1
    nfull = full.sum(-1, keepdim=True)
    keep = (full & (full_rank < w - 1)) | (partial & (partial_rank < torch.clamp_min(w - nfull, 1)))
    keep_tokens = keep[:, None, :, None].expand(nb, block_size, nb, block_size).reshape(t, t)
    return allowed & keep_tokens


def dense_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """q, k, v: (B, H, T, D); mask (T, T) bool."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


# ---------------------------------------------------------------- FlexAttention


def refined_blocks(s: BlockStructure, window_blocks: Tensor, block_size: int, mask_block: int
                   ) -> tuple[Tensor, Tensor]:
    """The window's kept blocks at mask_block granularity (a divisor of block_size): (partial, full),
    (NB', NB') bool. A sub-block is kept when its block is kept under the window and some query in it
    may see some key in it; full when every query sees every key."""
    if block_size % mask_block:
        raise ValueError(f"attention: block_size {block_size} is not a multiple of the mask's "
                         f"{mask_block}-token blocks")
    partial, full = kept_blocks(s, window_blocks)
    if mask_block == block_size:
        return partial, full
    r = block_size // mask_block
    kept = (partial | full).repeat_interleave(r, dim=0).repeat_interleave(r, dim=1)
    any_, all_ = _block_classes(s.docs, mask_block)
    return kept & any_ & ~all_, kept & all_


def flex_block_mask(s: BlockStructure, window_blocks: Tensor, block_size: int, order_kernel: str = "auto"):
    """The FlexAttention BlockMask of the window at MASK_BLOCK granularity; `order_kernel` how the lists
    are ordered (`block_order.order`'s impl).

    Per query block the kept key blocks, nearest first (as the record orders them), and per key
    block the query blocks that keep it, ascending, as FlexAttention's backward wants them: the
    same counts and indices `BlockMask.from_kv_blocks` would derive, without its `torch.vmap`
    (twice nested, for the batch and head dimensions), which is the costliest thing Dynamo traces
    in the whole model: about 0.6 s for each of the two masks, in every compiled graph, on every
    start. Entries past each list's count are never read and are not the record's."""
    from torch.nn.attention.flex_attention import BlockMask

    docs = s.docs

    def document_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (docs[q_idx] == docs[kv_idx])

    partial, full = refined_blocks(s, window_blocks, block_size, MASK_BLOCK)
    (kv_num, kv_idx), (fkv_num, fkv_idx) = (block_order.order(m, True, order_kernel) for m in (partial, full))
    mask = BlockMask.from_kv_blocks(
        kv_num[None, None].contiguous(),
        kv_idx[None, None].contiguous(),
        fkv_num[None, None].contiguous(),
        fkv_idx[None, None].contiguous(),
        BLOCK_SIZE=MASK_BLOCK,
        mask_mod=document_causal,
        compute_q_blocks=False,
    )
    (q_num, q_idx), (fq_num, fq_idx) = (block_order.order(m.T, False, order_kernel) for m in (partial, full))
    mask.q_num_blocks, mask.q_indices = q_num[None, None], q_idx[None, None]
    mask.full_q_num_blocks, mask.full_q_indices = fq_num[None, None], fq_idx[None, None]
    return mask


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention as _flex

    return torch.compile(_flex, dynamic=False)


def flex_attention(q: Tensor, k: Tensor, v: Tensor, block_mask, scale: float) -> Tensor:
    """FlexAttention with this project's tiles (`flex_tiles.FLEX_OPTIONS`), always through the compiler.

    Called eagerly, FlexAttention evaluates `mask_mod` densely and ignores the
    block sparsity, which is where the sliding window lives: it would compute
    a different function. So outside a compiled region it goes through its
    own compiled wrapper. `flex_tiles` is imported here, not with this module:
    it imports Inductor's heuristics (about 2 s), which only FlexAttention needs.
    """
    from torch.nn.attention.flex_attention import flex_attention as _flex

    from speedrun.kernels.flex_tiles import FLEX_OPTIONS

    fn = _flex if torch.compiler.is_compiling() else _compiled_flex()
    return fn(q, k, v, block_mask=block_mask, scale=scale, kernel_options=FLEX_OPTIONS)


# ---------------------------------------------------------------- interface


class AttentionMasks:
    """Masks for one packed sequence, built once per forward, used by every layer.

    The long- and short-window masks are kept in the form the chosen backend
    wants; `attend` runs that backend on one of them. `order_kernel`: how the
    block lists are ordered (`block_order.order`'s impl).
    """

    def __init__(self, docs: Tensor, long_blocks: Tensor, short_blocks: Tensor, block_size: int, backend: str, *,
                 order_kernel: str = "auto"):
        self.backend = backend
        if backend in ("flex", "gluon"):
            s = block_structure(docs, block_size)
            self.long = flex_block_mask(s, long_blocks, block_size, order_kernel)
            self.short = flex_block_mask(s, short_blocks, block_size, order_kernel)
        if backend == "gluon":  # the kernels read the BlockMasks' lists and the document ids themselves
            self.docs = docs
            self.long, self.short = attn_gluon.block_lists(self.long), attn_gluon.block_lists(self.short)
        elif backend != "flex":
            self.long = dense_mask(docs, long_blocks, block_size)
            self.short = self.long if short_blocks is long_blocks else dense_mask(docs, short_blocks, block_size)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, long: bool, scale: float) -> Tensor:
        mask = self.long if long else self.short
        if self.backend == "flex":
            return flex_attention(q, k, v, mask, scale)
        if self.backend == "gluon":
            return attn_gluon.attention(q, k, v, self.docs, mask, scale)
        return dense_attention(q, k, v, mask, scale)


def pick_backend(requested: str, device: torch.device, tiles: int | None = None, head_dim: int | None = None,
                 dtype: torch.dtype = torch.bfloat16, reference: bool = False) -> str:
    """`auto`: the Gluon kernels (`attn_gluon`) on a Hopper GPU in bfloat16 at the shapes they were measured on
    (64-token mask blocks, head_dim 128) where Gluon imports, FlexAttention on other CUDA devices, dtypes and
    shapes, the dense reference elsewhere; with `reference` (train.kernels=reference) never the project's own
    kernels: FlexAttention on a GPU (the dense reference's memory is quadratic in the row), dense on a CPU.
    ValueError where an explicit `gluon` cannot run."""
    if requested == "gluon":
        if not _hopper(device):
            raise ValueError(f"attention.backend=gluon: its kernels are for Hopper GPUs (sm_90); this run's device "
                             f"is {device}: use attention.backend=auto")
        if dtype != torch.bfloat16:
            raise ValueError(f"attention.backend=gluon: its kernels take bfloat16, this run computes in {dtype} "
                             f"(train.dtype): use attention.backend=auto")
        if not attn_gluon.available():
            raise ValueError("attention.backend=gluon: Triton's Gluon (Hopper) does not import here")
    if requested != "auto":
        return requested
    if device.type != "cuda":
        return "dense"
    if (not reference and _hopper(device) and tiles == 64 and head_dim == 128 and dtype == torch.bfloat16
            and attn_gluon.available()):
        return "gluon"
    return "flex"


def _hopper(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)
