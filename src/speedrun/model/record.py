"""The 2026-07 record's model (#89), assembled from its parts: the reference every fast path matches.

Spec: `/work/shared/spec/record-2026-07.md`, section "Model" (parameters, input stage, coefficient
generators, layer map, attention sublayer, paired heads, MLP, layer 10, output, head and loss) and
"Unresolved / ambiguous" (the parameters no loss reaches). Why it is built this way:

- The parameters are the record's own tensors under the spec's names and shapes (one `qk_bank`, one
  `vo_bank`, one `mlp_bank`, one `value_embeds` of five tables, ...), so that the optimiser's
  groups, the checkpoints and an independent from-the-equations forward all address them by name.
  Layers are not modules: a layer is an index into the banks, and the layer map of the config says
  what each index does.
- Every dimension and every layer index comes from the frozen `RecordModelConfig`. The structure is
  fixed by the spec (11 layers, 6 heads, 26/41 gate lanes), so a tiny configuration keeps it and only
  shrinks width, head size, vocabulary and tables (`RecordModelConfig.tiny`). The gate lanes are not
  a hand-written table: `gate_lanes` derives them from the layer map in the spec's order, and gives
  26 and 41 at 6 heads.
- The math goes through `record_parts` (norm, hash, smear, rotary, key offset, paired heads, the
  reference attention, DC, XSA, VE gate), called as module attributes so that a test can watch
  them. Nothing here is fast: plain PyTorch, device-agnostic, activations in the `dtype` argument
  (bf16 as the record; float32 in tests), parameters in their table dtype and cast at use. The
  casts the spec makes part of the function are made in every dtype: resid/post lambdas and the
  gate scale γ are rounded to bf16 before use, so an fp32 run computes the same function.
- The seams a fast path replaces are named model functions: `attend` (varlen windowed attention),
  `dc_term` (layer 10's DC correction), the FP8 product behind `mlp` and `logits`, and `mlp` itself
  where it runs in bf16 (the eval forward, or training with the MLP's FP8 off). What serves
  them on a device is one `RecordKernels` value (`kernels`), which `kernels/record_attention.pick`
  chooses in one place; its empty default is the plain-PyTorch reference, which the CPU, float32
  and `train.kernels=reference` keep. The model imports no kernel. FP8 is the record's training
  math at `mlp` and `logits`: with `fp8` set (`record_fp8.Fp8Training`, which the trainer makes), a
  training forward runs them as FP8 products; an eval forward (`model.eval()`) stays bf16.
- `longest` (the stage's cut length, a Python int) rides along to the attention kernels, which size
  their grids by the longest document: given, no host read of the batch is needed and a compiled
  step keeps one graph per stage.
- One forward keeps its per-layer residuals in a small context (`_Pass.after`): the skip, cache7,
  MUDD and output read earlier residuals by layer index, and tests read them too (`residuals`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speedrun.errors import ConfigError
from speedrun.model import record_parts
from speedrun.model.record_fp8 import (Fp8Training, Product, fp8_head, fp8_mlp, mlp_backward_bf16,
                                       reference_product)
from speedrun.model.record_loss import record_eval_loss, record_training_loss

# (kind, layer) -> (generator 0 = pre-gate or 1 = post-gate, lanes)
Lanes = dict[tuple[str, int], tuple[int, slice]]
EVAL_ROWS = 8192  # rows of hidden states whose logits `eval_loss` holds at once
HALF = (torch.bfloat16, torch.float16)  # what the GPU kernels take; float32 stays on the references


@dataclass(frozen=True)
class RecordKernels:
    """What serves the model's seams on a device (None: the plain-PyTorch reference).

    attend(q, k, v, cu_seqlens, window, scale, longest) -> y, as `record_parts.reference_attention`;
    dc(q, k, v, cu_seqlens, w1, w2, scale, keys, eps, longest) -> the float32 term, as
    `record_parts.dc_correction`; fp8_product(a_f8, b_f8_t, scale, out_dtype), as
    `record_fp8.reference_product`; loss(z, targets_next, mtp_weights, prefix_weight, prefix) -> the
    float32 sum, as `record_loss.record_training_loss`; mlp(a, w1, w2) -> relu(a·W1ᵀ)²·W2, the bf16
    MLP where FP8 does not serve it, as `record_fp8.mlp_reference`; head_loss(h, lm_head,
    targets_next, mtp_weights, prefix_weight, prefix, fp8_cfg, fp8_product) -> the float32 sum, as
    `RecordGPT.head_loss` with the FP8 head; mlp_backward(g, a, w1, w2, post) -> (da, dW1, dW2), the
    FP8 MLP's bf16 backward, as `record_fp8.mlp_backward_bf16`. attend, dc, loss and head_loss serve
    half-precision inputs only, mlp bfloat16 only."""

    name: str = "reference"
    attend: Callable | None = None
    dc: Callable | None = None
    fp8_product: Product = reference_product
    loss: Callable | None = None
    mlp: Callable | None = None
    head_loss: Callable | None = None
    mlp_backward: Callable | None = None


@dataclass(frozen=True)
class RecordModelConfig:
    """The 2026-07 record's model constants (spec "Model": parameters table, "Input stage",
    "Coefficient generators", "Layer map", "Attention sublayer", "Paired-head attention", "MLP",
    "Layer 10", "Output"). Defaults are the record; `tiny()` shrinks sizes, keeps the structure."""

    vocab: int = 50_304  # GPT-2's 50,257 ids padded to a multiple of 128
    model_dim: int = 768
    num_heads: int = 6
    head_dim: int = 128
    num_layers: int = 11
    mlp_hidden: int = 3072
    sign_rows: int = 8192
    bigram_factor: int = 15  # the bigram hash table holds vocab · bigram_factor // 2 rows (a CPU demo shrinks it)
    smear_inputs: int = 12  # e[t][0:12] drives the smear gate
    ve_gate_inputs: int = 6  # a[0:6] and ve[0:6] drive a VE gate
    rope_base: float = 1024.0
    dc_keys: int = 112
    dc_eps: float = 1e-6
    xsa_eps: float = 1e-8
    norm_eps: float = 1.1920928955078125e-07
    mudd_dim: int = 64  # hidden width of the four coefficient generators
    # techniques as switches (the ladder turns them on one by one); the layer lists below switch the
    # per-layer ones (an empty list: none), the stages and optimiser configs the schedule's
    smear: bool = True  # e[t] += λ·σ(gate(e[t][0:12]))·e[t−1] inside a document
    bigram: bool = True  # the hashed bigram embedding b, injected at the input and after every attention
    x0_inject: bool = True  # + g_x0·x0 after every attention layer but the MUDD one
    skip: bool = True  # layer 6 (no attention) adds σ(λ)·post28·cache3; off: it adds nothing
    dc: bool = True  # layer 10's DC correction over the last dc_keys keys
    # MUDD block 0 mixes layer 10's inputs and value from earlier residuals, block 1 the output; off:
    # layer 10 is a plain attention layer (its own VE gate, x0 and bigram lanes) and the output norm(x)
    mudd: bool = True
    # layer map
    no_attn_layer: int = 6
    long_layers: tuple[int, ...] = (3, 10)
    paired_layers: tuple[int, ...] = (0, 2, 5, 9)
    xsa_layers: tuple[int, ...] = (1, 3, 4, 7)
    ve_layers: tuple[int, ...] = (1, 2, 8, 9, 10)  # value table k feeds ve_layers[k]
    out_gate_layers: tuple[int, ...] = (3, 10)
    key_offset_layers: tuple[int, ...] = (3, 10)
    cache7_layer: int = 7
    cache7_input_layers: tuple[int, ...] = (8, 9, 10)
    dc_layer: int = 10
    mudd_layer: int = 10  # MUDD block 0; block 1 runs after the last layer
    skip_source: int = 3  # cache3 feeds the layer-6 skip and the post-gate
    post_gate_layer: int = 4  # the post-gate is generated from the residual entering this layer
    # init
    head_std: float = 0.005
    value_embed_std: float = 0.01
    attn_lambdas_init: tuple[float, float] = (0.5, 1.0)  # λ0 (Q, K, V), λ1 (O)
    smear_lambda_init: float = 0.0
    skip_lambda_init: float = -1.5
    resid_lambda_init: float = math.sqrt(1.1)
    post_lambda_init: float = 1.0
    gate_scale_init: float = 0.1  # γ, trained
    mudd_scale: float = 0.1  # constant
    # effective initial coefficient of each gate lane kind (stored bias = value / 0.1)
    gate_inits: tuple[tuple[str, float], ...] = (
        ("xsa", 0.0), ("out_gate", 0.25), ("x0", 0.0), ("bigram", 0.05), ("skip", 0.5),
        ("dc_w1", 1.0), ("dc_w2", 0.0),
    )
    # effective initial μ (block 0, 14 lanes) and ν (block 1, 5 lanes)
    mudd_inits: tuple[tuple[float, ...], ...] = (
        (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 2.0, math.sqrt(1.1), 1.0, 0.0, 0.05, math.sqrt(1.1), 1.0),
        (0.0, -0.5, 0.0, 0.0, 0.0),
    )

    def __post_init__(self) -> None:
        if self.num_heads * self.head_dim != self.model_dim:
            raise ConfigError(f"record model: heads × head_dim must equal the width ({self.model_dim})")
        if self.num_heads % 2 or self.head_dim % 4:
            raise ConfigError("record model: heads must pair up and head_dim be a multiple of 4")
        if max(self.smear_inputs, self.ve_gate_inputs) > self.model_dim:
            raise ConfigError("record model: gate inputs wider than the model")
        if tuple(len(m) for m in self.mudd_inits) != (14, 5):
            raise ConfigError("record model: MUDD blocks have 14 and 5 coefficients")

    @classmethod
    def tiny(cls) -> RecordModelConfig:
        """The record's structure at a CPU-test size: width 96 (6 heads of 16), vocabulary 128."""
        return cls(vocab=128, model_dim=96, head_dim=16, mlp_hidden=384, sign_rows=64, mudd_dim=16)

    @property
    def bigram_rows(self) -> int:
        """V_b = V·15 // 2 (377,280): the last row is the hash's reserved sentinel."""
        return self.vocab * self.bigram_factor // 2

    @property
    def rope_pairs(self) -> int:
        """Rotated pairs per head (32): dims 0 … 2p−1 rotate, the upper half does not."""
        return self.head_dim // 4

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if i != self.no_attn_layer)

    def attention_index(self, layer: int) -> int:
        """j = i below the attention-less layer, i − 1 above it."""
        return self.attention_layers.index(layer)

    @property
    def qk_matrices(self) -> int:
        """60: per attention layer, H/2 Q head-pairs then H/2 K head-pairs, (2·head_dim, width) each."""
        return self.num_heads * len(self.attention_layers)

    @property
    def vo_matrices(self) -> int:
        """20: W_V and W_O per attention layer."""
        return 2 * len(self.attention_layers)

    @property
    def mlp_bank_layers(self) -> int:
        """12: the last layer of the bank is padding, never used."""
        return self.num_layers + 1

    def bank_pads(self, world_size: int) -> tuple[int, int]:
        """Zero matrices padding qk_bank and vo_bank to a multiple of the world size: (4, 4) at 8."""
        if world_size < 1:
            raise ConfigError(f"record model: world_size must be >= 1, got {world_size}")
        return (-self.qk_matrices) % world_size, (-self.vo_matrices) % world_size

    @property
    def gate_outputs(self) -> tuple[int, int]:
        """Lanes used of the pre- and post-gate (26, 41)."""
        ends = [0, 0]
        for k, lanes in gate_lanes(self).values():
            ends[k] = max(ends[k], lanes.stop)
        return ends[0], ends[1]


