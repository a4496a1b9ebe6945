"""A compile-friendly stand-in for the GPU's record attention kernels on the CPU.

The reference attention loops over documents on the host (`cu_seqlens.tolist()`), which breaks a
Dynamo graph; the GPU's varlen kernel does not run on a CPU. The tests that trace the record's step
whole use this instead: the reference's semantics (per document, causal, query i sees keys i - w … i)
as one dense masked product, with no host read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from speedrun.kernels.record_attention import dc_by_attention
from speedrun.model.record import RecordKernels


def dense_attend(q, k, v, cu_seqlens, window, scale, longest):
    """reference_attention's function without a loop over documents: an (n, n) mask."""
    n = q.shape[0]
    pos = torch.arange(n, device=q.device)
    doc = torch.searchsorted(cu_seqlens.reshape(-1)[1:].contiguous(), pos, right=True)
    i, j = pos[:, None], pos[None, :]
    visible = (doc[:, None] == doc[None, :]) & (j <= i) & (i - j <= window)
    y = F.scaled_dot_product_attention(*(t.transpose(0, 1).float() for t in (q, k, v)), attn_mask=visible, scale=scale)
    return y.transpose(0, 1).to(q.dtype)


def dense_dc(q, k, v, cu_seqlens, w1, w2, scale, keys, eps, longest):
    return dc_by_attention(dense_attend, q, k, v, cu_seqlens, w1, w2, scale, keys, eps, longest)


def dense_kernels(kernels: str = "auto", device: torch.device | None = None) -> RecordKernels:
    """`record_attention.pick`'s form, serving the stand-ins."""
    return RecordKernels("dense", dense_attend, dense_dc)
