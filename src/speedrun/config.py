"""Typed run configuration.

A run is described by one `RunConfig` made of small frozen-free dataclasses.
Every technique of the record ladder is a field, so an ablation is one
override (`--set model.value_embeds=0`). Overrides are parsed against the
field's declared type; an unknown field is refused with the nearest valid
name. Presets (see `presets.py`) are plain functions returning a RunConfig.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import typing
from dataclasses import dataclass, field

from speedrun.errors import ConfigError


@dataclass
class ModelConfig:
    """The network. Defaults are the 2025-08 record."""

    vocab_size: int = 50257
    vocab_multiple: int = 128  # pad the vocabulary to a multiple of this (1 = no padding)
    num_layers: int = 12
    model_dim: int = 768
    num_heads: int = 6
    head_dim: int = 128
    mlp_hidden: int = 3072
    activation: str = "relu2"  # "relu2" | "gelu"
    positions: str = "rotary"  # "rotary" | "learned"
    rotary: str = "half_truncated"  # "half_truncated" (1/1024 base, half the dims) | "full" (base 10000)
    max_positions: int = 1024  # only for learned positions
    norm: str = "rms"  # "rms" (parameter-free) | "layer" (learned LayerNorm, llm.c)
    qk_norm: bool = True
    zero_init: bool = True  # zero-initialise output projections and the head
    tied_head: bool = False
    value_embeds: int = 3  # number of value embeddings (0 = none), fed to the first and last layers
    x0_lambdas: bool = True  # x = l0*x + l1*x0 before each block (embedding skip)
    unet: bool = True  # U-net skips between layer i < L/2 and L-1-i
    logit_softcap: float = 30.0  # 0 = none
    softcap_form: str = "sigmoid"  # "sigmoid": c*sigmoid(z/7.5) | "tanh": c*tanh(z/c)
    attn_scale: float = 0.12  # 0 = 1/sqrt(head_dim)
    attn_gate: bool = True  # per-head sigmoid output gate from x[..., :12]
    gate_inputs: int = 12
    no_attn_layers: tuple[int, ...] = (7,)
    long_layers: tuple[int, ...] = (0, 4, 7, 11)  # layers with the long window; others short
    fp8_head: bool = True  # FP8 head in training where the GPU supports it
    bf16_embeds: bool = True  # embeddings stored in bfloat16 when activations are bfloat16
    bias: bool = False  # biases in linear layers (llm.c GPT-2)
    value_residual: bool = False  # 2024-11 ladder rungs: layers >= 1 mix layer 0's V into theirs (the attention lambdas)
    # Training loss kernel: "torch" | "triton" (fused soft-capped cross-entropy, softcap_ce.py; with the
    # FP8 head, one fused head op, head.py) | "auto" (triton on CUDA when installed, else torch).
    # Same math, an implementation choice; `torch` is the reference the tests hold the kernel to.
    ce_kernel: str = "auto"
    # The CE kernel's sigmoid (softcap_ce.MATHS): "precise" (float32 exp2 and division, as Inductor
    # compiles the reference) | "tanh_approx" (the GPU's approximate tanh.approx.f32, relative error up
    # to 2^-11: about 1 ms less per 49,152-token micro-step on an H200, the loss within ~1e-5) |
    # "lean" (the same float32 precision as "precise" in fewer GPU instructions: one reciprocal per two
    # elements, part of the softmax exponentials by an FMA polynomial; softcap_ce.py; the default since
    # 03a3753 (2026-12-01): 4.02 -> 3.29 ms a micro-step's call on an H200). The torch reference
    # ignores it.
    ce_math: str = "lean"
    # The FP8 head's forward product (head.py): "cublas" (torch._scaled_mm, then the CE kernel's two passes)
    # | "gluon" (head_gluon.py's warp-specialised kernel, the same bits as cuBLAS, with the lean CE kernel's
    # row sums in its epilogue so that the CE kernel reads z once; a capability-9.0 GPU, else cuBLAS with a
    # warning) | "auto" (gluon where it can run, silently cuBLAS elsewhere; the default since 2c51899
    # (2026-12-01): 599.4 -> 595.0 / 595.9 ms/step in full runs on one H200). An
    # implementation choice: the same products and the same loss up to the order of float32 additions.
    head_kernel: str = "auto"
    # The fused head's CE also writes the e5m2 gradient transposed (softcap_ce.launch_transposed), so the
    # backward's grad_w product needs no transposed copy (transpose.py, ~1.27 ms a 49,152-token micro-step on
    # an H200). On Hopper the pass is ce_grad_gluon.py's kernel: the lean kernel's bytes exactly, in both
    # layouts; elsewhere the Triton tile kernel (its own reciprocal pairs). The default since 4f2d00e
    # (2026-12-02): per call it ties the lean kernel plus the copy (3.12 against 3.04 ms, unconstrained clock), but
    # it moves 2.5 GB less per micro-step, and on the power-capped H200 the step ran at a 15-30 MHz higher
    # clock: full proxy212 runs 580.7 / 581.3 against 584.0 / 584.9 / 583.5 ms/step (A-B-A, one card),
    # at 2.3 GiB more allocated (g^T lives from the forward to the backward).
    ce_transposed: bool = True
    # Which warps of the Gluon head kernel compute the CE's row sums (head_gluon.py) from a tile's four
    # 64-column slices: "epilogue" (its 4-warp epilogue partition, beside the TMA stores of z) | "consumers"
    # (the two wgmma warpgroups, between issuing one k-step's wgmma and waiting for the last, on the
    # previous tile's z read back from shared memory) | "split" (two slices each, two partial sums a
    # tile). The same sums up to the order of float32 additions. 2026-12-01, 57860f8:
    # the kernel alone 4,772 us (epilogue), 4,797 (consumers), 4,116 (split) on one H200; 1a09427:
    # the step with "split" 608.1 / 611.4 against 613.1 / 613.7 ms/step (A/B/A/B, one shared cache).
    head_rowsums: str = "split"
    # The attention's inputs (QK RMS-norm + rotary, value mixing; attn_inputs.py): "torch" (the model's
    # operations, compiled by Inductor) | "triton" (one kernel launch each way for q, k and v, the
    # projection's whole gradient written in place) | "auto" (triton on CUDA when installed). Same math as
    # the compiled reference; on an H200 2 ms/step less in full runs (2026-11-30, 2b0a890).
    qk_kernel: str = "auto"
    # The ReLU² MLP (relu2_mlp.py): "torch" (two linear layers, compiled: cuBLAS products and Inductor's
    # activation passes) | "triton" (the activation and its derivative in the epilogues of Triton
    # products; bfloat16 on a GPU of capability 9.0+) | "auto" (triton where it can run). Same math
    # (bit-equal on an H200 at the record's size); about 13 ms/step less there (docs/performance.md).
    mlp_kernel: str = "auto"
    # The Triton products' launch ("BLOCK_N=128,fwd.num_stages=4,...", keys relu2_mlp.KEYS): a schedule,
    # not the math; empty = relu2_mlp.KERNEL_CONFIG. GLUON=1 (the backward's default) runs a direction on
    # the warp-specialised Gluon kernel on capability-9.0 GPUs (relu2_gluon.py; bit-equal).
    mlp_options: str = ""
    # The embedding tables' gradients: "rows" (embed_rows.py, the default: each table's gradient added
    # into the trainer's in-place sums row by row, only the rows the tokens touch, with no dense float32
    # table filled and read each micro-step; train.grad_accum=auto resolves to inplace for it; where the
    # in-place sums do not run (regional compilation, grad_accum graph or autograd, no trainer) the
    # "torch" lookups; -1.6 to -1.9 ms/step on one H200, e24b82b, 2026-12-03) | "torch" (autograd's
    # dense embedding backward per table: Inductor's float32 buffer, atomics, then a rounding pass) |
    # "triton" (embeddings.py: the tokens sorted once, each run of equal tokens summed by a chunked
    # product, bfloat16 written once: the same gradients from run to run) | "auto" (triton on CUDA when
    # installed). Same math up to the order of float32 additions. "triton" is not faster in the step
    # (7d32cb7, 2026-12-01; 1e8865a, 2026-12-02), so opt-in.
    embed_kernel: str = "rows"

    @property
    def padded_vocab(self) -> int:
        m = self.vocab_multiple
        return ((self.vocab_size + m - 1) // m) * m


@dataclass
class AttentionConfig:
    """Which tokens see which."""

    doc_mask: bool = True  # causal inside each document only
    block_size: int = 128
    window: str = "growing"  # "none" (full causal) | "fixed" | "growing"
    window_tokens: int = 1728  # final long window before rounding up to a block
    long_short: bool = True  # short window = long // 2 on non-long layers
    # "auto" | "flex" | "dense" | "gluon" (speedrun.kernels.attn_gluon: the same function on FlexAttention's 64-token
    # block lists in kernels of its own; Hopper only, sparse_block 64). "auto": gluon on a Hopper GPU with
    # sparse_block 64, head_dim 128 and bfloat16 (what it was measured on), flex on other GPUs, dense on a CPU.
    backend: str = "auto"
    segment_len: int = 0  # >0: the row is independent sequences of this length (positions restart)
    # FlexAttention kernel options, "KEY=VALUE,..." (torch's FlexKernelOptions, e.g. fwd_BLOCK_M=128,
    # bwd_num_warps=4); "" = torch's defaults. Tile sizes only: the same function, another schedule.
    # Default: the best of sweeps on an H200 at the record's shapes. Forward (scripts/bench/flex_sweep.py):
    # 64x64 tiles, 19.4 against 22.3 ms per step for torch's 128x64. Backward, on the 64-token mask
    # (scripts/bench/flex_mask_bench.py): (M1, N1, M2, N2) = (32, 64, 64, 32), 4 warps, 4 stages;
    # forward + backward 69.0 ms per step against 79.2 for torch's (64, 128, 128, 64) on 128-token blocks.
    flex_options: str = ("fwd_BLOCK_M=64,fwd_BLOCK_N=64,fwd_num_warps=4,fwd_num_stages=3,"
                         "bwd_BLOCK_M1=32,bwd_BLOCK_N1=64,bwd_BLOCK_M2=64,bwd_BLOCK_N2=32,"
                         "bwd_num_warps=4,bwd_num_stages=4")
    # The block mask's granularity for FlexAttention: 0 = block_size. A divisor of block_size gives the
    # kernel a finer mask with the same function (the window still counts block_size blocks;
    # attention.py); every *_BLOCK_* tile in flex_options must then divide it. 64: 11-25% fewer tiles
    # visited and about half the masked ones on FineWeb's documents (docs/performance.md).
    sparse_block: int = 64
    # With backend gluon: the forward that issues the next tile's QKᵀ before this tile's PV (attn_gluon's
    # OVERLAP). The same products and roundings; measured slower in isolation on two cards (a7ed907,
    # 2026-12-04: 2.29-3.10 J/TFLOP at windows 6-14 against the plain forward's 2.22-2.67): off.
    gluon_overlap: bool = False
    # With backend gluon: the forward's Q held in registers as QKᵀ's A operand (attn_gluon's Q_REG), so the
    # product reads only K from shared memory. The same bits out (a GPU test holds o and lse equal to the
    # plain forward's); replayed from CUDA graphs (38a67e2, 2026-12-04) 2-6% less time and 1-7% less energy
    # at all eight windows measured; in the training step within the noise (-1.4 and +0.3 ms on two cards,
    # where the forward is about 3% of the step): on.
    gluon_q_regs: bool = True
    # With backend gluon: the dQ kernel's Q held in registers as its QKᵀ's A operand (attn_gluon's DQ_Q_REG),
    # as gluon_q_regs does for the forward. 223-235 registers and no spills under Triton 3.6 and 3.9 (the
    # plain dQ kernel 201-211); the same bits out (a GPU test). 0d63ee6 (2026-12-04), one H200: the backward
    # replayed from CUDA graphs 1.2-3.4% faster at all eight windows; the step -1.2 ms (-0.7 to -2.3 in four
    # rounds) and -2.1 J: on.
    gluon_dq_q_regs: bool = True
    # With backend gluon: the dK/dV kernel stages each query tile's lse, delta and document ids through shared
    # memory, read back only where used (attn_gluon's DKDV_SMEM), not held in registers from their load. The
    # same bits out (a GPU test); under Triton 3.6 its spill 32 -> 0 bytes with int32 ids (48 -> 8 with
    # int64). 866abcc (2026-12-04), one H200: the backward replayed from CUDA graphs 2.6-5.5% faster than
    # with DQ_Q_REG and int32 ids alone at all eight windows; the step -1.6 ms in two rounds: on.
    gluon_dkdv_smem: bool = True
    # With backend gluon: the document ids the kernels compare as int32 rather than the model's int64 (where
    # the largest id fits: `attention.narrow_ids`). The same masks and bits out (a GPU test); fewer registers
    # (the forward with Q_REG 202 -> 167 under Triton 3.6, dK/dV's spill 48 -> 32 bytes). 0d63ee6
    # (2026-12-04), one H200, from CUDA graphs: the backward 1.2-3.7% and the forward 0.7-1.8% faster at all
    # eight windows; the step -0.2 to -0.9 ms in three rounds on two machines (-1.2 J): on.
    gluon_docs_i32: bool = True
    # How the block mask's lists are ordered (block_order.py): "torch" (a stable argsort per list, eight
    # radix sorts a micro-step) | "triton" (one prefix-sum kernel per list, as a custom op) | "auto"
    # (triton on CUDA when installed). The same lists, bit for bit.
    order_kernel: str = "auto"


@dataclass
class OptimConfig:
    """Optimisers: Muon on block matrices + Adam on the rest, or AdamW on all."""

    kind: str = "muon"  # "muon" | "adamw"
    adam_betas: tuple[float, float] = (0.8, 0.95)
    adam_eps: float = 1e-10
    embed_lr: float = 0.6
    head_lr: float = 0.008
    scalar_lr: float = 0.04
    muon_lr: float = 0.05
    muon_momentum: float = 0.95
    muon_momentum_start: float = 0.85
    muon_ns_steps: int = 5
    # The optimisers' element-wise work (optim_kernels.py): "torch" (eager operations: DistAdam's eight
    # passes a tensor, Muon's momentum, look-ahead and casts) | "triton" (one kernel each: Adam's update
    # per tensor, Muon's momentum per shape bucket writing Newton–Schulz's bfloat16 input) | "auto"
    # (triton on CUDA when installed). The same operations and roundings.
    kernel: str = "auto"
    # AdamW-only (the llm.c baseline)
    adamw_lr: float = 0.0018
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    weight_decay: float = 0.0  # AdamW, on matrices and embeddings


@dataclass
class ScheduleConfig:
    """Everything that changes over a run, as a fraction of progress = step / steps."""

    warmup_frac: float = 0.0  # linear lr warm-up
    cooldown_frac: float = 0.45  # final linear cooldown
    final_lr_frac: float = 0.1  # lr multiplier at the end of cooldown
    momentum_warmup_frac: float = 300 / 1695  # Muon momentum start -> final


@dataclass
class TrainConfig:
    """Steps, batch, validation and the device-side choices."""

    steps: int = 1695
    seq_len: int = 48 * 1024  # tokens per sequence (one micro-step)
    batch_seqs: int = 8  # sequences per optimiser step, over all ranks and micro-steps
    bos_align: bool = True
    val_tokens: int = 10_485_760
    val_seq_len: int = 4 * 64 * 1024  # tokens per rank per validation forward
    val_every: int = 125
    warmup_steps: int = 3  # untimed warm-up steps (the first compiles), then state restored; the reference ran 10
    # warm-up steps when this run's compiled graphs are already in the local caches (a warm note, or
    # Dynamo packages, on every rank): an earlier run with the same key ran the full warm-up. At least
    # 2 with health steps (both graphs must load before the clock); never more than warmup_steps
    warmup_steps_warm: int = 1
    # compile the evaluation graph and the FP8 head in a second process during the first warm-up step
    # (precompile.py); only where the step is compiled on a GPU. Speed only: nothing it computes is used.
    precompile: bool = True
    # keep Dynamo's traced graphs and guards between runs (dynamo_cache.py, torch's caching precompile):
    # a warm start skips re-tracing; speed only, the compiled code is the same
    dynamo_cache: bool = True
    seed: int = 0
    compile: str = "auto"  # "auto" (on CUDA) | "on" (whole model) | "regional" (per block) | "off"
    # replay the whole-model compile's forward and backward as CUDA graphs (Inductor's cudagraph trees):
    # the same kernels, launched from a graph. Speed only. Each micro-step starts a new graph step; the
    # gradients add up in place in buffers the graphs read where they are (grad_accum=auto -> inplace), or
    # with grad_accum=autograd the first micro-step's gradients are copied out of the graph's memory
    # (trainer.own_grads). Measured (007fa9a, 2026-12-02, one power-capped H200): -1.6 ms/step in the
    # bench, the same in full runs (fewer cycles, the same energy), 1.1 GiB less reserved; off by
    # default: no multi-GPU test (docs/performance.md)
    cudagraphs: bool = False
    # where the micro-steps' gradients add up (grad_accum.py): "graph" inside the compiled backward (the
    # add fused into the kernel that writes each gradient; the same values bit for bit), "inplace" the
    # same add written into buffers kept for the run (no zeros copy; CUDA graphs read them in place),
    # "autograd" by autograd's own eager adds, "auto" = graph (inplace with CUDA graphs) where the whole
    # model is compiled and a step has several micro-steps. Speed only.
    grad_accum: str = "auto"
    # where grad_accum is "graph" or "inplace": the float32 matrices the model reads only in bfloat16
    # (`GPT.cast_only_names`) cast once a step, before the first micro-step, not in each micro-step's
    # graph (grad_accum.StepCasts). The same rounding, the same gradients bit for bit. Speed only.
    cast_once: bool = True
    # the FP8 head's weight operands (the e4m3 weight and its transposed copy) made once a step, before
    # the first micro-step, not in each micro-step's head op (GPT.head_operands). The same operands bit
    # for bit. Speed only: -0.8 ms/step in six A/B rounds and -1.6 in two full runs on one H200
    # (55e0680, 2026-12-01).
    head_once: bool = True
    log_every: int = 1
    dtype: str = "auto"  # activations: "auto" (bfloat16 on CUDA, float32 on CPU) | "bfloat16" | "float32"
    sample_tokens: int = 0  # print this many sampled tokens at the end (demo)
    # Reliability (see docs/reliability.md). Checkpoints: every N steps and/or every M minutes (0 = off).
    checkpoint_every_steps: int = 0
    checkpoint_every_minutes: float = 0.0
    health_every: int = 0  # health record (norms, activation RMS) every K steps; 0 = checks only at val/checkpoints
    spike_factor: float = 2.0  # loss > factor x median of recent losses is a spike (0 = off)
    on_fault: str = "stop"  # non-finite loss/gradient or spike: "stop" | "recover"
    max_recoveries: int = 3  # "recover": stop after this many roll-backs
    recover_lr_factor: float = 0.5  # "recover": lr multiplied by this at each roll-back
    inject_fault: str = ""  # TESTING ONLY: e.g. "nan@5,grad_inf@3,spike@4,oom@2,sigterm@6" (batch index)


@dataclass
class DataConfig:
    train_pattern: str = "fineweb_train_*.bin"
    val_pattern: str = "fineweb_val_*.bin"
    data_dir: str = ""  # "" = the default FineWeb folder; "demo" = the embedded corpus


@dataclass
class RunConfig:
    name: str = "record"
    model: ModelConfig = field(default_factory=ModelConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


SECTIONS = ("model", "attention", "optim", "schedule", "train", "data")


# Fields that chose how a step ran, removed once measured (docs/performance.md says what each measured),
# with the value the code now always has: a config.json that holds one at that value still loads.
RETIRED: dict[str, object] = {
    "train.pdl": False,  # Inductor's programmatic dependent launch: no gain on an H200
    "train.inductor_options": "",  # further Inductor options: none adopted
    "model.gate_kernel": "linear",  # the gate's product as fused element-wise work: 7% slower a step
    "model.wgrad_blas": "cublas",  # cuBLASLt for the weight gradients: 2.6-3.6 ms a step slower
}


def from_dict(d: dict) -> RunConfig:
    """Rebuild a RunConfig from `to_dict()` output (e.g. a saved config.json). A retired field at the
    value the code keeps is dropped; at any other value the run it describes is not what the code
    computes or how it compiles, and loading refuses in one line."""
    cfg = RunConfig(name=d.get("name", "custom"))
    for section in SECTIONS:
        for key, value in d.get(section, {}).items():
            path = f"{section}.{key}"
            if path in RETIRED:
                if value != RETIRED[path]:
                    raise ConfigError(f"{path}={value!r}: this option was removed (docs/performance.md); "
                                      f"this speedrun runs only {path}={RETIRED[path]!r}")
                continue
            set_field(cfg, path, value)
    return cfg


def _field_names(obj) -> list[str]:
    return [f.name for f in dataclasses.fields(obj)]


def all_field_paths() -> list[str]:
    cfg = RunConfig()
    return [f"{s}.{n}" for s in SECTIONS for n in _field_names(getattr(cfg, s))]


def _unknown(path: str) -> ConfigError:
    near = difflib.get_close_matches(path, all_field_paths(), n=1, cutoff=0.5)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    return ConfigError(f"--set {path}: no such config field{hint}")


def _coerce(path: str, tp, value):
    """Turn `value` (a string from the command line, or JSON data) into type `tp`."""
    origin = typing.get_origin(tp)
    if origin is tuple:
        if isinstance(value, str):
            parts = [p for p in value.replace("(", "").replace(")", "").split(",") if p.strip()]
        else:
            parts = list(value)
        args = typing.get_args(tp)
        elem = args[0] if args else str
        if len(args) == 2 and args[1] is Ellipsis or len(args) == 1:
            return tuple(_coerce(path, elem, p) for p in parts)
        if len(parts) != len(args):
            raise ConfigError(f"--set {path}: expected {len(args)} comma-separated values, got {value!r}")
        return tuple(_coerce(path, a, p) for a, p in zip(args, parts))
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if tp is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            if isinstance(value, str):
                value = value.replace("_", "")
                f = float(value)
                if not f.is_integer():
                    raise ValueError
                return int(f)
            return int(value)
        if tp is float:
            return float(value)
        if tp is str:
            return str(value)
    except (TypeError, ValueError):
        pass
    name = getattr(tp, "__name__", str(tp))
    raise ConfigError(f"--set {path}: {value!r} is not a valid {name}")


def set_field(cfg: RunConfig, path: str, value) -> None:
    """Set `section.name` on cfg from a string or JSON value, type-checked."""
    if "." not in path:
        raise _unknown(path)
    section, name = path.split(".", 1)
    if section not in SECTIONS or name not in _field_names(getattr(cfg, section)):
        raise _unknown(path)
    obj = getattr(cfg, section)
    hints = typing.get_type_hints(type(obj))
    setattr(obj, name, _coerce(path, hints[name], value))


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply `section.field=value` strings in order."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item}: expected section.field=value")
        path, value = item.split("=", 1)
        set_field(cfg, path.strip(), value.strip())
    return cfg


def diff(a: RunConfig, b: RunConfig) -> dict[str, tuple]:
    """Fields whose values differ: {path: (a_value, b_value)}."""
    da, db = a.to_dict(), b.to_dict()
    out = {}
    for s in SECTIONS:
        for k in da[s]:
            if da[s][k] != db[s][k]:
                out[f"{s}.{k}"] = (da[s][k], db[s][k])
    return out


ALLOWED_WORLD_SIZES = (1, 2, 4, 8)


def parse_flex_options(text: str) -> dict[str, int | bool]:
    """"fwd_BLOCK_M=128,fwd_USE_TMA=true" -> {"fwd_BLOCK_M": 128, "fwd_USE_TMA": True}; ValueError if malformed."""
    out: dict[str, int | bool] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip().lower()
        if not sep or not key.replace("_", "").isalnum():
            raise ValueError(item)
        out[key] = {"true": True, "false": False}[value] if value in ("true", "false") else int(value)
    return out


def parses(parse, text: str) -> bool:
    """Does parse(text) succeed (no ValueError)?"""
    try:
        parse(text)
    except ValueError:
        return False
    return True


def tiles_fit(text: str, block: int) -> bool:
    """Do the tile sizes among FlexAttention options ("fwd_BLOCK_M=64,...") divide the mask's block?"""
    tiles = [v for k, v in parse_flex_options(text).items() if "BLOCK_" in k and not isinstance(v, bool)]
    return all(t > 0 and block % t == 0 for t in tiles)


