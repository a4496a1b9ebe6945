"""The 2026 record's FP8 products on a GPU: `record_fp8.reference_product` by `torch._scaled_mm`.

The reference dequantises both FP8 operands to float32, multiplies and scales once; every product
of two FP8 values is exact in float32, so `_scaled_mm` computes the same numbers up to the order of
its float32 accumulation. The forward's e4m3 × e4m3 products use fast accumulation, as the record's
do; the gradient products (one e5m2 operand, or a float32 result) accumulate in full. `_scaled_mm`
reads its first operand row-major and its second column-major: the reference's (a, b_t) layout is
exactly that once both are contiguous. `tests/test_record_fp8_gpu.py` holds it to the reference.
"""

from __future__ import annotations

import torch
from torch import Tensor


def scaled_product(a_f8: Tensor, b_f8_t: Tensor, scale: Tensor, out_dtype: torch.dtype) -> Tensor:
    """(a_f8 · b_f8_tᵀ) · scale in `out_dtype`, a_f8 (m, k) and b_f8_t (n, k) FP8, scale 0-d float32."""
    fast = a_f8.dtype == b_f8_t.dtype == torch.float8_e4m3fn and out_dtype == torch.bfloat16
    one = torch.ones((), dtype=torch.float32, device=a_f8.device)
    return torch._scaled_mm(a_f8.contiguous(), b_f8_t.contiguous().T, scale_a=scale.float().reshape(()),
                            scale_b=one, out_dtype=out_dtype, use_fast_accum=fast)