def gate_lanes(cfg: RecordModelConfig) -> Lanes:
    """Where each per-token coefficient sits in the two gate generators (spec, the pre-gate and
    post-gate tables): the pre-gate serves layers < post_gate_layer, the post-gate the rest. Within
    one, in order: XSA α per head of each XSA layer, the output gate per head of each out-gate
    layer, (x0, bigram) of each attention layer but the MUDD one, the skip, DC w1 and w2 per head."""
    H, spans = cfg.num_heads, (range(cfg.post_gate_layer), range(cfg.post_gate_layer, cfg.num_layers))
    lanes: Lanes = {}
    for k, layers in enumerate(spans):
        order = [("xsa", i, H) for i in layers if i in cfg.xsa_layers]
        order += [("out_gate", i, H) for i in layers if i in cfg.out_gate_layers]
        plain = [i for i in layers if i in cfg.attention_layers and not (cfg.mudd and i == cfg.mudd_layer)]
        order += [(kind, i, 1) for i in plain for kind in ("x0", "bigram")]
        order += [("skip", i, 1) for i in layers if i == cfg.no_attn_layer]
        order += [(kind, i, H) for i in layers if i == cfg.dc_layer for kind in ("dc_w1", "dc_w2")]
        start = 0
        for kind, i, width in order:
            lanes[(kind, i)] = (k, slice(start, start + width))
            start += width
    return lanes


