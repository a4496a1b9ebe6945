"""The 2026-07 record's forward, written a second time from the specification alone, as a test oracle.

`/work/shared/spec/record-2026-07.md` (sections "Bigram hash input", "Model", "YaRN", "Head and
loss") is the only source: this module was written without reading the model's code, so that the
model and this reference are two independent readings of the spec and a disagreement points at a
misreading on one side. That is why it is built for obviousness rather than speed:

- it runs in float64 on a plain dict of tensors named as the spec's parameter table, so no dtype
  rounding hides or fakes an agreement (the spec's bf16 casts of parameters, such as the lambdas and
  γ, are identities on the bf16-representable values the tests draw);
- attention is a loop over query tokens (over rows of the reshaped sequence for the paired layers,
  exactly as the spec describes the script), with each query's visible keys listed explicitly, so
  document starts, windows, the paired-head row order, the key offset and DC's 112-key span are
  each one readable line;
- the layer map is one table (`record_layer_plans`) in the spec's own column order.

Sizes come from the tensors themselves (width, head_dim, vocabulary, bigram rows, sign rows,
generator width), so a tiny configuration with the spec's fixed structure (11 layers, 6 heads, the
layer map) runs on a CPU in a second.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Constants:
    """The forward's fixed numbers (spec: "Bigram hash input", "Model", "YaRN", "Head and loss")."""

    n_layers: int = 11
    n_heads: int = 6
    hash_mul_token: int = 36313
    hash_mul_prev: int = 27191
    norm_eps: float = 1.1920928955078125e-07  # fp32 machine epsilon
    smear_width: int = 12
    ve_gate_width: int = 6
    mudd_scale: float = 0.1
    pre_gate_count: int = 26
    post_gate_count: int = 41
    mudd0_count: int = 14
    mudd1_count: int = 5
    xsa_eps: float = 1e-8
    dc_span: int = 112
    dc_norm_eps: float = 1e-6
    softcap: float = 23.0
    softcap_shift: float = 5.0
    softcap_div: float = 7.5
    rope_base: float = 1024.0
    yarn_ramp: float = 31.0
    yarn_scale_slope: float = 0.2


@dataclass(frozen=True)
class Gate:
    """A per-token generated coefficient: `source` is "pre" (gate_0) or "post" (gate_1)."""

    source: str
    index: int


@dataclass(frozen=True)
class LayerPlan:
    """One row of the spec's layer map; layers 6 and 10 are special-cased by the forward."""

    attention: bool
    reads_cache7: bool = False
    long_window: bool = False
    paired: bool = False
    key_offset: bool = False
    dc: bool = False
    ve_bank: int | None = None
    xsa: Gate | None = None
    out_gate: Gate | None = None
    x0_gate: Gate | None = None
    bigram_gate: Gate | None = None


def record_layer_plans() -> tuple[LayerPlan, ...]:
    """The spec's "Layer map" table, row by row (layer 0's bigram gate pre19 acts before layer 0)."""
    pre, post = (lambda k: Gate("pre", k)), (lambda k: Gate("post", k))
    return (
        LayerPlan(True, paired=True, x0_gate=pre(18)),
        LayerPlan(True, ve_bank=0, xsa=pre(0), x0_gate=pre(20), bigram_gate=pre(21)),
        LayerPlan(True, paired=True, ve_bank=1, x0_gate=pre(22), bigram_gate=pre(23)),
        LayerPlan(True, long_window=True, key_offset=True, xsa=pre(6), out_gate=pre(12),
                  x0_gate=pre(24), bigram_gate=pre(25)),
        LayerPlan(True, xsa=post(0), x0_gate=post(18), bigram_gate=post(19)),
        LayerPlan(True, paired=True, x0_gate=post(20), bigram_gate=post(21)),
        LayerPlan(False),
        LayerPlan(True, xsa=post(6), x0_gate=post(22), bigram_gate=post(23)),
        LayerPlan(True, reads_cache7=True, ve_bank=2, x0_gate=post(24), bigram_gate=post(25)),
        LayerPlan(True, reads_cache7=True, paired=True, ve_bank=3, x0_gate=post(26),
                  bigram_gate=post(27)),
        LayerPlan(True, reads_cache7=True, long_window=True, key_offset=True, dc=True, ve_bank=4,
                  out_gate=post(12)),
    )