def flex_options_ok(text: str) -> bool:
    return parses(parse_flex_options, text)


def mlp_options_ok(text: str) -> bool:
    from speedrun.kernels.relu2_mlp import parse_options  # the kernel module owns its keys

    return parses(parse_options, text)


Check = tuple[bool, str, str]  # (holds, option name, what is wrong)


def _one_of(value: str, name: str, options: tuple[str, ...]) -> Check:
    """A check that `value` is one of `options` ("must be a, b or c, got 'x'")."""
    listed = ", ".join(options[:-1]) + " or " + options[-1]
    return value in options, name, f"must be {listed}, got {value!r}"


KERNEL_CHOICES = ("torch", "triton", "auto")


def _finite(x) -> bool:
    return not isinstance(x, float) or math.isfinite(x)


def _at_least(x, lo, name: str) -> Check:
    return _finite(x) and x >= lo, name, f"must be >= {lo}, got {x!r}"


def _above(x, lo, name: str) -> Check:
    return _finite(x) and x > lo, name, f"must be > {lo}, got {x!r}"


def _within(x, lo, hi, name: str, below_hi: bool = False) -> Check:
    """`x` in [lo, hi], or [lo, hi) with `below_hi`."""
    ok = _finite(x) and lo <= x and (x < hi if below_hi else x <= hi)
    return ok, name, f"must be in [{lo}, {hi}{')' if below_hi else ']'}, got {x!r}"