@dataclass
class _Pass:
    """What one forward's layers read besides the residual they transform."""

    tokens: Tensor  # int64 (n,)
    cu_seqlens: Tensor
    windows: tuple[int, int]  # (short, long) in tokens
    attn_scale: float
    cos: Tensor  # (≥ 2n, pairs) bf16: the paired layers read positions up to 2n − 1
    sin: Tensor
    dtype: torch.dtype
    longest: int | None = None  # no document is longer (the kernels' grid bound); None: read it
    sets: int = 1  # piece sets end to end: smear, bigram hash, key offset and rotary positions restart at each
    x0: Tensor | None = None  # the normed smeared embedding, without the bigram
    bigram: Tensor | None = None
    gates: list[Tensor] = field(default_factory=list)  # pre-gate, then post-gate outputs (n, lanes)
    after: dict[int, Tensor] = field(default_factory=dict)  # residual after layer i; −1: cache0
    ve: Tensor | None = None  # (tables, n, width): every value table's rows for the batch, one gather
    banks: dict[str, tuple[Tensor, ...]] = field(default_factory=dict)  # the banks' views (RecordGPT._bank)


def _draw_uniform(shape: Sequence[int], bound: float, gen: torch.Generator) -> Tensor:
    return torch.empty(shape, device=gen.device).uniform_(-bound, bound, generator=gen)


def _draw_normal(shape: Sequence[int], std: float, gen: torch.Generator) -> Tensor:
    return torch.randn(shape, device=gen.device, generator=gen) * std