def attention_index(layer: int) -> int:
    """Bank slot of a layer's attention: j = i below layer 6, i − 1 above (6 has none)."""
    return layer if layer < 6 else layer - 1


# ---------------------------------------------------------------- small operations


def rms_norm(z: Tensor, eps: float) -> Tensor:
    """norm(z) = z / √(mean(z²) + ε) over the last axis, no weight."""
    return z / torch.sqrt((z * z).mean(dim=-1, keepdim=True) + eps)


def wrap_int32(value: int) -> int:
    """Two's-complement int32 wrap of a Python integer, as the script's int32 products wrap."""
    return (value + 2**31) % 2**32 - 2**31


def bigram_indices(tokens: Tensor, table_rows: int, sign_rows: int,
                   const: Constants = Constants()) -> tuple[list[int], list[int]]:
    """Hash row h[t] and sign row s[t] per token of one local batch (spec: "Bigram hash input").

    The sentinel V_b − 1 is both h[0] and the "previous token" of position 1, and nothing resets
    at a document start: a BOS hashes with the last token of the document before it.
    """
    x = [int(v) for v in tokens.tolist()]
    sentinel = table_rows - 1
    h, s = [sentinel], [0]
    for t in range(1, len(x)):
        prev = sentinel if t == 1 else x[t - 1]
        mixed = wrap_int32(const.hash_mul_token * x[t]) ^ wrap_int32(const.hash_mul_prev * prev)
        h.append(mixed % sentinel)
        s.append((x[t - 1] ^ x[t]) % sign_rows)
    return h, s


def smear(e: Tensor, lam: Tensor, w: Tensor, width: int) -> Tensor:
    """e′[t] = e[t] + λ·σ(w·e[t][0:12])·e[t−1] for t ≥ 1, with the un-smeared neighbour."""
    out = e.clone()
    for t in range(1, e.shape[0]):
        out[t] = e[t] + lam * torch.sigmoid(torch.dot(w, e[t, :width])) * e[t - 1]
    return out


def generator(z: Tensor, w1: Tensor, w2: Tensor, b2: Tensor, count: int, scale: Tensor | float
              ) -> Tensor:
    """(W2[0:m]·gelu(W1·z) + b2[0:m])·scale per token: the gates and MUDD coefficients, no sigmoid."""
    hidden = torch.nn.functional.gelu(z @ w1.T, approximate="none")
    return (hidden @ w2[:count].T + b2[:count]) * scale


def rope(z: Tensor, positions: Tensor, freqs: Tensor) -> Tensor:
    """Rotate dims (2j, 2j+1) of each vector z[..., :] by θ = position·f_j; dims ≥ 2·len(f) stay.

    out[2j] = cos θ·z[2j] + sin θ·z[2j+1] and out[2j+1] = cos θ·z[2j+1] − sin θ·z[2j];
    `positions` has z's shape without the last axis.
    """
    m = freqs.shape[0]
    theta = positions.unsqueeze(-1) * freqs
    c, s = torch.cos(theta), torch.sin(theta)
    even, odd = z[..., 0:2 * m:2], z[..., 1:2 * m:2]
    out = z.clone()
    out[..., 0:2 * m:2] = c * even + s * odd
    out[..., 1:2 * m:2] = c * odd - s * even
    return out


def document_starts(cu_seqlens: Tensor, n: int) -> list[int]:
    """Start of each token's document; trailing repeats of n in cu_seqlens are empty documents."""
    bounds = sorted(set(int(c) for c in cu_seqlens.tolist()))
    return [max(c for c in bounds if c <= t) for t in range(n)]


def softmax_attend(q: Tensor, keys: Tensor, values: Tensor, scale: float) -> Tensor:
    """One query against its explicit list of visible keys: Σ_j softmax(scale·q·k_j)·v_j."""
    p = torch.softmax(scale * (keys @ q), dim=0)
    return p @ values


# ---------------------------------------------------------------- attention variants


def plain_attention(q: Tensor, k: Tensor, v: Tensor, starts: list[int], window: int,
                    scale: float) -> Tensor:
    """Causal, within the query's document, window (w, 0): query t sees keys max(start, t−w) … t."""
    n, heads, _ = q.shape
    y = torch.zeros_like(v)
    for t in range(n):
        lo = max(starts[t], t - window)
        for h in range(heads):
            y[t, h] = softmax_attend(q[t, h], k[lo:t + 1, h], v[lo:t + 1, h], scale)
    return y


