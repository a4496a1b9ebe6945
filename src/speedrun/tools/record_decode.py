"""Key-value-cached decoding of one document with the 2026-07 record's model (`RecordGPT`).

Spec: `/work/shared/spec/record-2026-07.md`, sections "Bigram hash input", "Input stage", "Layer map",
"Attention sublayer", "Paired-head attention", "Layer 10", "Output" and "Head and loss" (eval path).
`RecordGPT.forward` takes a whole packed batch; a sampler feeds one token at a time and must give the
same logits as that forward over the document so far. Why it is built this way:

- Almost everything in the record is per token: the coefficient generators, XSA, the output gate,
  the value embeddings, MUDD, the skip and the caches the later layers read (cache0, cache3, cache7,
  cache9) are functions of the token's own residuals, so a new token computes them from its own
  column and nothing is stored for them. What crosses tokens, and so what `RecordDecoder` keeps, is:
  the previous token's un-smeared embedding (smear), the previous token id (bigram hash and sign
  index), the previous token's original key dims 2p … D−1 on the key-offset layers, and per
  attention layer the K (after rotary and key offset) and V (after the value-embedding mix) rows a
  later query can still see: the last `window` rows, and on layer 10 at least the DC's last
  `dc_keys − 1` keys as well. Paired layers cache in their (2n, H/2, D) row layout, where the window
  counts rows. The cache is trimmed after every call, so what it holds is bounded by the windows.
- A call takes any number of new tokens (`extend`): `prefill` is one call on an empty cache, `step`
  one call with one token. The same code path serves both, so prefill and steps cannot drift apart.
- The layer math is written here from the spec's equations on the model's own parameters (the banks
  addressed as the spec lays them out), reusing the model's public seams (`gate`, `mudd`, `mlp`,
  `logits`) and the `record_parts` references (norm, hash, smear, rotary, key offset, paired rows,
  XSA, VE gate). Only attention differs from the forward: m queries against cached keys, masked by
  absolute positions (a key at distance ≤ window, not after the query), since the document is the
  only one there is.
- Rotary angles are computed for the positions in use (position × f in float32, cos/sin rounded to
  bf16), entry for entry what `record_parts.rope_tables` stores, so no table grows with the document.
- Positions: a token's rotary position is its index in the document (plain layers) and 2t + (h mod 2)
  (paired layers), as in a forward over this one document (cu_seqlens [0, n]). The bigram hash and the
  smear do not stop at document starts in training; here the document is all there is, so position 0
  takes the sentinel and position 1 hashes with the sentinel, exactly as the forward does at index 0/1.
- Plain PyTorch, device-agnostic, activations in `dtype` (bf16 as the record; float32 in tests); no
  gradients are taken. The logits are the eval path's: z = h·lm_head in `dtype`, then the float32
  softcap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from speedrun.errors import ConfigError
from speedrun.model import record_parts
from speedrun.model.record import RecordGPT, gate_lanes


@dataclass
class LayerCache:
    """One attention layer's visible past: K and V rows (rows, slots, D), at most `keep` of them."""

    keep: int
    k: Tensor | None = None
    v: Tensor | None = None
    prev_upper: Tensor | None = None  # key-offset layers: the last token's original k[..., 2p:]

    @property
    def rows(self) -> int:
        return 0 if self.k is None else self.k.shape[0]

    def nbytes(self) -> int:
        """Bytes held by the cached tensors' storage (not just their views)."""
        held = (t for t in (self.k, self.v, self.prev_upper) if t is not None)
        return sum(t.untyped_storage().nbytes() for t in held)

    def join(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The cached rows followed by the new ones; then keep only the last `keep` rows, copied so
        that the dropped rows' storage is freed."""
        keys = k if self.k is None else torch.cat((self.k, k))
        values = v if self.v is None else torch.cat((self.v, v))
        drop = max(0, keys.shape[0] - self.keep)
        self.k, self.v = keys[drop:].clone(), values[drop:].clone()
        return keys, values


@dataclass
class _Chunk:
    """The per-token quantities of the tokens one call feeds (n of them, from document index `start`)."""

    tokens: Tensor  # int64 (n,)
    start: int
    x0: Tensor | None = None
    bigram: Tensor | None = None
    gates: list[Tensor] = field(default_factory=list)  # pre-gate, post-gate (n, lanes)
    after: dict[int, Tensor] = field(default_factory=dict)  # residual after layer i; −1: cache0


def rope_rows(freqs: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
    """(cos, sin) bf16, shape positions.shape + (pairs,): the rows of `record_parts.rope_tables` at
    these positions, computed the same way (float32 angle position·f, rounded to bf16 after cos/sin)."""
    theta = positions.to(torch.float32)[..., None] * freqs.float()
    return theta.cos().to(torch.bfloat16), theta.sin().to(torch.bfloat16)


def window_probs(q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, window: int, scale: float) -> Tensor:
    """(slots, nq, nk) float32 softmax of scale·q·k over the keys a query may see: key j at k_pos[j]
    is visible to query i at q_pos[i] iff k_pos[j] ≤ q_pos[i] and q_pos[i] − k_pos[j] ≤ window
    (FA3's window (w, 0) inside one document). q (nq, slots, D), k (nk, slots, D)."""
    gap = q_pos[:, None] - k_pos[None, :]
    visible = (gap >= 0) & (gap <= window)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    return scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)


def dc_term(probs: Tensor, v: Tensor, w1: Tensor, w2: Tensor, eps: float) -> Tensor:
    """Layer 10's DC term (nq, H, D) float32 from the per-head probabilities over its last keys:
    w2_h·Σ_j A(t, j)·v_h(j) with A = Σ_g norm(w1)_g·P_g (norm over the heads, eps, float32)."""
    w1n = record_parts.norm(w1.float(), eps)
    mix = torch.einsum("qh,hqk->qk", w1n, probs)
    return w2.float()[..., None] * torch.einsum("qk,khd->qhd", mix, v.float())


class RecordDecoder:
    """Incremental decoding of ONE document with a `RecordGPT`: `prefill(tokens)` then `step(token)`,
    each returning the soft-capped float32 next-token logits (V,), equal to the rows of the model's
    forward over the document so far. windows (short, long) in tokens and attn_scale as the forward
    takes them; freqs the float32 rotary frequencies (the record's initial ones if None)."""

    def __init__(self, model: RecordGPT, windows: tuple[int, int], attn_scale: float,
                 freqs: Tensor | None = None, dtype: torch.dtype = torch.bfloat16):
        c = model.cfg
        if min(windows) < 0:
            raise ConfigError(f"record decode: windows must be >= 0 tokens, got {windows}")
        self.model, self.cfg, self.dtype, self.lanes = model, c, dtype, gate_lanes(c)
        self.windows, self.attn_scale = (int(windows[0]), int(windows[1])), float(attn_scale)
        f = freqs if freqs is not None else record_parts.rope_freqs(c.rope_pairs, c.rope_base)
        self.freqs = f.to(device=model.embed.device, dtype=torch.float32)
        self.position = 0  # document index of the next token
        self.prev_token: Tensor | None = None  # int64 (1,)
        self.prev_embed: Tensor | None = None  # (1, width) in dtype, un-smeared
        self.layers = {i: LayerCache(self._keep(i)) for i in c.attention_layers}

    def _window(self, i: int) -> int:
        return self.windows[1] if i in self.cfg.long_layers else self.windows[0]

    def _keep(self, i: int) -> int:
        """Rows layer i's later queries can still see: the window, or the DC's keys on layer 10."""
        return max(self._window(i), self.cfg.dc_keys - 1) if i == self.cfg.dc_layer else self._window(i)

    def nbytes(self) -> int:
        """Bytes the decoder holds between calls (the caches, the previous embedding and token)."""
        held = sum(layer.nbytes() for layer in self.layers.values())
        return held + sum(t.untyped_storage().nbytes() for t in (self.prev_token, self.prev_embed) if t is not None)

    # ------------------------------------------------------------ entry points

    def prefill(self, tokens: Tensor) -> Tensor:
        """Feed a document's first tokens (n ≥ 1) to an empty decoder; the last one's logits (V,)."""
        if self.position:
            raise ConfigError("record decode: prefill starts a document; this decoder already holds one")
        return self.extend(tokens)[-1]

    def step(self, token: int | Tensor) -> Tensor:
        """Feed the next token; its logits (V,)."""
        return self.extend(torch.as_tensor(token).reshape(1))[0]

    @torch.no_grad()
    def extend(self, tokens: Tensor) -> Tensor:
        """Feed tokens (n,) at the next document positions; the logits of every one (n, V) float32."""
        t = tokens.reshape(-1).to(device=self.model.embed.device, dtype=torch.int64)
        if t.numel() == 0:
            raise ConfigError("record decode: feed at least one token")
        chunk = _Chunk(t, self.position)
        x = self._input_stage(chunk)
        for i in range(self.cfg.num_layers):
            x = self._layer(i, x, chunk)
        h = self._output(chunk)
        self.position += t.numel()
        return record_parts.softcap(self.model.logits(h))

    # ------------------------------------------------------------ input stage

    def _bigram(self, chunk: _Chunk) -> Tensor:
        """b for the chunk's tokens. The hash at index ≥ 2 reads the token before; index 0 is the
        sentinel row and index 1 hashes with the sentinel. So the chunk is hashed behind min(start, 2)
        copies of the previous token: a chunk token then sits at index ≥ 2 exactly when its document
        position is, and the filler copy's own row (at index 0) is dropped."""
        c, n = self.cfg, chunk.tokens.numel()
        lead = self.prev_token.expand(min(chunk.start, 2)) if self.prev_token is not None else chunk.tokens[:0]
        ctx = torch.cat((lead, chunk.tokens))
        h = record_parts.bigram_hash(ctx, c.bigram_rows)[-n:]
        s = record_parts.bigram_sign_index(ctx, c.sign_rows)[-n:]
        m = self.model
        return record_parts.bigram_vector(m.bigram_embed, m.bigram_signs, h, s).to(self.dtype)

    def _smeared(self, e: Tensor) -> Tensor:
        """Smear over the previous token's un-smeared embedding and the chunk's; the chunk's rows."""
        c, m = self.cfg, self.model
        ctx = e if self.prev_embed is None else torch.cat((self.prev_embed, e))
        out = record_parts.smear(ctx, m.smear_gate, m.scalars[2 * c.num_layers], c.smear_inputs)
        return out[-e.shape[0]:]

    def _input_stage(self, chunk: _Chunk) -> Tensor:
        """e, smear, x0 = norm, the pre-gate from x0, x = x0 + pre19·b (cache0); then remember the
        last token and its un-smeared embedding for the next call."""
        c, m = self.cfg, self.model
        e = m.embed[chunk.tokens].to(self.dtype)
        chunk.x0 = record_parts.norm(self._smeared(e) if c.smear else e, c.norm_eps)
        chunk.bigram = self._bigram(chunk) if c.bigram else torch.zeros_like(chunk.x0)
        chunk.gates.append(m.gate(0, chunk.x0))
        x = chunk.x0 + self._coef(chunk, "bigram", 0) * chunk.bigram
        chunk.after[-1] = x
        self.prev_token, self.prev_embed = chunk.tokens[-1:].clone(), e[-1:].clone()
        return x

    def _coef(self, chunk: _Chunk, kind: str, layer: int) -> Tensor:
        k, lanes = self.lanes[(kind, layer)]
        return chunk.gates[k][:, lanes]

    # ------------------------------------------------------------ layers

    def _lambda(self, table: Tensor, i: int, col: int) -> Tensor:
        """resid/post λ act rounded to bf16 (spec "Parameters")."""
        return table[i, col].to(torch.bfloat16).to(self.dtype)

    def _layer(self, i: int, x: Tensor, chunk: _Chunk) -> Tensor:
        c, m = self.cfg, self.model
        if i == c.post_gate_layer:  # from the residual entering layer 4 (cache3)
            chunk.gates.append(m.gate(1, x))
        if c.mudd and i == c.mudd_layer:
            x = self._mudd_layer(x, chunk)
        else:
            if i == c.no_attn_layer:
                lam = torch.sigmoid(m.scalars[2 * c.num_layers + 1]).to(self.dtype)
                x = x + lam * self._coef(chunk, "skip", i) * chunk.after[c.skip_source] if c.skip else x
            else:
                x = self._attention_residual(i, x, chunk)
            r, p = self._lambda(m.resid_lambdas, i, 1), self._lambda(m.post_lambdas, i, 1)
            x = r * x + p * m.mlp(i, record_parts.norm(x, c.norm_eps))
        chunk.after[i] = x
        return x

    def _attention_input(self, i: int, x: Tensor, chunk: _Chunk) -> Tensor:
        src = chunk.after[self.cfg.cache7_layer] if i in self.cfg.cache7_input_layers else x
        return record_parts.norm(src, self.cfg.norm_eps)

    def _attention_residual(self, i: int, x: Tensor, chunk: _Chunk) -> Tensor:
        """x ← r·x + p·attn + g_x0·x0, then + g_big·b on layers > 0."""
        m = self.model
        a = self._attention_input(i, x, chunk)
        out = self._attention(i, a, self._value_aux(i, a, chunk), chunk)
        r, p = self._lambda(m.resid_lambdas, i, 0), self._lambda(m.post_lambdas, i, 0)
        x = r * x + p * out + (self._coef(chunk, "x0", i) * chunk.x0 if self.cfg.x0_inject else 0)
        return x + self._coef(chunk, "bigram", i) * chunk.bigram if i > 0 else x

    def _value_rows(self, k: int, chunk: _Chunk) -> Tensor:
        return self.model.value_embeds[k * self.cfg.vocab + chunk.tokens].to(self.dtype)

    def _value_aux(self, i: int, a: Tensor, chunk: _Chunk) -> Tensor | None:
        """g_h·ve_h, g = 2σ(G_k·[a[0:6], ve[0:6]]) on the VE layers (not 10), else None."""
        c = self.cfg
        if i not in c.ve_layers:
            return None
        k = c.ve_layers.index(i)
        ve = self._value_rows(k, chunk)
        g = record_parts.value_embed_gate(a, ve, self.model.ve_gate_bank[k], c.ve_gate_inputs)
        return g[..., None] * ve.view(-1, c.num_heads, c.head_dim)

    def _mudd_layer(self, h: Tensor, chunk: _Chunk) -> Tensor:
        """Layer 10 (spec "Layer 10"), μ = mudd_0(cache9)."""
        c, m = self.cfg, self.model
        mu = m.mudd(0, h).split(1, dim=-1)
        c0, c7 = chunk.after[-1], chunk.after[c.cache7_layer]
        x = (1 + mu[5]) * h + mu[3] * c0 + mu[4] * c7
        n, H, D = h.shape[0], c.num_heads, c.head_dim
        g = torch.cat((mu[6].expand(n, H // 2), mu[7].expand(n, H - H // 2)), dim=-1)
        ve = self._value_rows(c.ve_layers.index(c.mudd_layer), chunk).view(n, H, D)
        aux = g[..., None] * ve + (mu[0] * c0 + mu[1] * c7 + mu[2] * h).view(n, H, D)
        out = self._attention(c.mudd_layer, self._attention_input(c.mudd_layer, x, chunk), aux, chunk)
        x = mu[8] * x + mu[9] * out + mu[10] * c0 + mu[11] * chunk.bigram
        return mu[12] * x + mu[13] * m.mlp(c.mudd_layer, record_parts.norm(x, c.norm_eps))

    def _output(self, chunk: _Chunk) -> Tensor:
        """MUDD block 1 on the last residual, then the final norm (spec "Output")."""
        c, a = self.cfg, chunk.after
        x = a[c.num_layers - 1]
        if not c.mudd:
            return record_parts.norm(x, c.norm_eps)
        nu = self.model.mudd(1, x).split(1, dim=-1)
        x = (x + nu[0] * a[-1] + nu[1] * a[c.cache7_layer] + nu[2] * a[c.mudd_layer - 1]
             + nu[3] * self._value_rows(0, chunk) + nu[4] * a[c.skip_source])
        return record_parts.norm(x, c.norm_eps)

    # ------------------------------------------------------------ attention

    def _qkv(self, i: int, a: Tensor, aux_v: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (n, H, D) = a·(λ0·W)ᵀ with W_Q = qk_bank[6j … 6j+2], W_K = qk_bank[6j+3 … 6j+5],
        W_V = vo_bank[2j]; QK-norm per head; v + aux_v."""
        c, m, j = self.cfg, self.model, self.cfg.attention_index(i)
        H, D, half = c.num_heads, c.head_dim, c.num_heads // 2
        w_q = m.qk_bank[H * j : H * j + half].reshape(H * D, c.model_dim)
        w_k = m.qk_bank[H * j + half : H * j + H].reshape(H * D, c.model_dim)
        w = torch.cat((w_q, w_k, m.vo_bank[2 * j])).to(self.dtype) * m.scalars[2 * i].to(self.dtype)
        q, k, v = (a @ w.T).view(-1, 3, H, D).unbind(1)
        q, k = record_parts.norm(q, c.norm_eps), record_parts.norm(k, c.norm_eps)
        return q, k, v if aux_v is None else v + aux_v

    def _rotary(self, i: int, q: Tensor, k: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """Rotary at the document index t (plain) or 2t + (h mod 2) (paired); then the key offset."""
        c, n = self.cfg, q.shape[0]
        t = torch.arange(start, start + n, device=q.device)
        if i in c.paired_layers:
            t = 2 * t[:, None] + torch.arange(c.num_heads, device=q.device) % 2
        cos, sin = rope_rows(self.freqs, t)
        q, k = record_parts.rotate_adjacent(q, cos, sin), record_parts.rotate_adjacent(k, cos, sin)
        return q, self._key_offset(i, k) if i in c.key_offset_layers else k

    def _key_offset(self, i: int, k: Tensor) -> Tensor:
        """Dims 2p … D−1 of each key from the key before (the cached last one for the first);
        the document's key 0 keeps its own. Remembers this chunk's last original dims."""
        cache, lo = self.layers[i], 2 * self.cfg.rope_pairs
        if cache.prev_upper is None:
            out = record_parts.key_offset(k, lo)
        else:
            before = torch.zeros_like(k[:1])
            before[..., lo:] = cache.prev_upper
            out = record_parts.key_offset(torch.cat((before, k)), lo)[1:]
        cache.prev_upper = k[-1:, :, lo:].clone()
        return out

    def _attention(self, i: int, a: Tensor, aux_v: Tensor | None, chunk: _Chunk) -> Tensor:
        """Layer i's attention sublayer for the chunk: projections, rotary, key offset, cached
        windowed attention (+ DC), XSA, output gate, then y·(λ1·W_O)ᵀ."""
        c, m, j = self.cfg, self.model, self.cfg.attention_index(i)
        q, k, v = self._qkv(i, a, aux_v)
        q, k = self._rotary(i, q, k, chunk.start)
        y = self._attend_cached(i, q, k, v, chunk)
        if ("xsa", i) in self.lanes:
            y = record_parts.xsa(y, v, self._coef(chunk, "xsa", i), c.xsa_eps)
        if ("out_gate", i) in self.lanes:
            y = y * self._coef(chunk, "out_gate", i)[..., None]
        w_o = m.vo_bank[2 * j + 1].to(self.dtype) * m.scalars[2 * i + 1].to(self.dtype)
        return y.reshape(-1, c.model_dim) @ w_o.T

    def _attend_cached(self, i: int, q: Tensor, k: Tensor, v: Tensor, chunk: _Chunk) -> Tensor:
        """Attention over the cached and new rows. Paired layers work on (2n, H/2, D) rows at row
        positions 2t, 2t+1; the window counts rows there. Layer 10 adds DC in float32, rounded once."""
        c, paired = self.cfg, i in self.cfg.paired_layers
        if paired:
            q, k, v = (record_parts.pair_heads(z.contiguous()) for z in (q, k, v))
        first = 2 * chunk.start if paired else chunk.start  # row position of the first new row
        cache = self.layers[i]
        held = cache.rows
        keys, values = cache.join(k, v)
        q_pos = torch.arange(first, first + q.shape[0], device=q.device)
        k_pos = torch.arange(first - held, first + q.shape[0], device=q.device)
        probs = window_probs(q, keys, q_pos, k_pos, self._window(i), self.attn_scale)
        y = torch.einsum("hqk,khd->qhd", probs, values.float()).to(q.dtype)
        if i == c.dc_layer and c.dc:
            dc_probs = window_probs(q, keys, q_pos, k_pos, c.dc_keys - 1, self.attn_scale)
            term = dc_term(dc_probs, values, self._coef(chunk, "dc_w1", i), self._coef(chunk, "dc_w2", i), c.dc_eps)
            y = (y.float() + term).to(y.dtype)
        return record_parts.unpair_heads(y) if paired else y
