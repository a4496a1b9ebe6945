"""The speedrun GPT as a `transformers` model (loaded with trust_remote_code=True).

Self-contained on purpose: an exported folder must run where the `speedrun`
package is not installed, so this file re-implements speedrun/model/gpt.py's
forward in plain PyTorch, with the same parameter names (the exported
safetensors file is the native state dict) and the same operations in the
same order (logits match the native model to float32 rounding). Every
`ModelConfig` option the presets use is honoured: RMS or LayerNorm, rotary
(half-truncated or full) or learned positions, value embeddings, U-net skips,
x0 lambdas, the value residual, the attention gate, sigmoid or tanh soft-cap, layers without
attention, biases, a tied head, long and short windows.

The mask is the document-causal block-sliding-window rule of speedrun's
attention.py, stated per token: query t sees key j when j <= t, both are in
the same document (a document starts at each EOT token, 50256) and
block(j) > block(t) - W, W the layer's window in 128-token blocks. It is the
dense reference, fine for inference; there is no key-value cache, so
`generate()` recomputes the whole sequence at each step.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_speedrun import SpeedrunConfig


def rms_norm(x):
    return F.rms_norm(x, (x.size(-1),))


def _linear(x, w, b=None):
    return F.linear(x, w.type_as(x), None if b is None else b.type_as(x))


class Norm(nn.Module):
    def __init__(self, dim, kind):
        super().__init__()
        self.ln = nn.LayerNorm(dim) if kind == "layer" else None

    def forward(self, x):
        if self.ln is None:
            return rms_norm(x)
        return F.layer_norm(x, (x.size(-1),), self.ln.weight.type_as(x), self.ln.bias.type_as(x))


def rotary_freq(head_dim, kind, device):
    if kind == "half_truncated":
        q = head_dim // 4
        freq = (1 / 1024) ** torch.linspace(0, 1, steps=q, dtype=torch.float32, device=device)
        return torch.cat([freq, freq.new_zeros(q)])
    return 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))


def rotate(x, pos, freq):
    """(B, T, H, D), dimensions paired (i, i + D/2), angles in float32."""
    theta = pos.to(torch.float32)[:, None] * freq[None, :]
    cos, sin = theta.cos()[None, :, None, :], theta.sin()[None, :, None, :]
    x1, x2 = x.to(torch.float32).chunk(2, dim=-1)
    return torch.cat((x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos), dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        hdim = c.num_heads * c.head_dim
        self.qkvo_w = nn.Parameter(torch.empty(4, hdim, c.model_dim))
        self.qkv_b = nn.Parameter(torch.zeros(3 * hdim)) if c.bias else None
        self.o_b = nn.Parameter(torch.zeros(c.model_dim)) if c.bias else None
        self.gate_w = nn.Parameter(torch.zeros(c.num_heads, c.gate_inputs)) if c.attn_gate else None
        self.scale = c.attn_scale or 1.0 / math.sqrt(c.head_dim)

    def forward(self, x, ve, lambdas, pos, mask, keep_v=None):
        c, (B, T) = self.c, x.shape[:2]
        H, D = c.num_heads, c.head_dim
        qkv = _linear(x, self.qkvo_w[:3].flatten(end_dim=1), self.qkv_b)
        q, k, v = qkv.view(B, T, 3 * H, D).chunk(3, dim=-2)
        if c.qk_norm:
            q, k = rms_norm(q), rms_norm(k)
        if c.positions == "rotary":
            freq = rotary_freq(D, c.rotary, x.device)
            q, k = rotate(q, pos, freq), rotate(k, pos, freq)
        if ve is not None:
            v = lambdas[0] * v + lambdas[1] * ve.view_as(v)
        elif c.value_embeds:
            v = lambdas[0] * v
        if keep_v is not None:  # value residual: later layers mix in the first layer's V
            keep_v.append(v)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask[:, None], scale=self.scale).transpose(1, 2)
        if self.gate_w is not None:
            gate = torch.sigmoid(_linear(x[..., : c.gate_inputs], self.gate_w))
            y = y * gate.view(B, T, H, 1)
        return _linear(y.contiguous().view(B, T, -1), self.qkvo_w[3], self.o_b)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc_w = nn.Parameter(torch.empty(c.mlp_hidden, c.model_dim))
        self.proj_w = nn.Parameter(torch.empty(c.model_dim, c.mlp_hidden))
        self.fc_b = nn.Parameter(torch.zeros(c.mlp_hidden)) if c.bias else None
        self.proj_b = nn.Parameter(torch.zeros(c.model_dim)) if c.bias else None
        self.activation = c.activation

    def forward(self, x):
        h = _linear(x, self.fc_w, self.fc_b)
        h = F.relu(h).square() if self.activation == "relu2" else F.gelu(h, approximate="tanh")
        return _linear(h, self.proj_w, self.proj_b)


class Block(nn.Module):
    def __init__(self, c, layer):
        super().__init__()
        self.attn = None if layer in c.no_attn_layers else Attention(c)
        self.mlp = MLP(c)
        self.norm1 = Norm(c.model_dim, c.norm)
        self.norm2 = Norm(c.model_dim, c.norm)

    def forward(self, x, x0, ve, block_lambdas, attn_lambdas, pos, mask, keep_v=None):
        if block_lambdas is not None:
            x = block_lambdas[0] * x + block_lambdas[1] * x0
        if self.attn is not None:
            x = x + self.attn(self.norm1(x), ve, attn_lambdas, pos, mask, keep_v)
        return x + self.mlp(self.norm2(x))


def window_mask(tokens, c, window_blocks, attention_mask=None):
    """(B, T, T) bool: document-causal, W-block sliding window (see module docstring)."""
    B, T = tokens.shape
    pos = torch.arange(T, device=tokens.device)
    docs = (tokens == c.eot_token_id).cumsum(-1) if c.doc_mask else torch.zeros_like(tokens)
    if c.segment_len:
        docs = docs + (pos // c.segment_len * (T + 1))[None]
    blocks = pos // c.block_size
    near = blocks[None, :] > blocks[:, None] - max(int(window_blocks), 1)
    mask = (pos[None, :] <= pos[:, None]) & near
    mask = mask[None] & (docs[:, None, :] == docs[:, :, None])
    if attention_mask is not None:  # padding keys; every query keeps itself so no row is empty
        mask = (mask & attention_mask[:, None, :].bool()) | torch.eye(T, dtype=torch.bool, device=tokens.device)
    return mask


class SpeedrunForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = SpeedrunConfig
    base_model_prefix = "speedrun"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]

    def __init__(self, config):
        super().__init__(config)
        c, V, d = config, config.vocab_size, config.model_dim
        self.embed = nn.Embedding(V, d)
        self.value_embeds = nn.ModuleList([nn.Embedding(V, d) for _ in range(c.value_embeds)])
        self.pos_embed = nn.Embedding(c.max_positions, d) if c.positions == "learned" else None
        self.blocks = nn.ModuleList([Block(c, i) for i in range(c.num_layers)])
        self.final_norm = Norm(d, c.norm)
        self.head_w = None if c.tied_head else nn.Parameter(torch.empty(V, d))
        self.scalars = nn.Parameter(torch.ones(c.num_scalars))
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, nn.Embedding):
            module.weight.data.normal_(0.0, 0.02)

    def get_input_embeddings(self):
        return self.embed

    def set_input_embeddings(self, value):
        self.embed = value

    def get_output_embeddings(self):
        return None

    def _positions(self, T, device):
        pos = torch.arange(T, device=device)
        return pos % self.config.segment_len if self.config.segment_len else pos

    def _softcap(self, logits):
        c, logits = self.config.logit_softcap, logits.float()
        if not c:
            return logits
        if self.config.softcap_form == "sigmoid":
            return c * torch.sigmoid(logits / 7.5)
        return c * torch.tanh(logits / c)

    def _value_embed_for(self, layer):
        n, L = self.config.value_embeds, self.config.num_layers
        if layer < n:
            return layer
        if layer >= L - n:
            return layer - (L - n)
        return None

    def hidden(self, input_ids, attention_mask=None):
        c = self.config
        dtype = self.embed.weight.dtype
        T = input_ids.shape[1]
        pos = self._positions(T, input_ids.device)
        long_w = c.long_window_blocks
        short_w = long_w // 2 if c.long_short else long_w
        masks = {w: window_mask(input_ids, c, w, attention_mask) for w in {long_w, short_w}}
        ve = [emb(input_ids).to(dtype) for emb in self.value_embeds]
        x = self.embed(input_ids).to(dtype)
        if self.pos_embed is not None:
            x = x + self.pos_embed(pos).to(dtype)
        x = x0 = rms_norm(x) if c.norm == "rms" else x
        L = c.num_layers
        skips_w, block_l, attn_l = self.scalars[:L], self.scalars[L: 3 * L], self.scalars[3 * L: 5 * L]
        n_skip = L // 2 if c.unet else 0
        stack, v_first = [], []
        for i, block in enumerate(self.blocks):
            if i >= L - n_skip:
                x = x + skips_w[i - (L - n_skip)] * stack.pop()
            vi = self._value_embed_for(i)
            bl = block_l[2 * i: 2 * i + 2] if c.x0_lambdas else None
            mask = masks[long_w if i in c.long_layers else short_w]
            vei = ve[vi] if vi is not None else v_first[0] if v_first else None
            keep = v_first if getattr(c, "value_residual", False) and not v_first else None
            x = block(x, x0, vei, bl, attn_l[2 * i: 2 * i + 2], pos, mask, keep)
            if i < n_skip:
                stack.append(x)
        return self.final_norm(x)

    def forward(self, input_ids=None, attention_mask=None, labels=None, return_dict=None, **kwargs):
        x = self.hidden(input_ids, attention_mask)
        head = self.embed.weight if self.head_w is None else self.head_w
        logits = self._softcap(_linear(x, head))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        """No key-value cache: every step sees the whole sequence."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}
