"""Which kernel serves which model function on which device: the one table, and the one switch.

The math is written once, in the model (`model/gpt.py`, `model/attention.py`) and the optimisers
(`optim/`). Each kernel of this package replaces one named function there, runs only where it was
measured to win, and is held by a test to the function it replaces. `KERNELS` below says, for every
such function, what serves it on each kind of device; the kernel modules' own `supported`/`pick`
functions are the executable form of the "where" column (shapes, dtypes, GPU capability).

The run-wide switch is `train.kernels`: "auto" (each function on the kernel the table names for the
device, the reference where none applies) or "reference" (every function on its plain-PyTorch
reference, and attention on FlexAttention on a GPU, the dense reference on a CPU: what the tests and
anyone debugging a kernel use). The kernels take the resolved choice as an `impl` argument ("auto" or
"torch"; "triton" forces a Triton kernel, which the CPU tests run under Triton's interpreter), so the
switch is read once, where the model and the optimisers are built, never at a call site.
"""

from __future__ import annotations

from dataclasses import dataclass

SWITCH = ("auto", "reference")


@dataclass(frozen=True)
class Kernel:
    function: str  # the model function it replaces
    hopper: str  # what serves it on a capability-9.0 GPU (H100, H200)
    other_gpu: str  # on other CUDA GPUs
    cpu: str  # on a CPU
    test: str  # the test that holds the kernel to the function


REFERENCE = "the model's PyTorch"

KERNELS = (
    Kernel("GPT.head_loss (FP8 head, soft-cap, summed cross-entropy)",
           "kernels/head.py: head_gluon.py's FP8 product with the CE row sums in its epilogue, softcap_ce.py's "
           "lean pass, ce_grad_gluon.py's gradient in both layouts",
           "kernels/head.py: torch._scaled_mm, softcap_ce.py's kernel, transpose.py's copy", REFERENCE,
           "tests/test_head.py, tests/test_head_gluon.py, tests/test_softcap_ce.py"),
    Kernel("Attention.project (QK RMS-norm, rotary, value mixing)", "kernels/attn_inputs.py",
           "kernels/attn_inputs.py", REFERENCE, "tests/test_attn_inputs.py"),
    Kernel("MLP.forward (ReLU² MLP)", "kernels/relu2_mlp.py (Triton forward, relu2_gluon.py backward)",
           REFERENCE, REFERENCE, "tests/test_relu2_mlp.py, tests/test_relu2_gluon.py"),
    Kernel("AttentionMasks.attend (document-causal sliding-window attention; attention.backend)",
           "kernels/attn_gluon.py on FlexAttention's 64-token block lists",
           "FlexAttention (kernels/flex_tiles.py's tiles)", "model/attention.py's dense reference",
           "tests/test_attn_gluon.py, tests/test_attention.py"),
    Kernel("flex_block_mask (the block lists' order)", "kernels/block_order.py", "kernels/block_order.py",
           REFERENCE, "tests/test_block_order.py"),
    Kernel("GPT.hidden's embedding lookups (their gradients in a trainer)", "kernels/embed_rows.py",
           "kernels/embed_rows.py", "kernels/embed_rows.py's reference", "tests/test_embed_rows.py"),
    Kernel("RecordGPT.attend (the 2026 record's per-document windowed attention, bf16)",
           "kernels/record_attention.py: torch's FlashAttention varlen, window (w, 0)",
           "the same, where torch's FlashAttention runs", "model/record_parts.py's reference_attention",
           "tests/test_record_attention_gpu.py"),
    Kernel("RecordGPT.dc_term (layer 10's DC correction, bf16)",
           "kernels/record_dc.py: forward, dQ and dK/dV kernels on the 112-key band",
           "the same", "model/record_parts.py's dc_correction",
           "tests/test_record_dc.py, tests/test_record_attention_gpu.py"),
    Kernel("RecordGPT.mlp in bf16 (evaluation, and training unless fp8.mlp is on)",
           "kernels/record_attention.py: relu2_mlp.py's kernels (the ReLU² in the products' epilogues)",
           REFERENCE, REFERENCE, "tests/test_record_mlp.py"),
    Kernel("record_fp8.reference_product (the FP8 head and MLP products)",
           "kernels/record_fp8.py: torch._scaled_mm (capability 8.9 and up)",
           "the same at capability 8.9 and up, else the reference", "model/record_fp8.py's reference_product",
           "tests/test_record_fp8_gpu.py"),
    Kernel("record_loss.record_training_loss (the 2026 record's MTP and prefix head loss, bf16 logits)",
           "kernels/record_ce.py: a Triton program per 32–128 rows, the gradient written in the forward",
           "the same, where Triton runs", "model/record_loss.py's record_training_loss",
           "tests/test_record_ce.py, tests/test_record_ce_gpu.py"),
    Kernel("RecordGPT.head_loss with the FP8 head in training",
           "kernels/record_ce.py: the loss's sweeps, then a tile kernel writes the e5m2 gradient and its transpose "
           "for the head's products",
           "the same at capability 8.9 and up", "record_training_loss of record_fp8.fp8_head's logits",
           "tests/test_record_head_loss.py"),
    Kernel("record_fp8.mlp_backward_bf16 (the FP8 MLP's bf16 backward)",
           "kernels/record_attention.py: relu2_mlp.py's backward (dpre in the product's epilogue)",
           REFERENCE, REFERENCE, "tests/test_record_mlp.py"),
    Kernel("DistAdam's update, Muon's momentum (optim/)", "optim/kernels.py", "optim/kernels.py",
           REFERENCE, "tests/test_optim_kernels.py"),
    Kernel("record_adam.adam_update (the 2026 record's Adam, cautious lr² decay)", "optim/kernels.py",
           "optim/kernels.py", REFERENCE, "tests/test_record_adam.py"),
    Kernel("normuon.normuon_update's momentum and its steps after Polar Express (the variance factor applied, "
           "the master joined, the cautious step, the split)", "optim/kernels.py", "optim/kernels.py", REFERENCE,
           "tests/test_normuon.py"),
)


def impl(kernels: str) -> str:
    """The `impl` argument the kernels take for the run-wide switch `train.kernels`."""
    if kernels not in SWITCH:
        raise ValueError(f"train.kernels must be one of {SWITCH}, got {kernels!r}")
    return "torch" if kernels == "reference" else "auto"
