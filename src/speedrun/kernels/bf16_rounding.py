"""float32 → bfloat16 round-to-nearest-even inside Triton kernels, for the CPU interpreter's sake.

Triton's interpreter (3.x) converts float32 to bfloat16 by truncation, a GPU by rounding to nearest
even. Kernels that must give the GPU's bits in the CPU tests (`attn_inputs`, `optim_kernels`) round in
integer arithmetic first when interpreted, so the truncating conversion that follows is exact. This
module holds that one helper so they share it; like the kernels, it is defined on first use, when
TRITON_INTERPRET is read.
"""

from __future__ import annotations

tl = None  # set by build: the interpreter re-executes the helper with this module's globals
rne_bf16 = None


def build():
    """The jit helper rne_bf16(x): float32 x rounded to bfloat16's precision, still float32 (NaN kept)."""
    global tl, rne_bf16
    if rne_bf16 is not None:
        return rne_bf16
    import triton
    import triton.language as _tl

    tl = _tl

    @triton.jit
    def _rne_bf16(x):
        u = x.to(tl.uint32, bitcast=True)
        u = u + (((u >> 16) & 1) + 0x7FFF)
        r = (u & 0xFFFF0000).to(tl.float32, bitcast=True)
        return tl.where(x != x, x, r)

    rne_bf16 = _rne_bf16
    return rne_bf16
