"""What serves the 2026 record's seams on a CUDA GPU (`RecordGPT.kernels`): torch's FlashAttention
varlen with a sliding window for `attend` and `dc_term`, `torch._scaled_mm` for the FP8 products,
the fused head loss (`record_ce`) for the training loss (with the FP8 head's products when it
trains), and on Hopper the ReLU² kernels of `relu2_mlp` for the MLP where it runs in bf16
(evaluation, or training with `fp8.mlp` off) and for the FP8 MLP's bf16 backward.

The record's bf16 MLP is the 2025 model's function with W2 stored transposed: relu(a·W1ᵀ)² rounded
to bf16, its backward dpre = 2·(g·W2ᵀ)·√post with relu(pre) recovered from post (spec "FP8", the
MLP backward). `relu2_mlp`'s kernels compute exactly that with the square in the forward product's
epilogue and the derivative in the backward's, so neither the pre-activation nor g·W2ᵀ is written.

The record's attention is, per packed document, causal with a token-exact window: query i sees keys
i - w ... i. FlashAttention's varlen kernel computes exactly that with window (w, 0) and the
documents as its sequences (`torch.nn.attention.varlen.varlen_attn`, shipped with torch >= 2.10), so
this path is the model's function on bfloat16 inputs with no mask to build and no block list; the
paired layers' doubled rows and document bounds go through it unchanged. The float32 tests and the
CPU keep `record_parts.reference_attention` (FlashAttention runs in half precision only), and
`train.kernels=reference` keeps it everywhere. `tests/test_record_attention_gpu.py` holds this path to
the reference, forward and backward. The kernel sizes its grid by the longest document: the trainer
passes the stage's cut length (`longest`), a constant of the stage, so that a compiled step reads
nothing back from the device; without it the batch's longest document is read once.

Layer 10's DC term has kernels of its own (`record_dc`: the six heads' probabilities mixed once, then
multiplied by every value head). They replaced six calls of the attention kernel on each value head
broadcast to every head (85 ms a step of device time at the record's stage 2 on an H200, 2026-12-06,
against the kernels' 28.5); without Triton the term is the reference's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from speedrun.kernels import record_dc, relu2_mlp
from speedrun.kernels.choice import TRITON_FOUND
from speedrun.kernels.record_ce import fp8_head_training_loss, fused_training_loss
from speedrun.kernels.record_fp8 import scaled_product
from speedrun.model.record import RecordKernels
from speedrun.model.record_fp8 import reference_product


def _varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch < 2.10
        return None
    return varlen_attn


def varlen_attend(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, window: int, scale: float,
                  longest: int | None = None) -> Tensor:
    """`reference_attention`'s function through FlashAttention varlen: q, k, v (n, H, D) or (1, n, H, D),
    half precision on a GPU; cu_seqlens int (N + 1,) from 0 to n (empty trailing documents allowed);
    longest: no document is longer (None: read from cu_seqlens)."""
    batched = q.dim() == 4
    if batched:
        q, k, v = q[0], k[0], v[0]
    cu = cu_seqlens.reshape(-1).to(device=q.device, dtype=torch.int32)
    if longest is None:
        longest = int((cu[1:] - cu[:-1]).max())  # one host read
    out = _varlen()(q, k, v, cu, cu, longest, longest, scale=scale, window_size=(window, 0))
    return out[None] if batched else out


def relu2_product(a: Tensor, w1: Tensor, w2: Tensor, impl: str = "auto") -> Tensor:
    """relu(a·W1ᵀ)²·W2 in bf16 by `relu2_mlp` (module docstring): a (n, width), W1 and W2 (hidden,
    width) as the bank holds them; the kernel takes W2ᵀ. impl as `relu2_mlp.pick`."""
    return relu2_mlp.relu2_mlp(a, w1, w2.T, impl)


def relu2_backward(g: Tensor, a: Tensor, w1: Tensor, w2: Tensor, post: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`record_fp8.mlp_backward_bf16` by `relu2_mlp`'s backward: dpre made in the epilogue of g·W2ᵀ
    (relu(pre) = bf16(√post), the reference's), so neither g·W2ᵀ nor a pass over it is written. The
    kernel's W2ᵀ is (width, hidden); its dW2ᵀ comes back transposed."""
    da, dw1, dw2_t = torch.ops.speedrun.relu2_mlp_backward(g.contiguous(), a, w1, w2.T.contiguous(), post)
    return da, dw1, dw2_t.T


def pick(kernels: str, device: torch.device) -> RecordKernels:
    """What serves the record's seams for a run's `train.kernels` on `device`: the one place that
    chooses. The references (an empty `RecordKernels`) on the CPU, under `reference`, and where
    torch has no varlen attention; FP8 products by `_scaled_mm` where the GPU has FP8; the fused
    head loss and the DC kernels (`record_dc`) on every GPU, the head's FP8 products fused with the
    loss where FP8 runs; the bf16 MLP's kernels, forward and the FP8 MLP's backward, where they run
    (capability 9.0)."""
    if kernels == "reference" or device.type != "cuda" or _varlen() is None:
        return RecordKernels()
    capability = torch.cuda.get_device_capability(device)
    fp8, hopper = capability >= (8, 9), capability[0] == 9 and relu2_mlp.TRITON_FOUND
    dc = record_dc.dc_correction if TRITON_FOUND else None
    return RecordKernels("varlen", varlen_attend, dc, scaled_product if fp8 else reference_product,
                         fused_training_loss, relu2_product if hopper else None,
                         fp8_head_training_loss if fp8 else None, relu2_backward if hopper else None)
