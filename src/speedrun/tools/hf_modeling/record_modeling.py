"""The 2026-07 record's network (#89) as a `transformers` model, loaded with trust_remote_code=True.

Why it is built this way:

- Self-contained: this file is copied into the exported folder and must run where the `speedrun`
  package is not installed, so it imports only torch and transformers, and it holds both the config
  class and the model (one file for `auto_map` to name).
- The parameters keep the training model's names and shapes (`embed`, `lm_head`, `bigram_embed`,
  `value_embeds`, `qk_bank`, ...; the ±1 sign table is the persistent buffer `bigram_signs`), so
  model.safetensors is the native state dict and nothing is renamed, reshaped or mis-mapped. Only
  the world-size pads of qk_bank/vo_bank are left out by the exporter: an exported folder is the
  same whatever the number of GPUs that trained it.
- Everything the forward needs besides the weights is in the config: the sizes, the layer map
  (which layer is long, paired, XSA, VE, out-gated, key-offset, DC, MUDD, and which lane of which
  coefficient generator feeds which layer), the final validation's windows (short 768, long 2560
  tokens), and the rotary frequencies and attention scale as YaRN left them at the end of the run
  (the final validation applies no further YaRN). The lane table is written out, not re-derived, so
  the export states the layer map that trained the weights.
- One document per row: row b of `input_ids` is one document starting at its position 0, so the
  rotary positions, the smear, the bigram hash (with its sentinel rules) and the key offset all
  start at the row's first token, exactly as the training model treats a batch holding one
  document. There is no document splitting inside a row and no key-value cache.
- The attention is the plain definition: a masked softmax over the whole row, query i seeing keys
  i − w … i (token-exact window (w, 0)), in float32. The paired-head layers reinterpret (T, 6, D) as
  (2T, 3, D) rows and apply the same window to rows, undoubled. DC reuses the same masked softmax
  with a window of 111 (112 keys). Memory is O(T²) per layer: a reference for inference, not a
  fast path.
- Operations and their order follow speedrun's `model/record.py` and `model/record_parts.py`
  (float32 math where those compute in float32, the casts the record makes part of the function:
  resid/post lambdas and the gate scale γ round to bf16, the rotary tables are stored in bf16), so
  the logits equal the training model's float32 forward to float32 rounding. Activations run in the
  weights' dtype: float32 by default (config `dtype`), bf16 when loaded with dtype=torch.bfloat16.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

# (kind, layer, generator 0 = pre-gate | 1 = post-gate, first lane, end lane) at 6 heads, as the
# spec's pre-gate and post-gate tables list them
RECORD_GATE_LANES = (
    ("xsa", 1, 0, 0, 6), ("xsa", 3, 0, 6, 12), ("out_gate", 3, 0, 12, 18),
    ("x0", 0, 0, 18, 19), ("bigram", 0, 0, 19, 20), ("x0", 1, 0, 20, 21), ("bigram", 1, 0, 21, 22),
    ("x0", 2, 0, 22, 23), ("bigram", 2, 0, 23, 24), ("x0", 3, 0, 24, 25), ("bigram", 3, 0, 25, 26),
    ("xsa", 4, 1, 0, 6), ("xsa", 7, 1, 6, 12), ("out_gate", 10, 1, 12, 18),
    ("x0", 4, 1, 18, 19), ("bigram", 4, 1, 19, 20), ("x0", 5, 1, 20, 21), ("bigram", 5, 1, 21, 22),
    ("x0", 7, 1, 22, 23), ("bigram", 7, 1, 23, 24), ("x0", 8, 1, 24, 25), ("bigram", 8, 1, 25, 26),
    ("x0", 9, 1, 26, 27), ("bigram", 9, 1, 27, 28), ("skip", 6, 1, 28, 29),
    ("dc_w1", 10, 1, 29, 35), ("dc_w2", 10, 1, 35, 41),
)


def record_final_rotary(pairs: int = 32, base: float = 1024.0, long_windows: tuple = (384, 896, 1408, 1664),
                        attn_scale: float = 0.1) -> tuple[list[float], float]:
    """The record's rotary frequencies and softmax scale after its YaRN updates (spec "YaRN"): the
    long window goes 384 → 896 → 1408 → 1664; each step rescales f_j by old/new + w_j·(1 − old/new),
    w_j = clamp((old·f_j/2π − 1)/31, 0, 1), and the scale by 1 + 0.2·ln(new/old). Float32 as trained."""
    f = (1.0 / base) ** torch.linspace(0, 1, steps=pairs, dtype=torch.float32)
    for old, new in zip(long_windows, long_windows[1:]):
        ratio = old / new
        w = ((old * f / (2 * math.pi) - 1.0) / 31.0).clamp(0.0, 1.0)
        f = f * (ratio + w * (1.0 - ratio))
        attn_scale = attn_scale * (1.0 + 0.2 * math.log(new / old))
    return [float(v) for v in f], attn_scale


RECORD_DEFAULTS = dict(
    vocab_size=50304, real_vocab_size=50257, model_dim=768, num_heads=6, head_dim=128, num_layers=11,
    mlp_hidden=3072, mlp_bank_layers=12, qk_matrices=60, vo_matrices=20, bigram_rows=377280, sign_rows=8192,
    smear_inputs=12, ve_gate_inputs=6, mudd_dim=64, mudd_rows=14, gate_rows=41, gate_outputs=[26, 41],
    mudd_outputs=[14, 5], mudd_scale=0.1, norm_eps=1.1920928955078125e-07, dc_keys=112, dc_eps=1e-6,
    xsa_eps=1e-8, hash_multipliers=[36313, 27191], softcap=[23.0, 5.0, 7.5],
    no_attn_layer=6, long_layers=[3, 10], paired_layers=[0, 2, 5, 9], key_offset_layers=[3, 10],
    ve_layers=[1, 2, 8, 9, 10], cache7_layer=7, cache7_input_layers=[8, 9, 10], dc_layer=10, mudd_layer=10,
    skip_source=3, post_gate_layer=4, gate_lanes=[list(lane) for lane in RECORD_GATE_LANES],
    short_window=768, long_window=2560, eot_token_id=50256,
)


class RecordConfig(PretrainedConfig):
    """Sizes, layer map, final windows, rotary frequencies and attention scale of the 2026-07 record
    (spec "Model", "Layer map", "YaRN", "Validation and timing"); defaults are the record's."""

    model_type = "speedrun_record"

    def __init__(self, rope_freqs: list | None = None, attn_scale: float | None = None, **kwargs):
        for key, default in RECORD_DEFAULTS.items():
            value = kwargs.pop(key, default)
            setattr(self, key, [list(v) if isinstance(v, tuple) else v for v in value]
                    if isinstance(value, (list, tuple)) else value)
        if rope_freqs is None or attn_scale is None:  # the record's, as its YaRN steps left them
            freqs, scale = record_final_rotary(self.head_dim // 4)
            rope_freqs = freqs if rope_freqs is None else rope_freqs
            attn_scale = scale if attn_scale is None else attn_scale
        self.rope_freqs, self.attn_scale = [float(f) for f in rope_freqs], float(attn_scale)
        # the names generic transformers code (generate, pipelines) looks for
        self.hidden_size, self.num_hidden_layers, self.num_attention_heads = (
            self.model_dim, self.num_layers, self.num_heads)
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
            kwargs.pop(key, None)
        kwargs.setdefault("bos_token_id", self.eot_token_id)
        kwargs.setdefault("eos_token_id", self.eot_token_id)
        kwargs["tie_word_embeddings"] = False  # embed and lm_head are both stored
        super().__init__(**kwargs)


# ---------------------------------------------------------------- plain functions


def norm(z: Tensor, eps: float) -> Tensor:
    """z / sqrt(mean(z²) + eps) over the last axis, in float32, returned in z's dtype."""
    zf = z.float()
    return (zf * torch.rsqrt(zf.square().mean(-1, keepdim=True) + eps)).to(z.dtype)


def _wrap_int32(v: Tensor) -> Tensor:
    """int64 values as int32 two's-complement arithmetic leaves them: the record hashes in int32."""
    return torch.remainder(v + 2**31, 2**32) - 2**31


def bigram_rows(x: Tensor, rows: int, mul_cur: int, mul_prev: int) -> Tensor:
    """Bigram table rows (B, T): h[0] = rows − 1 (the sentinel row); for t ≥ 1
    h[t] = ((mul_cur·x[t]) XOR (mul_prev·p[t])) mod (rows − 1) in int32, p[t] = x[t−1] for t ≥ 2 and
    p[1] = the sentinel (the record hashes in place, so position 0 already holds it)."""
    sentinel, x64 = rows - 1, x.long()
    prev = torch.cat([torch.full_like(x64[:, :2], sentinel), x64[:, 1:-1]], dim=1)
    h = torch.remainder(torch.bitwise_xor(_wrap_int32(mul_cur * x64), _wrap_int32(mul_prev * prev)), sentinel)
    h[:, :1] = sentinel
    return h


def sign_rows(x: Tensor, rows: int) -> Tensor:
    """Sign table rows (B, T): s[0] = 0, s[t] = (x[t−1] XOR x[t]) mod rows."""
    x64 = x.long()
    s = torch.remainder(torch.bitwise_xor(x64[:, :-1], x64[:, 1:]), rows)
    return torch.cat([torch.zeros_like(x64[:, :1]), s], dim=1)


def smear(e: Tensor, gate_w: Tensor, lam: Tensor, inputs: int) -> Tensor:
    """e′[0] = e[0], e′[t] = e[t] + λ·σ(w·e[t][0:inputs])·e[t−1] on (B, T, d), float32 math."""
    ef = e.float()
    gate = torch.sigmoid(ef[:, 1:, :inputs] @ gate_w.float().reshape(-1, 1))
    out = torch.cat([ef[:, :1], ef[:, 1:] + lam.float() * gate * ef[:, :-1]], dim=1)
    return out.to(e.dtype)


def rope_tables(freqs: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """cos, sin (n, pairs) of t·f_j for t < n: fp32 angles, stored in bf16 as the record stores them."""
    theta = torch.arange(n, dtype=torch.float32, device=freqs.device)[:, None] * freqs[None, :]
    return theta.cos().to(torch.bfloat16), theta.sin().to(torch.bfloat16)


def rotate_adjacent(z: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary on z (B, T, H, D), adjacent pairs (2j, 2j+1) for j < pairs: out[2j] = c·z[2j] + s·z[2j+1],
    out[2j+1] = c·z[2j+1] − s·z[2j]; the upper dims are copied. cos/sin (T, pairs) or (T, H, pairs)."""
    c, s = cos.float(), sin.float()
    if c.dim() == 2:
        c, s = c[:, None, :], s[:, None, :]
    p, zf = c.shape[-1], z.float()
    even, odd = zf[..., 0 : 2 * p : 2], zf[..., 1 : 2 * p : 2]
    pairs = torch.stack((c * even + s * odd, c * odd - s * even), dim=-1).flatten(-2)
    return torch.cat((pairs, zf[..., 2 * p :]), dim=-1).to(z.dtype)


def key_offset(k: Tensor, start: int) -> Tensor:
    """Dims start … D−1 of key t become key t−1's for t ≥ 1 (B, T, H, D); key 0 keeps its own."""
    out = k.clone()
    out[:, 1:, :, start:] = k[:, :-1, :, start:]
    return out


def window_probs(q: Tensor, k: Tensor, window: int, scale: float) -> Tensor:
    """(B, H, rows, rows) float32 softmax of scale·q·k, query i seeing keys i − window … i."""
    i = torch.arange(q.shape[1], device=q.device)[:, None]
    j = torch.arange(k.shape[1], device=q.device)[None, :]
    visible = (j <= i) & (i - j <= window)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    return scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)


def attend(q: Tensor, k: Tensor, v: Tensor, window: int, scale: float) -> Tensor:
    """Causal windowed attention over one document per row: (B, rows, H, D) in, q's dtype out."""
    out = torch.einsum("bhqk,bkhd->bqhd", window_probs(q, k, window, scale), v.float())
    return out.to(q.dtype)


def dc_term(q: Tensor, k: Tensor, v: Tensor, w1: Tensor, w2: Tensor, scale: float, keys: int,
            eps: float) -> Tensor:
    """DC (layer 10), float32 (B, T, H, D): w2_h·Σ_j A(t, j)·v_h(j), A = Σ_g norm(w1)_g·P_g over the
    `keys` latest keys; w1, w2 (B, T, H)."""
    probs = window_probs(q, k, keys - 1, scale)
    mix = torch.einsum("bqh,bhqk->bqk", norm(w1.float(), eps), probs)
    return w2.float()[..., None] * torch.einsum("bqk,bkhd->bqhd", mix, v.float())


def xsa(y: Tensor, v: Tensor, alpha: Tensor, eps: float) -> Tensor:
    """y_h ← y_h − tanh(α_h)·(⟨y_h, v_h⟩ / max(‖v_h‖², eps))·v_h, float32 math, y's dtype."""
    yf, vf = y.float(), v.float()
    along = (yf * vf).sum(-1, keepdim=True) / (vf * vf).sum(-1, keepdim=True).clamp_min(eps)
    return (yf - torch.tanh(alpha.float())[..., None] * along * vf).to(y.dtype)


# ---------------------------------------------------------------- the model


class RecordForCausalLM(PreTrainedModel, GenerationMixin):
    """The record's network; `forward(input_ids)` gives soft-capped logits 23·σ((z + 5)/7.5) over
    the padded vocabulary, one document per row."""

    config_class = RecordConfig
    base_model_prefix = "speedrun_record"
    main_input_name = "input_ids"
    _input_embed_layer = "embed"

    def __init__(self, config: RecordConfig):
        super().__init__(config)
        c = config
        V, d, H, D = c.vocab_size, c.model_dim, c.num_heads, c.head_dim
        self.lanes = {(kind, int(layer)): (int(k), slice(int(a), int(b))) for kind, layer, k, a, b in c.gate_lanes}

        def p(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.zeros(shape))

        self.embed, self.lm_head = p(V, d), p(d, V)
        self.bigram_embed = p(c.bigram_rows, d)
        self.value_embeds = p(len(c.ve_layers) * V, d)
        self.ve_gate_bank = p(len(c.ve_layers), H, 2 * c.ve_gate_inputs)
        self.smear_gate = p(1, c.smear_inputs)
        self.qk_bank, self.vo_bank = p(c.qk_matrices, 2 * D, d), p(c.vo_matrices, d, d)
        self.mlp_bank = p(c.mlp_bank_layers, 2, c.mlp_hidden, d)
        self.scalars = p(2 * c.num_layers + 2)
        self.resid_lambdas, self.post_lambdas = p(c.num_layers, 2), p(c.num_layers, 2)
        self.mudd_w1, self.mudd_w2, self.mudd_b2 = p(2, c.mudd_dim, d), p(2, c.mudd_rows, c.mudd_dim), p(2, c.mudd_rows)
        self.mudd_gate_w1 = p(2, c.mudd_dim, d)
        self.mudd_gate_w2, self.mudd_gate_b2 = p(2, c.gate_rows, c.mudd_dim), p(2, c.gate_rows)
        self.mudd_gate_scale = p()
        self.register_buffer("bigram_signs", torch.zeros(c.sign_rows, d))  # the ±1 table, in the weights
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """Weights come from the exported file; a model built from a config alone starts at zero."""

    def get_output_embeddings(self) -> None:
        return None

    # ------------------------------------------------------------ coefficients

    def gate(self, k: int, z: Tensor) -> Tensor:
        """gate_k(z) = (W2·gelu(W1·z) + b2)·γ over the used lanes, γ rounded to bf16."""
        m = self.config.gate_outputs[k]
        hid = F.gelu(z @ self.mudd_gate_w1[k].to(z.dtype).T)
        out = hid @ self.mudd_gate_w2[k, :m].to(z.dtype).T + self.mudd_gate_b2[k, :m].to(z.dtype)
        return out * self.mudd_gate_scale.to(torch.bfloat16).to(z.dtype)

    def mudd(self, k: int, z: Tensor) -> Tensor:
        """mudd_k(z) = (W2·gelu(W1·z) + b2)·0.1 over the used lanes (14 | 5)."""
        m = self.config.mudd_outputs[k]
        hid = F.gelu(z @ self.mudd_w1[k].to(z.dtype).T)
        return (hid @ self.mudd_w2[k, :m].to(z.dtype).T + self.mudd_b2[k, :m].to(z.dtype)) * self.config.mudd_scale

    def _coef(self, run: dict, kind: str, layer: int) -> Tensor:
        k, lanes = self.lanes[(kind, layer)]
        return run["gates"][k][..., lanes]

    def _lambda(self, table: Tensor, i: int, col: int, dtype: torch.dtype) -> Tensor:
        return table[i, col].to(torch.bfloat16).to(dtype)  # fp32 parameters that act rounded to bf16

    def _value_rows(self, k: int, run: dict) -> Tensor:
        return self.value_embeds[k * self.config.vocab_size + run["tokens"]].to(run["dtype"])

    # ------------------------------------------------------------ forward

    def hidden(self, input_ids: Tensor) -> Tensor:
        """The final normed hidden states (B, T, d) of one document per row."""
        c, run = self.config, self._input_stage(input_ids)
        x = run["after"][-1]
        for i in range(c.num_layers):
            if i == c.post_gate_layer:  # from the raw residual entering this layer (cache3)
                run["gates"].append(self.gate(1, x))
            if i == c.mudd_layer:
                x = self._mudd_layer(x, run)
            else:
                x = self._skip(x, run) if i == c.no_attn_layer else self._attention_residual(i, x, run)
                x = self._mlp_residual(i, x, run["dtype"])
            run["after"][i] = x
        return self._output(run)

    def _input_stage(self, input_ids: Tensor) -> dict:
        """Embed, smear, x0 = norm, the pre-gate from x0, the bigram vector; cache0 = x0 + pre19·b."""
        c, t = self.config, input_ids.long()
        dtype, T = self.embed.dtype, t.shape[1]
        e = smear(self.embed[t].to(dtype), self.smear_gate, self.scalars[2 * c.num_layers], c.smear_inputs)
        x0 = norm(e, c.norm_eps)
        h = bigram_rows(t, c.bigram_rows, *c.hash_multipliers)
        b = (self.bigram_embed[h] * self.bigram_signs[sign_rows(t, c.sign_rows)].to(self.bigram_embed.dtype)).to(dtype)
        freqs = torch.tensor(c.rope_freqs, dtype=torch.float32, device=t.device)
        run = dict(tokens=t, dtype=dtype, x0=x0, bigram=b, rope=rope_tables(freqs, 2 * T), gates=[], after={})
        run["gates"].append(self.gate(0, x0))
        run["after"][-1] = x0 + self._coef(run, "bigram", 0) * b
        return run

    def _skip(self, x: Tensor, run: dict) -> Tensor:
        c = self.config
        lam = torch.sigmoid(self.scalars[2 * c.num_layers + 1]).to(run["dtype"])
        return x + lam * self._coef(run, "skip", c.no_attn_layer) * run["after"][c.skip_source]

    def _attention_input(self, i: int, x: Tensor, run: dict) -> Tensor:
        src = run["after"][self.config.cache7_layer] if i in self.config.cache7_input_layers else x
        return norm(src, self.config.norm_eps)

    def _attention_residual(self, i: int, x: Tensor, run: dict) -> Tensor:
        """x ← r·x + p·attn + g_x0·x0, then x ← x + g_big·b (layer 0's bigram came before it)."""
        a, dtype = self._attention_input(i, x, run), run["dtype"]
        out = self.attention(i, a, self._value_aux(i, a, run), run)
        r, p = self._lambda(self.resid_lambdas, i, 0, dtype), self._lambda(self.post_lambdas, i, 0, dtype)
        x = r * x + p * out + self._coef(run, "x0", i) * run["x0"]
        return x + self._coef(run, "bigram", i) * run["bigram"] if i > 0 else x

    def _mlp_residual(self, i: int, x: Tensor, dtype: torch.dtype) -> Tensor:
        r, p = self._lambda(self.resid_lambdas, i, 1, dtype), self._lambda(self.post_lambdas, i, 1, dtype)
        return r * x + p * self.mlp(i, norm(x, self.config.norm_eps))

    def mlp(self, layer: int, a: Tensor) -> Tensor:
        w1, w2 = self.mlp_bank[layer, 0].to(a.dtype), self.mlp_bank[layer, 1].to(a.dtype)
        return F.relu(a @ w1.T).square() @ w2

    def _value_aux(self, i: int, a: Tensor, run: dict) -> Tensor | None:
        """g_h·ve_h with g = 2σ(G_k·[a[0:6], ve[0:6]]) on the VE layers (B, T, H, D), else None."""
        c = self.config
        if i not in c.ve_layers:
            return None
        k = c.ve_layers.index(i)
        ve, n = self._value_rows(k, run), c.ve_gate_inputs
        u = torch.cat((a[..., :n], ve[..., :n]), dim=-1).float()
        g = (2 * torch.sigmoid(u @ self.ve_gate_bank[k].float().T)).to(a.dtype)
        return g[..., None] * ve.view(*ve.shape[:2], c.num_heads, c.head_dim)

    def attention(self, i: int, a: Tensor, aux_v: Tensor | None, run: dict) -> Tensor:
        """Projections, QK-norm, + aux_v, rotary, key offset, attention, DC, XSA, out gate, W_O."""
        c = self.config
        j, (B, T) = self._attn_index(i), a.shape[:2]
        H, D, half = c.num_heads, c.head_dim, c.num_heads // 2
        w_q = self.qk_bank[H * j : H * j + half].reshape(H * D, c.model_dim)
        w_k = self.qk_bank[H * j + half : H * j + H].reshape(H * D, c.model_dim)
        w = torch.cat((w_q, w_k, self.vo_bank[2 * j])).to(a.dtype) * self.scalars[2 * i].to(a.dtype)
        q, k, v = (a @ w.T).view(B, T, 3, H, D).unbind(2)
        q, k = norm(q, c.norm_eps), norm(k, c.norm_eps)
        v = v if aux_v is None else v + aux_v
        q, k = self._rotary(i, q, k, run)
        y = self._attend_layer(i, q, k, v, run)
        y = self._after_attention(i, y, q, k, v, run)
        w_o = self.vo_bank[2 * j + 1].to(a.dtype) * self.scalars[2 * i + 1].to(a.dtype)
        return y.reshape(B, T, c.model_dim) @ w_o.T

    def _attn_index(self, layer: int) -> int:
        """j = i below the attention-less layer, i − 1 above it."""
        return layer - (layer > self.config.no_attn_layer)

    def _rotary(self, i: int, q: Tensor, k: Tensor, run: dict) -> tuple[Tensor, Tensor]:
        """Rotary at the token's position, or at 2t + (h mod 2) per head on the paired layers; then
        the key offset of the unrotated dims on the key-offset layers."""
        c, T = self.config, q.shape[1]
        cos, sin = run["rope"]
        if i in c.paired_layers:
            pos = 2 * torch.arange(T, device=q.device)[:, None] + torch.arange(c.num_heads, device=q.device) % 2
            cos, sin = cos[pos], sin[pos]
        else:
            cos, sin = cos[:T], sin[:T]
        q, k = rotate_adjacent(q, cos, sin), rotate_adjacent(k, cos, sin)
        if i in c.key_offset_layers:
            k = key_offset(k, 2 * (c.head_dim // 4))
        return q, k

    def _attend_layer(self, i: int, q: Tensor, k: Tensor, v: Tensor, run: dict) -> Tensor:
        """Plain layers attend over tokens; paired layers over (2T, H/2) rows, head h of token t in
        row 2t + ⌊h/(H/2)⌋, slot h mod (H/2), with the window counting rows."""
        c = self.config
        window = c.long_window if i in c.long_layers else c.short_window
        if i not in c.paired_layers:
            return attend(q, k, v, window, c.attn_scale)
        B, T, H, D = q.shape
        pq, pk, pv = (z.contiguous().reshape(B, 2 * T, H // 2, D) for z in (q, k, v))
        return attend(pq, pk, pv, window, c.attn_scale).reshape(B, T, H, D)

    def _after_attention(self, i: int, y: Tensor, q: Tensor, k: Tensor, v: Tensor, run: dict) -> Tensor:
        """DC (added in float32, rounded once), XSA against the token's own v, the raw output gate."""
        c = self.config
        if i == c.dc_layer:
            term = dc_term(q, k, v, self._coef(run, "dc_w1", i), self._coef(run, "dc_w2", i), c.attn_scale,
                           c.dc_keys, c.dc_eps)
            y = (y.float() + term).to(y.dtype)
        if ("xsa", i) in self.lanes:
            y = xsa(y, v, self._coef(run, "xsa", i), c.xsa_eps)
        if ("out_gate", i) in self.lanes:
            y = y * self._coef(run, "out_gate", i)[..., None]
        return y

    def _mudd_layer(self, h: Tensor, run: dict) -> Tensor:
        """Layer 10 with MUDD block 0: μ from h = cache9, the residual entering it."""
        c, i = self.config, self.config.mudd_layer
        mu = self.mudd(0, h).split(1, dim=-1)
        c0, c7 = run["after"][-1], run["after"][c.cache7_layer]
        x = (1 + mu[5]) * h + mu[3] * c0 + mu[4] * c7
        a = self._attention_input(i, x, run)
        out = self.attention(i, a, self._mudd_value_aux(mu, h, run), run)
        x = mu[8] * x + mu[9] * out + mu[10] * c0 + mu[11] * run["bigram"]
        return mu[12] * x + mu[13] * self.mlp(i, norm(x, c.norm_eps))

    def _mudd_value_aux(self, mu: tuple, h: Tensor, run: dict) -> Tensor:
        """[μ6 × H/2, μ7 × H/2]_h·ve4_h + v_mudd_h, v_mudd = μ0·cache0 + μ1·cache7 + μ2·h."""
        c = self.config
        B, T = h.shape[:2]
        H, D = c.num_heads, c.head_dim
        v_mudd = mu[0] * run["after"][-1] + mu[1] * run["after"][c.cache7_layer] + mu[2] * h
        g = torch.cat((mu[6].expand(B, T, H // 2), mu[7].expand(B, T, H - H // 2)), dim=-1)
        ve = self._value_rows(c.ve_layers.index(c.mudd_layer), run)
        return g[..., None] * ve.view(B, T, H, D) + v_mudd.view(B, T, H, D)

    def _output(self, run: dict) -> Tensor:
        """MUDD block 1: x + ν0·cache0 + ν1·cache7 + ν2·cache9 + ν3·ve0 + ν4·cache3, then norm."""
        c, after = self.config, run["after"]
        x = after[c.num_layers - 1]
        nu = self.mudd(1, x).split(1, dim=-1)
        x = (x + nu[0] * after[-1] + nu[1] * after[c.cache7_layer] + nu[2] * after[c.mudd_layer - 1]
             + nu[3] * self._value_rows(0, run) + nu[4] * after[c.skip_source])
        return norm(x, c.norm_eps)

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                labels: Tensor | None = None, **kwargs) -> CausalLMOutputWithPast:
        """Soft-capped logits (B, T, vocab) in float32; with labels, the mean next-token CE."""
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError("one document per row: padding (attention_mask zeros) is not supported")
        h = self.hidden(input_ids)
        cap, shift, divisor = self.config.softcap
        logits = cap * torch.sigmoid(((h @ self.lm_head.to(h.dtype)).float() + shift) / divisor)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                                      **kwargs) -> dict:
        """No key-value cache: every step sees the whole row."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}
