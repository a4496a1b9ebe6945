"""A compile-friendly stand-in for the GPU's record attention kernels on the CPU.

The reference attention loops over documents on the host (`cu_seqlens.tolist()`), which breaks a
Dynamo graph; the GPU's varlen kernel does not run on a CPU. The tests that trace the record's step
whole use this instead: the reference's semantics (per document, causal, query i sees keys i - w … i)
as one dense masked product, with no host read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from speedrun.model.record import RecordKernels
from speedrun.model.record_parts import norm


def dense_attend(q, k, v, cu_seqlens, window, scale, longest):
    """reference_attention's function without a loop over documents: an (n, n) mask."""
    n = q.shape[0]
    pos = torch.arange(n, device=q.device)
    doc = torch.searchsorted(cu_seqlens.reshape(-1)[1:].contiguous(), pos, right=True)
    i, j = pos[:, None], pos[None, :]
    visible = (doc[:, None] == doc[None, :]) & (j <= i) & (i - j <= window)
    y = F.scaled_dot_product_attention(*(t.transpose(0, 1).float() for t in (q, k, v)), attn_mask=visible, scale=scale)
    return y.transpose(0, 1).to(q.dtype)


def dc_by_attention(attend, q, k, v, cu_seqlens, w1, w2, scale, keys=112, eps=1e-6, longest=None):
    """`record_parts.dc_correction`'s term (n, H, D) float32 through an attention function: for each
    value head h, one windowed attention (window keys - 1) of every query head against v_h broadcast
    to every head, mixed over the query heads by w1's norm. q, k, v (n, H, D) or (1, n, H, D)."""
    if q.dim() == 4:
        shape = q.shape[1:3]
        return dc_by_attention(attend, q[0], k[0], v[0], cu_seqlens, w1.reshape(shape), w2.reshape(shape),
                               scale, keys, eps, longest)[None]
    w1n = norm(w1.float(), eps)
    terms = []
    for h in range(v.shape[1]):
        spread = attend(q, k, v[:, h:h + 1].expand_as(v).contiguous(), cu_seqlens, keys - 1, scale, longest)
        terms.append(torch.einsum("ng,ngd->nd", w1n, spread.float()))
    return w2.float()[..., None] * torch.stack(terms, dim=1)


def dense_dc(q, k, v, cu_seqlens, w1, w2, scale, keys, eps, longest):
    return dc_by_attention(dense_attend, q, k, v, cu_seqlens, w1, w2, scale, keys, eps, longest)


def dense_kernels(kernels: str = "auto", device: torch.device | None = None) -> RecordKernels:
    """`record_attention.pick`'s form, serving the stand-ins."""
    return RecordKernels("dense", dense_attend, dense_dc)