def _betas(betas: tuple[float, ...], name: str) -> Check:
    ok = all(_finite(b) and 0 <= b < 1 for b in betas)
    return ok, name, f"each beta must be in [0, 1), got {tuple(betas)}"


def _layers(layers: tuple[int, ...], num_layers: int, name: str) -> Check:
    ok = all(0 <= i < num_layers for i in layers)
    return ok, name, (f"layer indices must be in 0..{num_layers - 1} (model.num_layers={num_layers}), "
                      f"got {tuple(layers)}")


def _range_checks(cfg: RunConfig) -> list[Check]:
    """Every number with a range: sizes and counts, learning rates, betas and fractions, layer indices.

    Checked before the rest, whose checks divide by some of these (the sequence lengths' own
    checks there: positive multiples of the block). A zero learning rate is allowed: it
    freezes that group, an ablation; a negative one climbs the loss instead of descending it."""
    m, a, o, sch, t = cfg.model, cfg.attention, cfg.optim, cfg.schedule, cfg.train
    return [
        _at_least(m.vocab_size, 1, "model.vocab_size"),
        _at_least(m.vocab_multiple, 1, "model.vocab_multiple"),
        _at_least(m.num_layers, 1, "model.num_layers"),
        _at_least(m.model_dim, 1, "model.model_dim"),
        _at_least(m.num_heads, 1, "model.num_heads"),
        _at_least(m.head_dim, 1, "model.head_dim"),
        _at_least(m.mlp_hidden, 1, "model.mlp_hidden"),
        _at_least(m.max_positions, 1, "model.max_positions"),
        _at_least(m.value_embeds, 0, "model.value_embeds"),
        _at_least(m.logit_softcap, 0, "model.logit_softcap"),
        _at_least(m.attn_scale, 0, "model.attn_scale"),
        _at_least(m.gate_inputs, 1, "model.gate_inputs"),
        _layers(m.no_attn_layers, m.num_layers, "model.no_attn_layers"),
        _layers(m.long_layers, m.num_layers, "model.long_layers"),
        _at_least(a.block_size, 1, "attention.block_size"),
        _at_least(a.window_tokens, 1, "attention.window_tokens"),
        _at_least(a.segment_len, 0, "attention.segment_len"),
        _at_least(a.sparse_block, 0, "attention.sparse_block"),
        _betas(o.adam_betas, "optim.adam_betas"),
        _above(o.adam_eps, 0, "optim.adam_eps"),
        _at_least(o.embed_lr, 0, "optim.embed_lr"),
        _at_least(o.head_lr, 0, "optim.head_lr"),
        _at_least(o.scalar_lr, 0, "optim.scalar_lr"),
        _at_least(o.muon_lr, 0, "optim.muon_lr"),
        _within(o.muon_momentum, 0, 1, "optim.muon_momentum", below_hi=True),
        _within(o.muon_momentum_start, 0, 1, "optim.muon_momentum_start", below_hi=True),
        _at_least(o.muon_ns_steps, 0, "optim.muon_ns_steps"),
        _at_least(o.adamw_lr, 0, "optim.adamw_lr"),
        _betas(o.adamw_betas, "optim.adamw_betas"),
        _above(o.adamw_eps, 0, "optim.adamw_eps"),
        _at_least(o.weight_decay, 0, "optim.weight_decay"),
        _within(sch.warmup_frac, 0, 1, "schedule.warmup_frac"),
        _within(sch.cooldown_frac, 0, 1, "schedule.cooldown_frac"),
        _within(sch.final_lr_frac, 0, 1, "schedule.final_lr_frac"),
        # may exceed 1: proxy212 keeps the record's 300-step warm-up in a 212-step run
        _at_least(sch.momentum_warmup_frac, 0, "schedule.momentum_warmup_frac"),
        (t.steps > 0, "train.steps", f"must be > 0, got {t.steps}"),
        (t.batch_seqs > 0, "train.batch_seqs", f"must be > 0, got {t.batch_seqs}"),
        _at_least(t.val_tokens, 0, "train.val_tokens"),
        _at_least(t.val_every, 0, "train.val_every"),
        _at_least(t.warmup_steps, 0, "train.warmup_steps"),
        _at_least(t.warmup_steps_warm, 1, "train.warmup_steps_warm"),
        (0 <= t.seed < 2**64, "train.seed", f"must be in [0, 2^64), got {t.seed}"),  # numpy's and torch's seeds
        _at_least(t.log_every, 0, "train.log_every"),
        _at_least(t.sample_tokens, 0, "train.sample_tokens"),
        _at_least(t.checkpoint_every_steps, 0, "train.checkpoint_every_steps"),
        _at_least(t.checkpoint_every_minutes, 0, "train.checkpoint_every_minutes"),
        _at_least(t.health_every, 0, "train.health_every"),
        (t.spike_factor == 0 or _finite(t.spike_factor) and t.spike_factor > 1, "train.spike_factor",
         f"must be 0 (off) or > 1, got {t.spike_factor}"),
        _at_least(t.max_recoveries, 0, "train.max_recoveries"),
        (0 < t.recover_lr_factor <= 1, "train.recover_lr_factor", f"must be in (0, 1], got {t.recover_lr_factor}"),
    ]


