"""The speedrun GPT: every technique of the record ladder behind a config field.

With the default `ModelConfig` this is the 2025-08 record's network: value
embeddings in the 012…012 pattern, U-net skips, x0 lambdas, QK RMS-norm,
half-truncated rotary, ReLU² MLP, one layer without attention, a per-head
sigmoid output gate, attention scale 0.12, logit softcap 30·sigmoid(z/7.5),
zero-initialised projections, bfloat16 embeddings, vocabulary padded to
50,304 and an FP8 head in training. Turning fields off walks back down the
ladder (GELU, learned positions, LayerNorm, tied head, ...).

The forward pass takes one packed row of tokens (batch dimension 1): the
attention mask separates documents, so no padding is ever needed. The fast
paths (FlexAttention, FP8) sit behind `attention.AttentionMasks` and
`fp8.head_matmul`/`head.head_loss`, each with a plain-PyTorch reference
beside it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speedrun.model.attention import AttentionMasks, document_ids, narrow_ids
from speedrun.config import AttentionConfig, ModelConfig
from speedrun.kernels import head as head_ops
from speedrun.kernels import attn_inputs
from speedrun.kernels import embeddings
from speedrun.kernels import relu2_mlp
from speedrun.kernels import table as kernel_table


EVAL_CHUNK = 16384


def rms_norm(x: Tensor) -> Tensor:
    return F.rms_norm(x, (x.size(-1),))


class Norm(nn.Module):
    """Parameter-free RMS norm (the record) or learned LayerNorm (llm.c)."""

    def __init__(self, dim: int, kind: str):
        super().__init__()
        self.ln = nn.LayerNorm(dim) if kind == "layer" else None

    def forward(self, x: Tensor) -> Tensor:
        if self.ln is None:
            return rms_norm(x)
        return F.layer_norm(x, (x.size(-1),), self.ln.weight.type_as(x), self.ln.bias.type_as(x))


class Rotary(nn.Module):
    """Rotary position embedding on (B, T, H, D), dimensions paired (i, i + D/2).

    half_truncated: D/4 frequencies (1/1024)^linspace(0, 1, D/4), then D/4
    zeros, so half the dimensions are never rotated. full: the usual
    1/10000^(2i/D). Angles are computed in float32.

    One Rotary serves every layer: `angles(pos)` gives (cos, sin) once per
    forward and each attention layer applies them (`rotate`). The angles come
    from a (positions x D/2) table when `build_table` made one long enough
    (the trainer does, for its sequence lengths), else they are computed from
    the frequencies; the table holds the same float32 values. Computed in the
    graph, cos/sin are cheap element-wise producers that Inductor inlines into
    every consumer, re-evaluated per element and head inside the fused QK-norm
    + rotary kernels; the table turns that into two loads. Measured on an H200
    (docs/performance.md, profiles of proxy212): those kernels went from 48.5 to
    35.5 ms per step; at about 200 us a call they are still ~3x their
    memory-bound time.
    """

    def __init__(self, head_dim: int, kind: str):
        super().__init__()
        if kind == "half_truncated":
            q = head_dim // 4
            freq = (1 / 1024) ** torch.linspace(0, 1, steps=q, dtype=torch.float32)
            freq = torch.cat([freq, freq.new_zeros(q)])
        else:
            freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("freq", freq, persistent=False)
        self.register_buffer("cos_table", torch.empty(0, freq.numel()), persistent=False)
        self.register_buffer("sin_table", torch.empty(0, freq.numel()), persistent=False)

    def compute(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        theta = pos.to(torch.float32)[:, None] * self.freq[None, :]
        return theta.cos(), theta.sin()

    @torch.no_grad()
    def build_table(self, length: int) -> None:
        """Precompute the angles of positions 0 .. length-1 (on the module's device)."""
        if length > self.cos_table.shape[0]:
            self.cos_table, self.sin_table = self.compute(torch.arange(length, device=self.freq.device))

    def angles(self, pos: Tensor, max_pos: int) -> tuple[Tensor, Tensor]:
        """(cos, sin), each (T, D/2) float32, for positions pos (T,), all < max_pos."""
        if max_pos <= self.cos_table.shape[0]:
            return self.cos_table[pos], self.sin_table[pos]
        return self.compute(pos)

    @staticmethod
    def rotate(x: Tensor, angles: tuple[Tensor, Tensor]) -> Tensor:
        cos, sin = angles[0][None, :, None, :], angles[1][None, :, None, :]
        x1, x2 = x.to(torch.float32).chunk(2, dim=-1)
        y1 = x1 * cos + x2 * sin
        y2 = x1 * (-sin) + x2 * cos
        return torch.cat((y1, y2), dim=-1).type_as(x)


def aligned_pairs(v: Tensor) -> Tensor:
    """(2n,) -> (n, 4): pair i in row i's first two columns, so that every pair starts at a 16-byte boundary.

    Inductor marks all outputs of a custom op as unaligned when any input is a view at an offset it
    cannot prove to be a multiple of 16 bytes, and the kernels that read those outputs lose their
    divisibility hints. The attention λ pairs are such inputs of `attn_inputs` (slices of the one
    float32 `scalars` vector, at 8-byte steps): every second layer's FlexAttention forward then ran
    1.5-2 times slower on an H200 (profiled 2026-12-02, ae2e367). The copy is one tiny kernel a
    forward; the values, and the gradients (pad's backward is a slice), are the same."""
    return F.pad(v.view(-1, 2), (0, 2))


def _linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """F.linear in x's dtype."""
    return F.linear(x, w.type_as(x), None if b is None else b.type_as(x))


class Attention(nn.Module):
    """Q, K, V, O in one (4, H·D, dim) tensor; split in `project` and `finish`
    so that a key-value-cached sampler can reuse the same weights. impl: the kernels' choice
    (`kernels.table.impl`)."""

    def __init__(self, cfg: ModelConfig, impl: str = "auto"):
        super().__init__()
        self.cfg, self.impl = cfg, impl
        hdim = cfg.num_heads * cfg.head_dim
        self.qkvo_w = nn.Parameter(torch.empty(4, hdim, cfg.model_dim))
        self.qkv_b = nn.Parameter(torch.zeros(3 * hdim)) if cfg.bias else None
        self.o_b = nn.Parameter(torch.zeros(cfg.model_dim)) if cfg.bias else None
        self.gate_w = nn.Parameter(torch.zeros(cfg.num_heads, cfg.gate_inputs)) if cfg.attn_gate else None
        self.scale = cfg.attn_scale or 1.0 / math.sqrt(cfg.head_dim)

    def project(self, x: Tensor, ve: Tensor | None, lambdas: Tensor, rope) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, dim) -> q, k, v as (B, T, H, D); rope: `Rotary.angles` of the positions, or None."""
        B, T = x.shape[:2]
        H, D = self.cfg.num_heads, self.cfg.head_dim
        qkv = _linear(x, self.qkvo_w[:3].flatten(end_dim=1), self.qkv_b)
        mixed = ve is not None or self.cfg.value_embeds  # v = λ0 v (+ λ1 ve)
        if self.cfg.qk_norm and rope is not None and mixed and attn_inputs.pick_impl(qkv, self.impl) == "triton":
            return attn_inputs.attention_inputs(qkv, ve, lambdas, rope[0], rope[1], H, "triton")  # one launch each way
        q, k, v = qkv.view(B, T, 3 * H, D).chunk(3, dim=-2)
        if self.cfg.qk_norm:
            q, k = rms_norm(q), rms_norm(k)
        if rope is not None:
            q, k = Rotary.rotate(q, rope), Rotary.rotate(k, rope)
        if ve is not None:
            v = lambdas[0] * v + lambdas[1] * ve.view_as(v)
        elif self.cfg.value_embeds:
            v = lambdas[0] * v
        return q, k, v

    def finish(self, y: Tensor, x: Tensor) -> Tensor:
        """Attention output (B, T, H, D) -> gated, projected (B, T, dim)."""
        B, T = y.shape[:2]
        if self.gate_w is not None:
            gate = torch.sigmoid(self.gate_logits(x))
            y = y * gate.view(B, T, self.cfg.num_heads, 1)
        y = y.contiguous().view(B, T, -1)
        return _linear(y, self.qkvo_w[3], self.o_b)

    def gate_logits(self, x: Tensor) -> Tensor:
        """x[..., :gate_inputs] @ gate_wᵀ in x's dtype: one product (written as fused element-wise work
        instead, the step ran 7% slower on an H200: docs/performance.md)."""
        return _linear(x[..., : self.cfg.gate_inputs], self.gate_w)

    def forward(self, x, ve, lambdas, rope, masks: AttentionMasks, long: bool, keep_v: list | None = None) -> Tensor:
        q, k, v = self.project(x, ve, lambdas, rope)
        if keep_v is not None:  # value residual: hand layer 0's V to the later layers
            keep_v.append(v)
        y = masks.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), long, self.scale)
        return self.finish(y.transpose(1, 2), x)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, impl: str = "auto"):
        super().__init__()
        self.fc_w = nn.Parameter(torch.empty(cfg.mlp_hidden, cfg.model_dim))
        self.proj_w = nn.Parameter(torch.empty(cfg.model_dim, cfg.mlp_hidden))
        self.fc_b = nn.Parameter(torch.zeros(cfg.mlp_hidden)) if cfg.bias else None
        self.proj_b = nn.Parameter(torch.zeros(cfg.model_dim)) if cfg.bias else None
        self.activation = cfg.activation
        self.impl = impl

    def forward(self, x: Tensor) -> Tensor:
        if self.activation == "relu2" and self.fc_b is None:  # the fused kernel or its reference
            return relu2_mlp.relu2_mlp(x, self.fc_w.type_as(x), self.proj_w.type_as(x), self.impl)
        h = _linear(x, self.fc_w, self.fc_b)
        h = F.relu(h).square() if self.activation == "relu2" else F.gelu(h, approximate="tanh")
        return _linear(h, self.proj_w, self.proj_b)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, impl: str = "auto"):
        super().__init__()
        self.layer = layer
        self.attn = None if layer in cfg.no_attn_layers else Attention(cfg, impl)
        self.mlp = MLP(cfg, impl)
        self.norm1 = Norm(cfg.model_dim, cfg.norm)
        self.norm2 = Norm(cfg.model_dim, cfg.norm)

    def forward(self, x, x0, ve, block_lambdas, attn_lambdas, rope, masks, long, keep_v=None):
        if block_lambdas is not None:
            x = block_lambdas[0] * x + block_lambdas[1] * x0
        if self.attn is not None:
            x = x + self.attn(self.norm1(x), ve, attn_lambdas, rope, masks, long, keep_v)
        return x + self.mlp(self.norm2(x))


def scalar_layout(num_layers: int) -> dict[str, slice]:
    """Where each learned scalar lives in the one fp32 `scalars` vector."""
    L = num_layers
    return {"skip": slice(0, L), "block": slice(L, 3 * L), "attn": slice(3 * L, 5 * L)}


def init_scalars(num_layers: int, pad_to: int) -> Tensor:
    L = num_layers
    parts = [torch.ones(L), torch.tensor([1.0, 0.0]).repeat(L), torch.tensor([0.5, 0.5]).repeat(L)]
    vec = torch.cat(parts)
    pad = (-vec.numel()) % max(pad_to, 1)
    return torch.cat([vec, torch.ones(pad)])


class GPT(nn.Module):
    """The model; kernels: `train.kernels` ("auto": each function on the kernel `kernels/table.py` names for
    the device, "reference": on the plain PyTorch written here), read once, here."""

    def __init__(self, cfg: ModelConfig, attn_cfg: AttentionConfig, pad_scalars_to: int = 1, kernels: str = "auto"):
        super().__init__()
        self.cfg, self.attn_cfg, self.impl = cfg, attn_cfg, kernel_table.impl(kernels)
        V, d = cfg.padded_vocab, cfg.model_dim
        self.embed = nn.Embedding(V, d)
        self.value_embeds = nn.ModuleList([nn.Embedding(V, d) for _ in range(cfg.value_embeds)])
        self.pos_embed = nn.Embedding(cfg.max_positions, d) if cfg.positions == "learned" else None
        self.rotary = Rotary(cfg.head_dim, cfg.rotary) if cfg.positions == "rotary" else None
        self.blocks = nn.ModuleList([Block(cfg, i, self.impl) for i in range(cfg.num_layers)])
        self.final_norm = Norm(d, cfg.norm)
        self.head_w = None if cfg.tied_head else nn.Parameter(torch.empty(V, d))
        self.scalars = nn.Parameter(init_scalars(cfg.num_layers, pad_scalars_to))
        self.attention_backend = "dense"
        self.use_fp8 = False
        self.reset_parameters()

    # ------------------------------------------------------------ init

    @torch.no_grad()
    def reset_parameters(self) -> None:
        cfg = self.cfg
        embed_std = 1.0 if cfg.zero_init and not cfg.tied_head else 0.02
        for emb in [self.embed, *self.value_embeds]:
            emb.weight.normal_(0.0, embed_std)
        if self.pos_embed is not None:
            self.pos_embed.weight.normal_(0.0, 0.01)
        bound = math.sqrt(3) * 0.5 * cfg.model_dim**-0.5
        out_std = 0.02 / math.sqrt(2 * cfg.num_layers)
        for block in self.blocks:
            if block.attn is not None:
                w = block.attn.qkvo_w
                self._init_in(w[:3], bound)
                self._init_out(w[3], out_std)
            self._init_in(block.mlp.fc_w, bound)
            self._init_out(block.mlp.proj_w, out_std)
        if self.head_w is not None:
            self._init_out(self.head_w, 0.02)
        fresh = init_scalars(cfg.num_layers, 1)
        self.scalars.fill_(1.0)
        self.scalars[: fresh.numel()].copy_(fresh)
        for m in self.modules():
            if isinstance(m, nn.LayerNorm):
                m.reset_parameters()
        for name, p in self.named_parameters():
            if name.endswith("_b"):
                p.zero_()

    def _init_in(self, w: Tensor, bound: float) -> None:
        if self.cfg.zero_init:
            w.uniform_(-bound, bound)
        else:
            w.normal_(0.0, 0.02)

    def _init_out(self, w: Tensor, std: float) -> None:
        if self.cfg.zero_init:
            w.zero_()
        else:
            w.normal_(0.0, std)

    # ------------------------------------------------------------ helpers

    def cast_only_names(self) -> list[str]:
        """The parameters the forward only ever reads cast to the activations' dtype (`type_as(x)`):
        the blocks' matrices and attention gates. A trainer may hand the forward their casts made once
        a step (`grad_accum.StepCasts`) in place of the parameters; nothing else may read them."""
        suffixes = ("attn.qkvo_w", "attn.gate_w", "mlp.fc_w", "mlp.proj_w")
        return [name for name, _ in self.named_parameters() if name.startswith("blocks.") and name.endswith(suffixes)]

    def unused_parameter_names(self) -> list[str]:
        """Trained parameters that no loss reaches under this config: only `scalars`, where no layer reads
        its skip weights, x0 λ or attention λ (the early ladder rungs). `grad_accum.GradBuffers` leaves
        their `.grad` None, as autograd does; tests hold this to autograd for every preset."""
        c = self.cfg
        attn = sum(block.attn is not None for block in self.blocks)
        attn_lambdas = attn > 0 and (c.value_embeds > 0 or (c.value_residual and attn > 1))
        uses = (c.unet and c.num_layers >= 2) or c.x0_lambdas or attn_lambdas
        return [] if uses else ["scalars"]

    def lookup_table_names(self) -> list[str | None]:
        """The embedding tables in the order `hidden` looks them up (the token embedding, then the value
        embeddings), None for a table also read elsewhere (the token embedding as a tied head): a
        trainer adds the named tables' gradients into its buffers row by row (`grad_accum.GradBuffers`,
        `embed_rows`)."""
        values = [f"value_embeds.{i}.weight" for i in range(len(self.value_embeds))]
        return [None if self.head_w is None else "embed.weight", *values]

    @property
    def head_weight(self) -> Tensor:
        return self.embed.weight if self.head_w is None else self.head_w

    def value_embed_for(self, layer: int) -> int | None:
        """Index of the value embedding fed to `layer` (012…012 pattern), or None."""
        n, L = self.cfg.value_embeds, self.cfg.num_layers
        if layer < n:
            return layer
        if layer >= L - n:
            return layer - (L - n)
        return None

    def is_long(self, layer: int) -> bool:
        return layer in self.cfg.long_layers

    def window_pair(self, long_blocks: Tensor) -> tuple[Tensor, Tensor]:
        short = long_blocks // 2 if self.attn_cfg.long_short else long_blocks
        return long_blocks, short

    def masks(self, tokens: Tensor, long_blocks: Tensor) -> AttentionMasks:
        docs = document_ids(tokens) if self.attn_cfg.doc_mask else torch.zeros_like(tokens)
        seg = self.attn_cfg.segment_len
        if seg:
            docs = docs + torch.arange(tokens.numel(), device=tokens.device) // seg * (tokens.numel() + 1)
        if self.attention_backend == "gluon":  # int32 ids where the largest fits: fewer registers in the kernels
            docs = narrow_ids(docs, tokens.numel() * (tokens.numel() // seg + 2 if seg else 1))
        long, short = self.window_pair(long_blocks)
        return AttentionMasks(docs, long, short, self.attn_cfg.block_size, self.attention_backend,
                              order_kernel=self.impl)

    def positions(self, num_tokens: int, device, offset: int = 0) -> Tensor:
        pos = torch.arange(offset, offset + num_tokens, device=device)
        seg = self.attn_cfg.segment_len
        return pos % seg if seg else pos

    def rope(self, pos: Tensor, max_pos: int):
        """Rotary angles for positions pos (all < max_pos), shared by every layer; None without rotary."""
        return None if self.rotary is None else self.rotary.angles(pos, max_pos)

    def embed_tokens(self, tokens: Tensor, pos: Tensor, dtype: torch.dtype, looked_up: Tensor | None = None
                     ) -> Tensor:
        """The first layer's input; looked_up: self.embed(tokens) when the caller has it already."""
        x = (self.embed(tokens) if looked_up is None else looked_up).to(dtype)
        if self.pos_embed is not None:
            x = x + self.pos_embed(pos).to(dtype)
        return rms_norm(x) if self.cfg.norm == "rms" else x

    def softcap(self, logits: Tensor) -> Tensor:
        c = self.cfg.logit_softcap
        logits = logits.float()
        if not c:
            return logits
        if self.cfg.softcap_form == "sigmoid":
            return c * torch.sigmoid(logits / 7.5)
        return c * torch.tanh(logits / c)

    # ------------------------------------------------------------ forward

    def hidden(self, tokens: Tensor, long_blocks: Tensor, dtype: torch.dtype,
               table_sums: list[tuple[Tensor, Tensor] | None] | None = None) -> Tensor:
        """Final hidden states (1, T, dim) for one packed row of tokens (T,); table_sums: as `forward`."""
        pos = self.positions(tokens.numel(), tokens.device)
        masks = self.masks(tokens, long_blocks)
        rope = self.rope(pos, tokens.numel())
        tables = [self.embed.weight, *(emb.weight for emb in self.value_embeds)]
        looked_up = embeddings.lookups(tokens, tables, table_sums, self.impl)
        ve = [v.to(dtype)[None] for v in looked_up[1:]]
        x = x0 = self.embed_tokens(tokens, pos, dtype, looked_up[0])[None]
        lay = scalar_layout(self.cfg.num_layers)
        skips_w, block_l = self.scalars[lay["skip"]], self.scalars[lay["block"]]
        attn_l = aligned_pairs(self.scalars[lay["attn"]])  # attn_l[i, :2]: layer i's λ, 16-byte aligned
        L, n_skip = self.cfg.num_layers, self.cfg.num_layers // 2 if self.cfg.unet else 0
        stack, v_first = [], []
        for i, block in enumerate(self.blocks):
            if i >= L - n_skip:
                x = x + skips_w[i - (L - n_skip)] * stack.pop()
            vi = self.value_embed_for(i)
            bl = block_l[2 * i : 2 * i + 2] if self.cfg.x0_lambdas else None
            vei = ve[vi] if vi is not None else v_first[0] if v_first else None
            keep = v_first if self.cfg.value_residual and not v_first else None
            x = block(x, x0, vei, bl, attn_l[i, :2], rope, masks, self.is_long(i), keep)
            if i < n_skip:
                stack.append(x)
        return self.final_norm(x)

    def logits(self, tokens: Tensor, long_blocks: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """Soft-capped float32 logits (T, padded_vocab), evaluation precision."""
        x = self.hidden(tokens, long_blocks, dtype)[0]
        return self.softcap(_linear(x, self.head_weight))

    def forward(self, tokens: Tensor, targets: Tensor, long_blocks: Tensor, dtype: torch.dtype = torch.float32,
                head_q: tuple[Tensor, Tensor] | None = None,
                table_sums: list[tuple[Tensor, Tensor] | None] | None = None) -> Tensor:
        """Cross-entropy: summed over tokens in training, mean in evaluation; head_q: `head_operands()`
        made for the current weights (the training head then does not quantise its weight); table_sums:
        a (sum, scratch) pair or None per `lookup_table_names` entry, from
        a trainer's `grad_accum.GradBuffers` (those tables' gradients go into the sums, `embed_rows`)."""
        return self.head_loss(self.hidden(tokens, long_blocks, dtype, table_sums)[0], targets, head_q)

    def head_loss(self, x: Tensor, targets: Tensor, head_q: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """The head and the loss on final hidden states (T, dim)."""
        if not self.training:
            return self.eval_loss(x, targets)
        cfg = self.cfg
        return head_ops.head_loss(
            x, self.head_weight, targets, cfg.logit_softcap, cfg.softcap_form, self.impl, self.use_fp8, head_q,
        )

    @torch.no_grad()
    def head_operands(self) -> tuple[Tensor, Tensor] | None:
        """The FP8 head's weight operands for the current head weight (`head.quantize_weight`), or None
        where the head is not FP8. Stale as soon as the weight changes: a trainer makes them once a step
        and passes them to `forward` as head_q."""
        return head_ops.quantize_weight(self.head_weight) if self.use_fp8 else None

    def eval_loss(self, x: Tensor, targets: Tensor, chunk: int = EVAL_CHUNK) -> Tensor:
        """Mean cross-entropy with the head applied in chunks of tokens, so that a
        262,144-token validation row never holds all its float32 logits at once."""
        total = x.new_zeros((), dtype=torch.float32)
        for i in range(0, x.shape[0], chunk):
            logits = self.softcap(_linear(x[i : i + chunk], self.head_weight))
            total = total + F.cross_entropy(logits, targets[i : i + chunk], reduction="sum")
        return total / x.shape[0]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