def paired_attention(q: Tensor, k: Tensor, v: Tensor, starts: list[int], window: int,
                     scale: float) -> Tensor:
    """The paired layers as the script computes them: (n, 6, d) read as (2n, 3, d) row-major.

    Head h of token t is row 2t + ⌊h/3⌋, slot h mod 3; a document of L tokens is 2L rows; the window
    counts rows (it is not doubled). q and k are already rotated per head at 2t + (h mod 2).
    """
    n, heads, d = q.shape
    slots = heads // 2
    q2, k2, v2 = (z.reshape(2 * n, slots, d) for z in (q, k, v))
    y2 = torch.zeros_like(v2)
    for r in range(2 * n):
        lo = max(2 * starts[r // 2], r - window)
        for s in range(slots):
            y2[r, s] = softmax_attend(q2[r, s], k2[lo:r + 1, s], v2[lo:r + 1, s], scale)
    return y2.reshape(n, heads, d)


def key_offset(k: Tensor) -> Tensor:
    """Dims d/2 … d−1 of key t become the original ones of key t−1, across document starts.

    Key 0 keeps its own.
    """
    half = k.shape[-1] // 2
    out = k.clone()
    out[1:, :, half:] = k[:-1, :, half:]
    return out


def dc_term(q: Tensor, k: Tensor, v: Tensor, starts: list[int], w1: Tensor, w2: Tensor,
            scale: float, span: int) -> Tensor:
    """DC: w2_h(t)·Σ_j A(t,j)·v_h(j) with A(t,j) = Σ_g w1_g(t)·P_g(t,j).

    P_g is head g's softmax over only the last `span` keys of t's document, whatever the window.
    """
    n, heads, _ = q.shape
    extra = torch.zeros_like(v)
    for t in range(n):
        lo = max(starts[t], t - span + 1)
        mix = sum(w1[t, g] * torch.softmax(scale * (k[lo:t + 1, g] @ q[t, g]), dim=0)
                  for g in range(heads))
        for h in range(heads):
            extra[t, h] = w2[t, h] * (mix @ v[lo:t + 1, h])
    return extra


def xsa(y: Tensor, v: Tensor, alpha: Tensor, eps: float) -> Tensor:
    """y_h ← y_h − tanh(α_h)·(⟨y_h, v_h⟩ / max(‖v_h‖², ε))·v_h, v_h the token's own value."""
    dot = (y * v).sum(-1, keepdim=True)
    sq = (v * v).sum(-1, keepdim=True).clamp_min(eps)
    return y - torch.tanh(alpha).unsqueeze(-1) * dot / sq * v


def mlp(a: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """relu(a·W1ᵀ)²·W2, both banks stored (3072, 768)."""
    return torch.relu(a @ w1.T).square() @ w2


# ---------------------------------------------------------------- the forward


@dataclass(frozen=True)
class Batch:
    """Everything the forward reads besides the parameters, in float64 / Python ints."""

    tokens: Tensor
    starts: list[int]
    bigram: Tensor
    windows: tuple[int, int]
    attn_scale: float
    freqs: Tensor


def gate_values(plan_gate: Gate | None, pre: Tensor, post: Tensor | None, width: int = 1
                ) -> Tensor | None:
    """The (n, width) block of generated gates starting at plan_gate."""
    if plan_gate is None:
        return None
    src = pre if plan_gate.source == "pre" else post
    assert src is not None, "a post-gate is read before layer 4"
    return src[:, plan_gate.index:plan_gate.index + width]


def qkv(p: Mapping[str, Tensor], layer: int, a: Tensor, heads: int
        ) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v = a·(λ0·W)ᵀ with W_Q, W_K stacked from qk_bank[6j … 6j+5], W_V = vo_bank[2j]."""
    j, lam0 = attention_index(layer), p["scalars"][2 * layer]
    wq = torch.cat([p["qk_bank"][6 * j + r] for r in range(3)])
    wk = torch.cat([p["qk_bank"][6 * j + 3 + r] for r in range(3)])
    wv = p["vo_bank"][2 * j]
    n = a.shape[0]
    return tuple((a @ (lam0 * w).T).reshape(n, heads, -1) for w in (wq, wk, wv))


def value_embedding(p: Mapping[str, Tensor], bank: int, tokens: Tensor) -> Tensor:
    """Row x of table `bank` of value_embeds (5 tables of V rows stacked)."""
    vocab = p["value_embeds"].shape[0] // 5
    return p["value_embeds"][bank * vocab + tokens]


def ve_aux(p: Mapping[str, Tensor], bank: int, a: Tensor, tokens: Tensor, heads: int,
           width: int) -> Tensor:
    """aux_v_h = 2σ(G_k·[a[0:6], ve[0:6]])_h · ve_h for the gated value-embedding layers."""
    ve = value_embedding(p, bank, tokens)
    gate = 2 * torch.sigmoid(torch.cat([a[:, :width], ve[:, :width]], dim=1) @ p["ve_gate_bank"][bank].T)
    return gate.unsqueeze(-1) * ve.reshape(ve.shape[0], heads, -1)


@dataclass(frozen=True)
class AttentionExtras:
    """Per-layer inputs of the attention sublayer that the layer map or MUDD supplies."""

    aux_v: Tensor | None = None
    xsa_alpha: Tensor | None = None
    out_gate: Tensor | None = None
    dc_w1: Tensor | None = None
    dc_w2: Tensor | None = None


def attention_sublayer(p: Mapping[str, Tensor], layer: int, plan: LayerPlan, a: Tensor,
                       batch: Batch, extras: AttentionExtras, const: Constants) -> Tensor:
    """Projections, QK-norm, aux_v, RoPE, (key offset), attention → DC → XSA → out gate → W_O."""
    heads, n = const.n_heads, a.shape[0]
    q, k, v = qkv(p, layer, a, heads)
    q, k = rms_norm(q, const.norm_eps), rms_norm(k, const.norm_eps)
    if extras.aux_v is not None:
        v = v + extras.aux_v
    window = batch.windows[1] if plan.long_window else batch.windows[0]
    t = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    h = torch.arange(heads, dtype=torch.float64).unsqueeze(0)
    positions = 2 * t + h % 2 if plan.paired else t.expand(n, heads)
    q, k = rope(q, positions, batch.freqs), rope(k, positions, batch.freqs)
    if plan.key_offset:
        k = key_offset(k)
    attend = paired_attention if plan.paired else plain_attention
    y = attend(q, k, v, batch.starts, window, batch.attn_scale)
    if plan.dc:
        y = y + dc_term(q, k, v, batch.starts, extras.dc_w1, extras.dc_w2, batch.attn_scale,
                        const.dc_span)
    if extras.xsa_alpha is not None:
        y = xsa(y, v, extras.xsa_alpha, const.xsa_eps)
    if extras.out_gate is not None:
        y = extras.out_gate.unsqueeze(-1) * y
    wo = p["scalars"][2 * layer + 1] * p["vo_bank"][2 * attention_index(layer) + 1]
    return y.reshape(n, -1) @ wo.T


def mlp_of(p: Mapping[str, Tensor], layer: int, x: Tensor, const: Constants) -> Tensor:
    """MLP(norm(x)) with W1 = mlp_bank[i, 0], W2 = mlp_bank[i, 1]."""
    return mlp(rms_norm(x, const.norm_eps), p["mlp_bank"][layer, 0], p["mlp_bank"][layer, 1])


def input_stage(p: Mapping[str, Tensor], batch: Batch, const: Constants
                ) -> tuple[Tensor, Tensor, Tensor]:
    """x0 = norm(smear(embed[x])), the pre-gates read from x0, and cache0 = x0 + pre19·b."""
    e = p["embed"][batch.tokens]
    x0 = rms_norm(smear(e, p["scalars"][22], p["smear_gate"][0], const.smear_width), const.norm_eps)
    pre = pre_gates(p, x0, const)
    return x0, pre, x0 + pre[:, 19:20] * batch.bigram


def pre_gates(p: Mapping[str, Tensor], x0: Tensor, const: Constants) -> Tensor:
    """gate_0(x0): 26 values per token, times γ."""
    return generator(x0, p["mudd_gate_w1"][0], p["mudd_gate_w2"][0], p["mudd_gate_b2"][0],
                     const.pre_gate_count, p["mudd_gate_scale"])


def post_gates(p: Mapping[str, Tensor], cache3: Tensor, const: Constants) -> Tensor:
    """gate_1(cache3): 41 values per token, times γ."""
    return generator(cache3, p["mudd_gate_w1"][1], p["mudd_gate_w2"][1], p["mudd_gate_b2"][1],
                     const.post_gate_count, p["mudd_gate_scale"])


def mudd(p: Mapping[str, Tensor], block: int, z: Tensor, count: int, const: Constants) -> Tensor:
    """mudd_k(z): the MUDD coefficients, times the constant 0.1."""
    return generator(z, p["mudd_w1"][block], p["mudd_w2"][block], p["mudd_b2"][block], count,
                     const.mudd_scale)


def regular_layer(p: Mapping[str, Tensor], layer: int, plan: LayerPlan, x: Tensor,
                  state: dict[str, Tensor], batch: Batch, const: Constants) -> Tensor:
    """Layers other than 6 and 10: gated attention residual, bigram injection, then the MLP."""
    pre, post = state["pre"], state.get("post")
    a = rms_norm(state["cache7"] if plan.reads_cache7 else x, const.norm_eps)
    aux = None if plan.ve_bank is None else ve_aux(p, plan.ve_bank, a, batch.tokens,
                                                    const.n_heads, const.ve_gate_width)
    extras = AttentionExtras(aux_v=aux,
                             xsa_alpha=gate_values(plan.xsa, pre, post, const.n_heads),
                             out_gate=gate_values(plan.out_gate, pre, post, const.n_heads))
    out = attention_sublayer(p, layer, plan, a, batch, extras, const)
    r, q = p["resid_lambdas"], p["post_lambdas"]
    x = r[layer, 0] * x + q[layer, 0] * out + gate_values(plan.x0_gate, pre, post) * state["x0"]
    if plan.bigram_gate is not None:
        x = x + gate_values(plan.bigram_gate, pre, post) * batch.bigram
    return r[layer, 1] * x + q[layer, 1] * mlp_of(p, layer, x, const)


def skip_layer(p: Mapping[str, Tensor], x: Tensor, state: dict[str, Tensor], const: Constants
               ) -> Tensor:
    """Layer 6: no attention; x ← x + σ(λ_skip)·post28·cache3, then its MLP."""
    x = x + torch.sigmoid(p["scalars"][23]) * state["post"][:, 28:29] * state["cache3"]
    r, q = p["resid_lambdas"], p["post_lambdas"]
    return r[6, 1] * x + q[6, 1] * mlp_of(p, 6, x, const)


def mudd_layer(p: Mapping[str, Tensor], plan: LayerPlan, h: Tensor, state: dict[str, Tensor],
               batch: Batch, const: Constants) -> Tensor:
    """Layer 10 (MUDD block 0): μ = mudd_0(cache9) mixes the residual, the value and the outputs."""
    mu = mudd(p, 0, h, const.mudd0_count, const)
    c0, c7, heads = state["cache0"], state["cache7"], const.n_heads
    x = (1 + mu[:, 5:6]) * h + mu[:, 3:4] * c0 + mu[:, 4:5] * c7
    a = rms_norm(c7, const.norm_eps)
    ve4 = value_embedding(p, 4, batch.tokens).reshape(h.shape[0], heads, -1)
    ve_gate = torch.cat([mu[:, 6:7].expand(-1, heads // 2), mu[:, 7:8].expand(-1, heads // 2)], 1)
    v_mudd = (mu[:, 0:1] * c0 + mu[:, 1:2] * c7 + mu[:, 2:3] * h).reshape(h.shape[0], heads, -1)
    post = state["post"]
    extras = AttentionExtras(aux_v=ve_gate.unsqueeze(-1) * ve4 + v_mudd,
                             out_gate=post[:, 12:18],
                             dc_w1=rms_norm(post[:, 29:35], const.dc_norm_eps),
                             dc_w2=post[:, 35:41])
    out = attention_sublayer(p, 10, plan, a, batch, extras, const)
    x = mu[:, 8:9] * x + mu[:, 9:10] * out + mu[:, 10:11] * c0 + mu[:, 11:12] * batch.bigram
    return mu[:, 12:13] * x + mu[:, 13:14] * mlp_of(p, 10, x, const)


def output_stage(p: Mapping[str, Tensor], x: Tensor, state: dict[str, Tensor], batch: Batch,
                 const: Constants) -> Tensor:
    """ν = mudd_1(x); x + ν0·cache0 + ν1·cache7 + ν2·cache9 + ν3·ve0 + ν4·cache3, then norm."""
    nu = mudd(p, 1, x, const.mudd1_count, const)
    ve0 = value_embedding(p, 0, batch.tokens)
    terms = (state["cache0"], state["cache7"], state["cache9"], ve0, state["cache3"])
    for i, term in enumerate(terms):
        x = x + nu[:, i:i + 1] * term
    return rms_norm(x, const.norm_eps)


def hidden_states(p: Mapping[str, Tensor], batch: Batch, const: Constants = Constants(),
                  trace: dict[int, Tensor] | None = None) -> Tensor:
    """The final normed hidden states (n, d) of the whole model.

    `trace`, when given, receives the residual after each layer i (key −1: cache0), so that a
    disagreement can be located layer by layer.
    """
    plans = record_layer_plans()
    trace = {} if trace is None else trace
    x0, pre, x = input_stage(p, batch, const)
    state = {"x0": x0, "pre": pre, "cache0": x}
    trace[-1] = x
    for layer in range(const.n_layers):
        if layer == 4:
            state["post"] = post_gates(p, state["cache3"], const)
        if layer == 6:
            x = skip_layer(p, x, state, const)
        elif layer == 10:
            state["cache9"] = x
            x = mudd_layer(p, plans[10], x, state, batch, const)
        else:
            x = regular_layer(p, layer, plans[layer], x, state, batch, const)
        if layer in (3, 7):
            state[f"cache{layer}"] = x
        trace[layer] = x
    return output_stage(p, x, state, batch, const)


def eval_loss(x: Tensor, lm_head: Tensor, targets: Tensor, const: Constants = Constants()) -> Tensor:
    """Mean next-token CE of the softcapped logits 23·σ((z + 5)/7.5), z = x·lm_head (in, out)."""
    z = x @ lm_head
    capped = const.softcap * torch.sigmoid((z + const.softcap_shift) / const.softcap_div)
    logp = torch.log_softmax(capped, dim=-1)
    return -logp[torch.arange(x.shape[0]), targets].mean()


def reference_forward(params: Mapping[str, Tensor], tokens: Tensor, targets: Tensor,
                      cu_seqlens: Tensor, windows: tuple[int, int], attn_scale: float,
                      freqs: Tensor, const: Constants = Constants(),
                      trace: dict[int, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """Final hidden states (n, d) and eval loss, in float64, from a state_dict-like mapping."""
    p = {name: t.detach().to(torch.float64) for name, t in params.items()}
    n = tokens.shape[0]
    h, s = bigram_indices(tokens, p["bigram_embed"].shape[0], p["bigram_signs"].shape[0], const)
    bigram = p["bigram_embed"][torch.tensor(h)] * p["bigram_signs"][torch.tensor(s)]
    batch = Batch(tokens=tokens.long(), starts=document_starts(cu_seqlens, n), bigram=bigram,
                  windows=windows, attn_scale=float(attn_scale),
                  freqs=freqs.detach().to(torch.float64))
    x = hidden_states(p, batch, const, trace)
    return x, eval_loss(x, p["lm_head"], targets.long(), const)


# ---------------------------------------------------------------- frequencies and YaRN


def base_frequencies(count: int, const: Constants = Constants()) -> Tensor:
    """f_j = 1024^(−j/(count−1)), j = 0 … count−1 (count = 32 at head_dim 128)."""
    j = torch.arange(count, dtype=torch.float64)
    return const.rope_base ** (-j / (count - 1))


def yarn_update(freqs: Tensor, attn_scale: float, old: int, new: int,
                const: Constants = Constants()) -> tuple[Tensor, float]:
    """YaRN when the long window goes from `old` to `new` tokens: new frequencies and attn_scale."""
    ratio = old / new
    r = old * freqs.to(torch.float64) / (2 * math.pi)
    w = ((r - 1) / const.yarn_ramp).clamp(0, 1)
    scale = attn_scale * (1 + const.yarn_scale_slope * math.log(new / old))
    return freqs.to(torch.float64) * (ratio + w * (1 - ratio)), scale