def _model_checks(m: ModelConfig) -> list[Check]:
    return [
        (m.head_dim % 4 == 0, "model.head_dim", f"must be a multiple of 4, got {m.head_dim}"),
        _one_of(m.activation, "model.activation", ("relu2", "gelu")),
        _one_of(m.positions, "model.positions", ("rotary", "learned")),
        _one_of(m.rotary, "model.rotary", ("half_truncated", "full")),
        _one_of(m.norm, "model.norm", ("rms", "layer")),
        _one_of(m.softcap_form, "model.softcap_form", ("sigmoid", "tanh")),
        _one_of(m.ce_kernel, "model.ce_kernel", KERNEL_CHOICES),
        _one_of(m.ce_math, "model.ce_math", ("precise", "tanh_approx", "lean")),
        _one_of(m.head_kernel, "model.head_kernel", ("cublas", "gluon", "auto")),
        _one_of(m.head_rowsums, "model.head_rowsums", ("epilogue", "split", "consumers")),
        _one_of(m.qk_kernel, "model.qk_kernel", KERNEL_CHOICES),
        _one_of(m.mlp_kernel, "model.mlp_kernel", KERNEL_CHOICES),
        _one_of(m.embed_kernel, "model.embed_kernel", (*KERNEL_CHOICES, "rows")),
        (mlp_options_ok(m.mlp_options), "model.mlp_options",
         f"want KEY=INT items (KEY one of the kernel's launch keys, optionally fwd. or bwd.), got {m.mlp_options!r}"),
        (2 * m.value_embeds <= m.num_layers, "model.value_embeds",
         f"needs 2*value_embeds <= num_layers, got {m.value_embeds} for {m.num_layers} layers"),
        (m.gate_inputs <= m.model_dim, "model.gate_inputs", "must be <= model_dim"),
        (m.num_heads * m.head_dim == m.model_dim, "model.head_dim",
         f"num_heads x head_dim must equal model_dim, got {m.num_heads} x {m.head_dim} != {m.model_dim}"),
    ]


