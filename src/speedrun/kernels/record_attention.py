"""`RecordGPT.attend` on a CUDA GPU: torch's FlashAttention varlen with a sliding window.

The record's attention is, per packed document, causal with a token-exact window: query i sees keys
i - w ... i. FlashAttention's varlen kernel computes exactly that with window (w, 0) and the
documents as its sequences (`torch.nn.attention.varlen.varlen_attn`, shipped with torch >= 2.10), so
this path is the model's function on bfloat16 inputs with no mask to build and no block list; the
paired layers' doubled rows and document bounds go through it unchanged. The float32 tests and the
CPU keep `record_parts.reference_attention` (FlashAttention runs in half precision only), and
`train.kernels=reference` keeps it everywhere. `tests/test_record_attention_gpu.py` holds this path to
the reference, forward and backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

Attend = Callable[[Tensor, Tensor, Tensor, Tensor, int, float], Tensor]


def _varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch < 2.10
        return None
    return varlen_attn


def varlen_attend(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, window: int, scale: float) -> Tensor:
    """`reference_attention`'s function through FlashAttention varlen: q, k, v (n, H, D) or (1, n, H, D),
    half precision on a GPU; cu_seqlens int (N + 1,) from 0 to n (empty trailing documents allowed)."""
    batched = q.dim() == 4
    if batched:
        q, k, v = q[0], k[0], v[0]
    cu = cu_seqlens.reshape(-1).to(device=q.device, dtype=torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())  # the kernel sizes its grid by it: one host read
    out = _varlen()(q, k, v, cu, cu, longest, longest, scale=scale, window_size=(window, 0))
    return out[None] if batched else out


def pick(kernels: str, device: torch.device) -> Attend | None:
    """The attention kernel for a run's `train.kernels` on `device`, or None for the model's reference."""
    if kernels == "reference" or device.type != "cuda" or _varlen() is None:
        return None
    return varlen_attend