class RecordGPT(nn.Module):
    """The 2026-07 record's network (spec "Model"); `forward` returns the final normed hidden states.

    world_size sets the zero pads of qk_bank/vo_bank (none below 8). On the meta device nothing is
    initialised (parameter counts cost no memory); elsewhere `reset_parameters(generator)` runs."""

    def __init__(self, cfg: RecordModelConfig = RecordModelConfig(), world_size: int = 1,
                 device: torch.device | str | None = None, generator: torch.Generator | None = None):
        super().__init__()
        self.cfg, self.world_size, self.lanes = cfg, world_size, gate_lanes(cfg)
        self.tied = True  # until the split step embed = lm_headᵀ, kept so by the optimiser
        self.fp8: Fp8Training | None = None  # the FP8 products of training forwards (None: bf16)
        self.kernels = RecordKernels()  # the references until the trainer picks a device's
        self._make_parameters(device)
        if self.embed.device.type != "meta":
            self.reset_parameters(generator)

    @property
    def use_fp8(self) -> bool:
        return self.fp8 is not None

    @use_fp8.setter
    def use_fp8(self, on: bool) -> None:
        """Off for good: a recovery from a fault trains on in bf16 (turning it on is the trainer's)."""
        if not on:
            self.fp8 = None

    def _make_parameters(self, device: torch.device | str | None) -> None:
        """The spec's table, in its order and dtypes; values come from `reset_parameters`."""
        c, (qk_pad, vo_pad) = self.cfg, self.cfg.bank_pads(self.world_size)
        V, d, L, H, D = c.vocab, c.model_dim, c.num_layers, c.num_heads, c.head_dim

        def p(*shape: int, dtype: torch.dtype = torch.bfloat16) -> nn.Parameter:
            return nn.Parameter(torch.empty(shape, dtype=dtype, device=device))

        self.embed, self.lm_head = p(V, d), p(d, V)  # lm_head stored (in, out)
        self.bigram_embed = p(c.bigram_rows, d)
        self.value_embeds = p(len(c.ve_layers) * V, d)
        self.ve_gate_bank = p(len(c.ve_layers), H, 2 * c.ve_gate_inputs)
        self.smear_gate = p(1, c.smear_inputs)
        self.qk_bank = p(c.qk_matrices + qk_pad, 2 * D, d)
        self.vo_bank = p(c.vo_matrices + vo_pad, d, d)
        self.mlp_bank = p(c.mlp_bank_layers, 2, c.mlp_hidden, d)
        self.scalars = p(2 * L + 2, dtype=torch.float32)
        self.resid_lambdas = p(L, 2, dtype=torch.float32)
        self.post_lambdas = p(L, 2, dtype=torch.float32)
        mudd_rows = max(len(m) for m in c.mudd_inits)  # 14: block 1 leaves rows 5 … 13 unused
        self.mudd_w1, self.mudd_w2 = p(2, c.mudd_dim, d), p(2, mudd_rows, c.mudd_dim)
        self.mudd_b2 = p(2, mudd_rows)
        lanes = max(c.gate_outputs)
        self.mudd_gate_w1, self.mudd_gate_w2 = p(2, c.mudd_dim, d), p(2, lanes, c.mudd_dim)
        self.mudd_gate_b2 = p(2, lanes)
        self.mudd_gate_scale = p(dtype=torch.float32)
        # fixed ±1 table, not trained; persistent so that a checkpoint reproduces the function
        self.register_buffer("bigram_signs", torch.empty(c.sign_rows, d, dtype=torch.bfloat16, device=device))

    # ------------------------------------------------------------ init

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Init as the spec's table; draws on `generator`'s device (a fresh CPU generator seeded from
        the global RNG if None: the record sets no seed). Ends tied: embed = lm_headᵀ."""
        gen = generator if generator is not None else torch.Generator().manual_seed(
            int(torch.randint(0, 2**62, (1,)).item()))
        c = self.cfg
        self.lm_head.copy_(_draw_normal(self.lm_head.shape, c.head_std, gen))
        self.bigram_embed.zero_()
        self.value_embeds.copy_(_draw_normal(self.value_embeds.shape, c.value_embed_std, gen))
        self.ve_gate_bank.zero_()
        self.smear_gate.zero_()
        self._init_banks(gen)
        self._init_scalars()
        self._init_generators(gen)
        self.bigram_signs.copy_(record_parts.sign_table(gen, c.sign_rows, c.model_dim))
        self.tie()

    def _init_banks(self, gen: torch.Generator) -> None:
        """Q, K, V, O and every MLP up-projection U(±√3·0.5·width^−½) (±1/32); MLP down-projections
        and the world-size pads zero."""
        c = self.cfg
        bound = math.sqrt(3) * 0.5 * c.model_dim**-0.5
        for bank, real in ((self.qk_bank, c.qk_matrices), (self.vo_bank, c.vo_matrices)):
            bank.zero_()
            bank[:real].copy_(_draw_uniform(bank[:real].shape, bound, gen))
        self.mlp_bank.zero_()
        self.mlp_bank[:, 0].copy_(_draw_uniform(self.mlp_bank[:, 0].shape, bound, gen))

    def _init_scalars(self) -> None:
        c, L = self.cfg, self.cfg.num_layers
        self.scalars[0 : 2 * L : 2] = c.attn_lambdas_init[0]
        self.scalars[1 : 2 * L : 2] = c.attn_lambdas_init[1]
        self.scalars[2 * L] = c.smear_lambda_init
        self.scalars[2 * L + 1] = c.skip_lambda_init
        self.resid_lambdas.fill_(c.resid_lambda_init)
        self.post_lambdas.fill_(c.post_lambda_init)

    def _init_generators(self, gen: torch.Generator) -> None:
        """W1 kaiming U(±1/√width), W2 zero, so every coefficient starts at its bias: the effective
        initial value ÷ 0.1, rounded to bf16 (√1.1 → 10.5, acting as ≈ 1.05)."""
        c, bound = self.cfg, 1 / math.sqrt(self.cfg.model_dim)
        for w1 in (self.mudd_w1, self.mudd_gate_w1):
            w1.copy_(_draw_uniform(w1.shape, bound, gen))
        self.mudd_w2.zero_()
        self.mudd_gate_w2.zero_()
        self.mudd_b2.zero_()
        for k, inits in enumerate(c.mudd_inits):
            self.mudd_b2[k, : len(inits)] = torch.tensor(inits, dtype=torch.float64) / c.mudd_scale
        self.mudd_gate_b2.zero_()
        value = dict(c.gate_inits)
        for (kind, _), (k, lanes) in self.lanes.items():
            self.mudd_gate_b2[k, lanes] = value[kind] / c.gate_scale_init
        self.mudd_gate_scale.fill_(c.gate_scale_init)

    @torch.no_grad()
    def tie(self) -> None:
        """embed ← lm_headᵀ and mark the pair tied (the state until the split step)."""
        self.embed.copy_(self.lm_head.T)
        self.tied = True

    def untie(self) -> None:
        """From the split step on, embed and lm_head are separate parameters."""
        self.tied = False

    def unused_entries(self) -> list[tuple[str, tuple]]:
        """(parameter name, index) of every entry no loss reaches (spec "Unresolved / ambiguous"),
        plus the world-size pads: their gradient is exactly zero. For the whole record (every
        technique switch on); a switch turned off leaves more."""
        c, L = self.cfg, self.cfg.num_layers
        g0, m1, six = c.gate_outputs[0], len(c.mudd_inits[1]), c.no_attn_layer
        out: list[tuple[str, tuple]] = [
            ("ve_gate_bank", (c.ve_layers.index(c.mudd_layer),)),  # layer 10's VE gate is μ6/μ7
            ("scalars", (slice(2 * six, 2 * six + 2),)),
            ("resid_lambdas", (six, 0)), ("post_lambdas", (six, 0)),
            ("resid_lambdas", (c.mudd_layer,)), ("post_lambdas", (c.mudd_layer,)),  # μ8, μ9, μ12, μ13
            ("mudd_w2", (1, slice(m1, None))), ("mudd_b2", (1, slice(m1, None))),
            ("mudd_gate_w2", (0, slice(g0, None))), ("mudd_gate_b2", (0, slice(g0, None))),
            ("mlp_bank", (slice(L, None),)),
        ]
        qk_pad, vo_pad = c.bank_pads(self.world_size)
        out += [("qk_bank", (slice(c.qk_matrices, None),))] if qk_pad else []
        out += [("vo_bank", (slice(c.vo_matrices, None),))] if vo_pad else []
        return out

    # ------------------------------------------------------------ coefficient generators

    def gate(self, k: int, z: Tensor) -> Tensor:
        """gate_k(z) = (W2·gelu(W1·z) + b2)·γ, the used lanes (n, 26 | 41); γ rounded to bf16."""
        m = self.cfg.gate_outputs[k]
        hid = F.gelu(z @ self.mudd_gate_w1[k].to(z.dtype).T)
        out = hid @ self.mudd_gate_w2[k, :m].to(z.dtype).T + self.mudd_gate_b2[k, :m].to(z.dtype)
        return out * self.mudd_gate_scale.to(torch.bfloat16).to(z.dtype)

    def mudd(self, k: int, z: Tensor) -> Tensor:
        """mudd_k(z) = (W2·gelu(W1·z) + b2)·0.1, the used lanes (n, 14 | 5)."""
        m = len(self.cfg.mudd_inits[k])
        hid = F.gelu(z @ self.mudd_w1[k].to(z.dtype).T)
        return (hid @ self.mudd_w2[k, :m].to(z.dtype).T + self.mudd_b2[k, :m].to(z.dtype)) * self.cfg.mudd_scale

    def _coef(self, ctx: _Pass, kind: str, layer: int) -> Tensor:
        """The (n, width) lanes of `kind` for `layer` from the generator that holds them."""
        k, lanes = self.lanes[(kind, layer)]
        return ctx.gates[k][:, lanes]

    # ------------------------------------------------------------ forward

    def forward(self, inputs: Tensor, cu_seqlens: Tensor, windows: tuple[int, int], attn_scale: float,
                freqs: Tensor | None = None, *, rope: tuple[Tensor, Tensor] | None = None,
                dtype: torch.dtype = torch.bfloat16, longest: int | None = None, sets: int = 1) -> Tensor:
        """Final normed hidden states (n, width) in `dtype` of one packed local batch: inputs int
        (n,), cu_seqlens int (documents, padded by repeating n), windows (short, long) in tokens,
        attn_scale the softmax scale (YaRN). RoPE from float32 `freqs` (the record's initial ones if
        None) or from ready (cos, sin) tables of at least 2n positions. `longest` bounds the
        documents' length for the kernels (module docstring). `sets` > 1: the batch is that many
        piece sets of n / sets tokens end to end (`documents.concat`), each computed as its own
        local batch would be."""
        return self._output(self._run(inputs, cu_seqlens, windows, attn_scale, freqs, rope, dtype, longest, sets))

    def residuals(self, inputs: Tensor, cu_seqlens: Tensor, windows: tuple[int, int], attn_scale: float,
                  freqs: Tensor | None = None, *, rope: tuple[Tensor, Tensor] | None = None,
                  dtype: torch.dtype = torch.bfloat16) -> dict[int, Tensor]:
        """The residual stream after each layer i (key −1: cache0, entering layer 0)."""
        return dict(self._run(inputs, cu_seqlens, windows, attn_scale, freqs, rope, dtype).after)

    def _run(self, inputs: Tensor, cu_seqlens: Tensor, windows: tuple[int, int], attn_scale: float,
             freqs: Tensor | None, rope: tuple[Tensor, Tensor] | None, dtype: torch.dtype,
             longest: int | None = None, sets: int = 1) -> _Pass:
        tokens = inputs.reshape(-1).long()
        if sets < 1 or tokens.numel() % sets:
            raise ValueError(f"{tokens.numel()} tokens do not split into {sets} piece sets")
        if rope is None:
            f = freqs if freqs is not None else record_parts.rope_freqs(self.cfg.rope_pairs, self.cfg.rope_base)
            rope = record_parts.rope_tables(f.to(tokens.device), 2 * tokens.numel())
        ctx = _Pass(tokens, cu_seqlens.reshape(-1), tuple(windows), float(attn_scale), rope[0], rope[1], dtype,
                    longest, sets)
        x = self._input_stage(ctx)
        for i in range(self.cfg.num_layers):
            x = self._layer(i, x, ctx)
        return ctx

    def _input_stage(self, ctx: _Pass) -> Tensor:
        """Embed, smear, x0 = norm, pre-gate from x0, then x = x0 + pre19·b (layer 0's bigram gate),
        which is cache0."""
        c, t = self.cfg, ctx.tokens
        e = self.embed[t].to(ctx.dtype)
        if c.smear:
            smear = functools.partial(record_parts.smear, gate_w=self.smear_gate, lam=self.scalars[2 * c.num_layers],
                                      inputs=c.smear_inputs)
            e = _per_set(smear, e, ctx.sets)
        ctx.x0 = record_parts.norm(e, c.norm_eps)
        ctx.bigram = self._bigram(t, ctx.dtype, ctx.sets) if c.bigram else torch.zeros_like(ctx.x0)
        ctx.gates.append(self.gate(0, ctx.x0))
        x = ctx.x0 + self._coef(ctx, "bigram", 0) * ctx.bigram
        ctx.after[-1] = x
        return x

    def _bigram(self, tokens: Tensor, dtype: torch.dtype, sets: int = 1) -> Tensor:
        """b (n, width): the hashed bigram rows times their ±1 signs, each piece set hashed alone."""
        c = self.cfg
        h = _per_set(functools.partial(record_parts.bigram_hash, rows=c.bigram_rows), tokens, sets)
        s = _per_set(functools.partial(record_parts.bigram_sign_index, rows=c.sign_rows), tokens, sets)
        return record_parts.bigram_vector(self.bigram_embed, self.bigram_signs, h, s).to(dtype)

    def _layer(self, i: int, x: Tensor, ctx: _Pass) -> Tensor:
        c = self.cfg
        if i == c.post_gate_layer:  # from the raw residual entering this layer (cache3)
            ctx.gates.append(self.gate(1, x))
        if c.mudd and i == c.mudd_layer:
            x = self._mudd_layer(x, ctx)
        else:
            x = self._skip(x, ctx) if i == c.no_attn_layer else self._attention_residual(i, x, ctx)
            x = self._mlp_residual(i, x, ctx)
        ctx.after[i] = x
        return x

    def _lambda(self, table: Tensor, i: int, col: int, dtype: torch.dtype) -> Tensor:
        """resid/post λ: fp32 parameters that act rounded to bf16 (√1.1 acts as 1.046875)."""
        return table[i, col].to(torch.bfloat16).to(dtype)

    def _skip(self, x: Tensor, ctx: _Pass) -> Tensor:
        """The attention-less layer: x + σ(λ_skip)·post28·cache3."""
        c = self.cfg
        if not c.skip:
            return x
        lam = torch.sigmoid(self.scalars[2 * c.num_layers + 1]).to(ctx.dtype)
        return x + lam * self._coef(ctx, "skip", c.no_attn_layer) * ctx.after[c.skip_source]

    def _attention_input(self, i: int, x: Tensor, ctx: _Pass) -> Tensor:
        src = ctx.after[self.cfg.cache7_layer] if i in self.cfg.cache7_input_layers else x
        return record_parts.norm(src, self.cfg.norm_eps)

    def _attention_residual(self, i: int, x: Tensor, ctx: _Pass) -> Tensor:
        """x ← r·x + p·attn + g_x0·x0, then x ← x + g_big·b (layer 0's bigram came before it)."""
        a = self._attention_input(i, x, ctx)
        out = self.attention(i, a, self._value_aux(i, a, ctx), ctx)
        r, p = self._lambda(self.resid_lambdas, i, 0, ctx.dtype), self._lambda(self.post_lambdas, i, 0, ctx.dtype)
        x = r * x + p * out + (self._coef(ctx, "x0", i) * ctx.x0 if self.cfg.x0_inject else 0)
        return x + self._coef(ctx, "bigram", i) * ctx.bigram if i > 0 else x

    def _mlp_residual(self, i: int, x: Tensor, ctx: _Pass) -> Tensor:
        r, p = self._lambda(self.resid_lambdas, i, 1, ctx.dtype), self._lambda(self.post_lambdas, i, 1, ctx.dtype)
        return r * x + p * self.mlp(i, record_parts.norm(x, self.cfg.norm_eps), ctx)

    def _bank(self, name: str, ctx: _Pass | None) -> tuple[Tensor, ...]:
        """The views of a bank that the layers read, made once a forward (`record_parts.bank_views`,
        whose backward writes each matrix's gradient once): "qk" in blocks of H/2 matrices (a layer's
        Q head-pairs, then its K head-pairs), "vo" and "mlp" (W1, W2 of each layer in turn) by matrix."""
        if ctx is not None and name in ctx.banks:
            return ctx.banks[name]
        bank, rows = {"qk": (self.qk_bank, self.cfg.num_heads // 2), "vo": (self.vo_bank, 1),
                      "mlp": (self.mlp_bank.flatten(0, 1), 1)}[name]
        views = record_parts.bank_views(bank, rows)
        if ctx is not None:
            ctx.banks[name] = views
        return views

    def mlp(self, layer: int, a: Tensor, ctx: _Pass | None = None) -> Tensor:
        """relu(a·W1ᵀ)²·W2 of one layer, in a's dtype: the seam of the FP8 MLP."""
        bank = self._bank("mlp", ctx)
        w1, w2 = bank[2 * layer].to(a.dtype), bank[2 * layer + 1].to(a.dtype)
        if self.training and self.fp8 is not None and self.fp8.mlp is not None:
            backward = self.kernels.mlp_backward or mlp_backward_bf16
            return fp8_mlp(a, w1, w2, self.fp8.mlp[layer], True, self.kernels.fp8_product, backward)
        if self.kernels.mlp is not None and a.dtype == torch.bfloat16:
            return self.kernels.mlp(a, w1, w2)
        return F.relu(a @ w1.T).square() @ w2

    def _value_rows(self, k: int, ctx: _Pass) -> Tensor:
        """Rows of value table k (of the five in `value_embeds`) for the batch's tokens. All tables'
        rows come from one gather, made at the first call of a forward: its backward is one scatter
        into one zeroed table-sized gradient, where a gather per use made one each (six, 386 MB
        apiece at the record's size) and added them, every micro-step."""
        if ctx.ve is None:
            tables = self.value_embeds.shape[0] // self.cfg.vocab
            offsets = torch.arange(tables, device=ctx.tokens.device)[:, None] * self.cfg.vocab
            ctx.ve = self.value_embeds[offsets + ctx.tokens[None]]
        return ctx.ve[k].to(ctx.dtype)

    def _value_aux(self, i: int, a: Tensor, ctx: _Pass) -> Tensor | None:
        """g_h·ve_h per head (n, H, D) with g = 2σ(G_k·[a[0:6], ve[0:6]]) on the VE layers, else None."""
        c = self.cfg
        if i not in c.ve_layers:
            return None
        k = c.ve_layers.index(i)
        ve = self._value_rows(k, ctx)
        g = record_parts.value_embed_gate(a, ve, self.ve_gate_bank[k], c.ve_gate_inputs)
        return g[..., None] * ve.view(-1, c.num_heads, c.head_dim)

    # ------------------------------------------------------------ attention

    def attention(self, i: int, a: Tensor, aux_v: Tensor | None, ctx: _Pass) -> Tensor:
        """Layer i's attention sublayer on input a (n, width): projections and QK-norm, + aux_v,
        rotary (per-head positions on paired layers), key offset, attention, DC, XSA, output gate,
        then y·(λ1·W_O)ᵀ."""
        q, k, v = self._qkv(i, a, aux_v, ctx)
        q, k = self._rotary(i, q, k, ctx)
        y = self._attend_layer(i, q, k, v, ctx)
        y = self._after_attention(i, y, q, k, v, ctx)
        c, j = self.cfg, self.cfg.attention_index(i)
        w_o = self._bank("vo", ctx)[2 * j + 1].to(a.dtype) * self.scalars[2 * i + 1].to(a.dtype)
        return y.reshape(-1, c.model_dim) @ w_o.T

    def _qkv(self, i: int, a: Tensor, aux_v: Tensor | None, ctx: _Pass) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (n, H, D) = a·(λ0·W)ᵀ; q, k RMS-normed per head; v + aux_v."""
        c, j = self.cfg, self.cfg.attention_index(i)
        H, D = c.num_heads, c.head_dim
        qk = self._bank("qk", ctx)  # blocks of H/2 matrices: 2j holds layer j's Q head-pairs, 2j + 1 its K
        w_q, w_k = qk[2 * j].reshape(H * D, c.model_dim), qk[2 * j + 1].reshape(H * D, c.model_dim)
        w = torch.cat((w_q, w_k, self._bank("vo", ctx)[2 * j])).to(a.dtype) * self.scalars[2 * i].to(a.dtype)
        q, k, v = (a @ w.T).view(-1, 3, H, D).unbind(1)
        q, k = record_parts.norm(q, c.norm_eps), record_parts.norm(k, c.norm_eps)
        return q, k, v if aux_v is None else v + aux_v

    def _rotary(self, i: int, q: Tensor, k: Tensor, ctx: _Pass) -> tuple[Tensor, Tensor]:
        """Adjacent-pair rotary at the token's packed position, or at 2t + (h mod 2) per head on the
        paired layers; then the key offset of dims 2p … D−1 on the key-offset layers."""
        c, n = self.cfg, q.shape[0] // ctx.sets  # positions count from each piece set's start
        if i in c.paired_layers:
            pos = record_parts.paired_positions(n, c.num_heads, device=q.device)
            pos = pos if ctx.sets == 1 else pos.repeat(ctx.sets, 1)
            cos, sin = ctx.cos[pos], ctx.sin[pos]
        else:
            cos, sin = ctx.cos[:n], ctx.sin[:n]
            if ctx.sets > 1:
                cos, sin = cos.repeat(ctx.sets, 1), sin.repeat(ctx.sets, 1)
        q, k = record_parts.rotate_adjacent(q, cos, sin), record_parts.rotate_adjacent(k, cos, sin)
        if i in c.key_offset_layers:
            k = _per_set(functools.partial(record_parts.key_offset, start=2 * c.rope_pairs), k, ctx.sets)
        return q, k

    def _attend_layer(self, i: int, q: Tensor, k: Tensor, v: Tensor, ctx: _Pass) -> Tensor:
        """Windowed document-causal attention; the paired layers attend over (2n, H/2) rows with
        doubled document bounds and the window not doubled (it counts rows)."""
        window = ctx.windows[1] if i in self.cfg.long_layers else ctx.windows[0]
        if i not in self.cfg.paired_layers:
            return self.attend(q, k, v, ctx.cu_seqlens, window, ctx.attn_scale, ctx.longest)
        pq, pk, pv = (record_parts.pair_heads(z.contiguous()) for z in (q, k, v))
        longest = None if ctx.longest is None else 2 * ctx.longest
        y = self.attend(pq, pk, pv, record_parts.pair_cu_seqlens(ctx.cu_seqlens), window, ctx.attn_scale, longest)
        return record_parts.unpair_heads(y)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, window: int, scale: float,
               longest: int | None = None) -> Tensor:
        """FA3 varlen semantics on (rows, heads, D): `kernels.attend` on half precision, else the reference."""
        if self.kernels.attend is not None and q.dtype in HALF:
            return self.kernels.attend(q, k, v, cu_seqlens, window, scale, longest)
        return record_parts.reference_attention(q, k, v, cu_seqlens, window, scale)

    def dc_term(self, q: Tensor, k: Tensor, v: Tensor, ctx: _Pass, w1: Tensor, w2: Tensor) -> Tensor:
        """Layer 10's float32 DC term: `kernels.dc` on half precision, else `record_parts.dc_correction`."""
        c = self.cfg
        if self.kernels.dc is not None and q.dtype in HALF:
            return self.kernels.dc(q, k, v, ctx.cu_seqlens, w1, w2, ctx.attn_scale, c.dc_keys, c.dc_eps, ctx.longest)
        return record_parts.dc_correction(q, k, v, ctx.cu_seqlens, w1, w2, ctx.attn_scale, c.dc_keys, c.dc_eps)

    def _after_attention(self, i: int, y: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: _Pass) -> Tensor:
        """DC (added in float32, rounded once), XSA against the token's own v, the raw output gate."""
        c = self.cfg
        if i == c.dc_layer and c.dc:
            term = self.dc_term(q, k, v, ctx, self._coef(ctx, "dc_w1", i), self._coef(ctx, "dc_w2", i))
            y = (y.float() + term).to(y.dtype)
        if ("xsa", i) in self.lanes:
            y = record_parts.xsa(y, v, self._coef(ctx, "xsa", i), c.xsa_eps)
        if ("out_gate", i) in self.lanes:
            y = y * self._coef(ctx, "out_gate", i)[..., None]
        return y

    # ------------------------------------------------------------ layer 10 and the output

    def _mudd_layer(self, h: Tensor, ctx: _Pass) -> Tensor:
        """Layer 10 with MUDD block 0 (μ from h = cache9, the residual entering it)."""
        c, i = self.cfg, self.cfg.mudd_layer
        mu = self.mudd(0, h).split(1, dim=-1)
        c0, c7 = ctx.after[-1], ctx.after[c.cache7_layer]
        x = (1 + mu[5]) * h + mu[3] * c0 + mu[4] * c7
        a = self._attention_input(i, x, ctx)
        out = self.attention(i, a, self._mudd_value_aux(mu, h, ctx), ctx)
        x = mu[8] * x + mu[9] * out + mu[10] * c0 + mu[11] * ctx.bigram
        return mu[12] * x + mu[13] * self.mlp(i, record_parts.norm(x, c.norm_eps), ctx)

    def _mudd_value_aux(self, mu: Sequence[Tensor], h: Tensor, ctx: _Pass) -> Tensor:
        """[μ6 × H/2, μ7 × H/2]_h·ve4_h + v_mudd_h, v_mudd = μ0·cache0 + μ1·cache7 + μ2·h."""
        c = self.cfg
        n, H, D = h.shape[0], c.num_heads, c.head_dim
        v_mudd = mu[0] * ctx.after[-1] + mu[1] * ctx.after[c.cache7_layer] + mu[2] * h
        g = torch.cat((mu[6].expand(n, H // 2), mu[7].expand(n, H - H // 2)), dim=-1)
        ve = self._value_rows(c.ve_layers.index(c.mudd_layer), ctx)
        return g[..., None] * ve.view(n, H, D) + v_mudd.view(n, H, D)

    def _output(self, ctx: _Pass) -> Tensor:
        """MUDD block 1 on the last residual x: x + ν0·cache0 + ν1·cache7 + ν2·cache9 + ν3·ve0 +
        ν4·cache3 (ve0: table 0's row, ungated), then the final norm."""
        c = self.cfg
        x = ctx.after[c.num_layers - 1]
        if not c.mudd:
            return record_parts.norm(x, c.norm_eps)
        nu = self.mudd(1, x).split(1, dim=-1)
        x = (x + nu[0] * ctx.after[-1] + nu[1] * ctx.after[c.cache7_layer] + nu[2] * ctx.after[c.mudd_layer - 1]
             + nu[3] * self._value_rows(0, ctx) + nu[4] * ctx.after[c.skip_source])
        return record_parts.norm(x, c.norm_eps)

    # ------------------------------------------------------------ head and loss

    def logits(self, h: Tensor) -> Tensor:
        """z = h·lm_head (n, V) in h's dtype, before the softcap: the seam of the FP8 head."""
        if self.training and self.fp8 is not None and self.fp8.head_grad_scale is not None:
            return fp8_head(h, self.lm_head, self.fp8.head_grad_scale, self.fp8.cfg, self.kernels.fp8_product)
        return h @ self.lm_head.to(h.dtype)

    def training_loss(self, inputs: Tensor, targets: Tensor, cu_seqlens: Tensor, windows: tuple[int, int],
                      attn_scale: float, mtp_weights: Sequence[float], prefix_weight: float, prefix: Tensor,
                      freqs: Tensor | None = None, *, rope: tuple[Tensor, Tensor] | None = None,
                      dtype: torch.dtype = torch.bfloat16, longest: int | None = None, sets: int = 1) -> Tensor:
        """The summed MTP + prefix loss of the batch (`record_loss.record_training_loss`); targets
        (n,) are x[t+1]. With `sets` piece sets end to end, the sum of each set's own loss (its MTP
        terms stop at its end)."""
        h = self(inputs, cu_seqlens, windows, attn_scale, freqs, rope=rope, dtype=dtype, longest=longest, sets=sets)
        t = targets.long()
        if sets == 1:
            return self.head_loss(h, t, mtp_weights, prefix_weight, prefix)
        losses = [self.head_loss(hc, tc, mtp_weights, prefix_weight, prefix)
                  for hc, tc in zip(h.chunk(sets), t.chunk(sets))]
        return sum(losses[1:], losses[0])

    def head_loss(self, h: Tensor, targets_next: Tensor, mtp_weights: Sequence[float], prefix_weight: float,
                  prefix: Tensor) -> Tensor:
        """The loss of the final hidden states h: `record_training_loss` of `logits(h)`, by
        `kernels.head_loss` where the FP8 head trains (it passes the gradient to the head's products
        in e5m2, never as bf16 logits' gradient), else by `kernels.loss` on half-precision logits."""
        fp8_head = self.training and self.fp8 is not None and self.fp8.head_grad_scale is not None
        if fp8_head and self.kernels.head_loss is not None and h.dtype in HALF:
            return self.kernels.head_loss(h, self.lm_head, targets_next, mtp_weights, prefix_weight, prefix,
                                          self.fp8.cfg, self.kernels.fp8_product)
        z = self.logits(h)
        loss = self.kernels.loss if self.kernels.loss is not None and z.dtype in HALF else record_training_loss
        return loss(z, targets_next, mtp_weights, prefix_weight, prefix)

    def eval_loss(self, inputs: Tensor, targets: Tensor, cu_seqlens: Tensor, windows: tuple[int, int],
                  attn_scale: float, freqs: Tensor | None = None, *, rope: tuple[Tensor, Tensor] | None = None,
                  dtype: torch.dtype = torch.bfloat16, rows: int = EVAL_ROWS, longest: int | None = None) -> Tensor:
        """Mean next-token CE (`record_loss.record_eval_loss`), the head applied `rows` tokens at a
        time so that a 262,144-token chunk never holds all its logits."""
        h = self(inputs, cu_seqlens, windows, attn_scale, freqs, rope=rope, dtype=dtype, longest=longest)
        t = targets.long()
        total = sum(record_eval_loss(self.logits(h[i : i + rows]), t[i : i + rows]) * h[i : i + rows].shape[0]
                    for i in range(0, h.shape[0], rows))
        return total / h.shape[0]


def _per_set(fn: Callable[[Tensor], Tensor], x: Tensor, sets: int) -> Tensor:
    """fn of each piece set alone: x's rows (sets·m, ...) seen as (sets, m, ...), fn treating the
    leading dim as a batch, the result back in x's shape; fn(x) itself for one set (the same graph
    as before piece sets could be joined)."""
    if sets == 1:
        return fn(x)
    return fn(x.view(sets, -1, *x.shape[1:])).reshape(x.shape)


def count_parameters(model: RecordGPT, padding: bool = True) -> int:
    """Entries over the spec's table: 640,605,607 (W < 8), 643,751,335 (W = 8, pads included);
    without the qk/vo pads and the padding MLP layer, 635,887,015 at any W."""
    total = sum(p.numel() for p in model.parameters())
    if padding:
        return total
    c = model.cfg
    qk_pad, vo_pad = c.bank_pads(model.world_size)
    pad_mlp = c.mlp_bank_layers - c.num_layers
    return total - (qk_pad * model.qk_bank[0].numel() + vo_pad * model.vo_bank[0].numel()
                    + pad_mlp * model.mlp_bank[0].numel())