def _attention_checks(a: AttentionConfig, t: TrainConfig) -> list[Check]:
    tiles = a.sparse_block or a.block_size
    return [
        (not a.segment_len or t.seq_len % a.segment_len == 0, "attention.segment_len",
         f"train.seq_len={t.seq_len} must be a multiple of it"),
        _one_of(a.window, "attention.window", ("none", "fixed", "growing")),
        _one_of(a.backend, "attention.backend", ("auto", "flex", "dense", "gluon")),
        (a.backend != "gluon" or tiles == 64, "attention.backend",
         f"gluon runs on 64-token blocks: needs attention.sparse_block=64 (or block_size 64), got {tiles}"),
        _one_of(a.order_kernel, "attention.order_kernel", KERNEL_CHOICES),
        (flex_options_ok(a.flex_options), "attention.flex_options",
         f"must be KEY=VALUE pairs separated by commas (integers or true/false), got {a.flex_options!r}"),
        (a.sparse_block == 0 or (a.sparse_block >= 16 and a.block_size % a.sparse_block == 0
                                 and not a.sparse_block & (a.sparse_block - 1)), "attention.sparse_block",
         f"must be 0 or a power of two >= 16 dividing attention.block_size={a.block_size}, got {a.sparse_block}"),
        (not flex_options_ok(a.flex_options) or tiles_fit(a.flex_options, tiles),
         "attention.flex_options", f"its *_BLOCK_* tiles must divide the mask's block "
         f"(attention.sparse_block or block_size: {tiles}), got {a.flex_options!r}"),
    ]


