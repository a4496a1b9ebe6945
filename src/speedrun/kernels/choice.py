"""Choosing between a fused Triton kernel and its PyTorch reference.

Each fused-kernel module (`softcap_ce`, `attn_inputs`, `transpose`, `embed_rows`, ...) offers the same three
implementations: "torch" (the reference the tests hold the kernel to),
"triton" (the kernel: CUDA, or a CPU under TRITON_INTERPRET=1) and "auto"
(the kernel for CUDA tensors when Triton is installed, the reference
otherwise). Triton is looked up here, never imported: `TRITON_FOUND` is a
constant for Dynamo, and the kernels are built on their first use, so
TRITON_INTERPRET=1 set before that use runs them through Triton's
interpreter (the CPU tests do this in a subprocess). The model passes the run's choice
(`train.kernels`, resolved by `table.impl`): "auto", or "torch" for the references.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from torch import Tensor

IMPLS = ("torch", "triton", "auto")

# Does a Triton distribution exist? (looked up, not imported; a constant for Dynamo)
TRITON_FOUND = importlib.util.find_spec("triton") is not None


def pick_impl(t: Tensor, impl: str = "auto") -> str:
    """The implementation that runs for tensors like t: "torch" or "triton"."""
    if impl not in IMPLS:
        raise ValueError(f"kernel impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "triton" if (t.is_cuda and TRITON_FOUND) else "torch"
    return impl


def import_triton(module_globals: dict) -> bool:
    """Import Triton into a kernel module's globals as `triton` and `tl`, the names its kernels' source
    uses: Triton's interpreter re-executes a kernel's source with its module's globals only, so the
    kernels and the helpers they call must be module globals too (each module's `_build_kernel`).
    Returns whether TRITON_INTERPRET=1 is set now, i.e. whether the kernels defined next are interpreted."""
    import triton
    import triton.language as tl

    module_globals["triton"], module_globals["tl"] = triton, tl
    return os.environ.get("TRITON_INTERPRET") == "1"


def built_once(build):
    """A kernel module's builder, run on first use only: Triton imported into the module's globals first
    (`import_triton`), then `build(interpreted)` called, and its result kept and returned from then on.
    The builder binds its kernels as module globals (`global` names), as Triton's interpreter needs."""
    built = []

    @functools.wraps(build)
    def build_kernels():
        if not built:
            built.append(build(import_triton(build.__globals__)))
        return built[0]

    return build_kernels