def _shape_checks(t: TrainConfig, a: AttentionConfig) -> list[Check]:
    return [
        (t.seq_len > 0 and t.seq_len % a.block_size == 0, "train.seq_len",
         f"must be a positive multiple of attention.block_size={a.block_size}, got {t.seq_len}"),
        (t.val_seq_len > 0 and t.val_seq_len % a.block_size == 0, "train.val_seq_len",
         f"must be a positive multiple of attention.block_size={a.block_size}, got {t.val_seq_len}"),
        _one_of(t.dtype, "train.dtype", ("auto", "bfloat16", "float32")),
    ]


def _compile_checks(t: TrainConfig) -> list[Check]:
    whole = "needs the whole-model compile (train.compile auto or on), got train.compile=regional"
    return [
        _one_of(t.compile, "train.compile", ("auto", "on", "regional", "off")),
        (not (t.cudagraphs and t.compile == "regional"), "train.cudagraphs", whole),
        _one_of(t.grad_accum, "train.grad_accum", ("auto", "graph", "inplace", "autograd")),
        (not (t.grad_accum == "graph" and (t.cudagraphs or t.compile == "regional")), "train.grad_accum",
         "graph needs the whole-model compile without CUDA graphs (or no compile; inplace takes CUDA graphs), "
         f"got train.compile={t.compile}, train.cudagraphs={t.cudagraphs}"),
        (not (t.grad_accum == "inplace" and t.compile == "regional"), "train.grad_accum",
         "inplace needs the whole-model compile (or no compile), got train.compile=regional"),
    ]


def _run_checks(cfg: RunConfig) -> list[Check]:
    return [
        _one_of(cfg.optim.kind, "optim.kind", ("muon", "adamw")),
        _one_of(cfg.optim.kernel, "optim.kernel", KERNEL_CHOICES),
        _one_of(cfg.train.on_fault, "train.on_fault", ("stop", "recover")),
    ]


def validate(cfg: RunConfig, world_size: int = 1) -> None:
    """Refuse values that cannot run, each with one line naming the field."""
    m, a, t = cfg.model, cfg.attention, cfg.train
    for ok, name, msg in _range_checks(cfg):
        if not ok:
            raise ConfigError(f"{name}: {msg}")
    checks = (_shape_checks(t, a) + _model_checks(m) + _attention_checks(a, t) + _compile_checks(t)
              + _run_checks(cfg))
    if m.positions == "learned":
        span = a.segment_len or max(t.seq_len, t.val_seq_len)  # positions restart at each segment
        checks.append((span <= m.max_positions, "model.max_positions",
                       f"learned positions need max_positions >= {span} (attention.segment_len, or else "
                       f"train.seq_len and train.val_seq_len)"))
    for ok, name, msg in checks:
        if not ok:
            raise ConfigError(f"{name}: {msg}")
    if world_size not in ALLOWED_WORLD_SIZES or t.batch_seqs % world_size:
        raise ConfigError(
            f"world size {world_size}: preset '{cfg.name}' splits train.batch_seqs={t.batch_seqs} sequences "
            f"per step over 1, 2, 4 or 8 ranks dividing it; launch with one of "
            f"{[w for w in ALLOWED_WORLD_SIZES if t.batch_seqs % w == 0]} processes")
    if t.val_tokens and t.val_tokens % (world_size * t.val_seq_len):
        raise ConfigError(
            f"train.val_tokens: {t.val_tokens} is not a multiple of world size x train.val_seq_len "
            f"= {world_size} x {t.val_seq_len}")

