"""The 2026-07 record's input and attention parts, as plain functions on explicit tensors.

These are the references that every fast path of the 2026-07 record (#89) is held to: the
FA3-style varlen attention, the paired-head layout, the DC kernels, the fused input stage. So each
function is written to be obviously right rather than fast, straight from the equations of
`/work/shared/spec/record-2026-07.md` (sections "Bigram hash input", "Input stage", "Attention
sublayer", "Paired-head attention", "YaRN" and "Head and loss"):

- One packed local batch of n tokens, batch dimension none (or 1 where the docstring says so):
  per-head tensors are (n, H, D), token vectors (n, 768), documents are int32 `cu_seqlens`
  padded by repeating n (empty trailing segments).
- The arithmetic runs in float32 (float64 nowhere, so that a reference costs what a CPU run can
  pay) and is rounded once to the input's dtype at the end. The record computes most of these in
  bf16; a GPU path matches a reference here to bf16 tolerance, never bit for bit.
- The integer hashes are exact: they compute in int64 and apply the int32 wrap-around explicitly,
  so they do not rely on how a backend overflows a signed product.
- Each constant is a keyword argument whose default is the record's value; nothing is read from
  module state, nothing runs at import.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# ---------------------------------------------------------------- norm and head


def norm(z: Tensor, eps: float = 1.1920928955078125e-07) -> Tensor:
    """RMS norm over the last axis, no weight (spec "Model"): z / sqrt(mean(z²) + eps) in float32,
    eps the float32 machine epsilon whatever z's dtype, the result in z's dtype."""
    zf = z.float()
    return (zf * torch.rsqrt(zf.square().mean(-1, keepdim=True) + eps)).to(z.dtype)


SOFTCAP = (23.0, 5.0, 7.5)  # (cap, shift, divisor) of the head's softcap; the fused loss kernel reads them


def softcap(z: Tensor, cap: float = SOFTCAP[0], shift: float = SOFTCAP[1], divisor: float = SOFTCAP[2]) -> Tensor:
    """The head's logit softcap (spec "Head and loss"): cap·σ((z + shift)/divisor), in float32 (float64
    input stays float64, so that gradient checks can run in double precision)."""
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    return cap * torch.sigmoid((z + shift) / divisor)


# ---------------------------------------------------------------- bigram hash input


def _wrap_int32(v: Tensor) -> Tensor:
    """An int64 tensor's values as int32 two's-complement arithmetic leaves them (still int64)."""
    return torch.remainder(v + 2**31, 2**32) - 2**31


def bigram_hash(x: Tensor, rows: int = 377_280, mul_cur: int = 36_313, mul_prev: int = 27_191) -> Tensor:
    """Bigram table rows h (int32, x's shape) for tokens x (..., n) (spec "Bigram hash input").

    h[0] = rows − 1 (the reserved row); for t ≥ 1,
    h[t] = ((mul_cur·x[t]) XOR (mul_prev·p[t])) mod (rows − 1) in int32, with p[t] = x[t−1] for t ≥ 2
    and p[1] = rows − 1: the record hashes in place, so position 0 already holds the sentinel when
    position 1 reads its neighbour. mul_prev·377,279 wraps in int32 (to 1,668,658,697), which is why
    the products are wrapped here explicitly. Document starts are not special."""
    sentinel = rows - 1
    x64 = x.long()
    prev = torch.cat([torch.full_like(x64[..., :2], sentinel), x64[..., 1:-1]], dim=-1)  # n entries for any n
    mixed = torch.bitwise_xor(_wrap_int32(mul_cur * x64), _wrap_int32(mul_prev * prev))
    h = torch.remainder(mixed, sentinel)
    h[..., :1] = sentinel
    return h.to(torch.int32)


def bigram_sign_index(x: Tensor, rows: int = 8192) -> Tensor:
    """Sign-table rows s (int32) for tokens x (..., n): s[0] = 0, s[t] = (x[t−1] XOR x[t]) mod rows
    (spec "Bigram hash input"; real tokens on both sides, no sentinel)."""
    x64 = x.long()
    s = torch.remainder(torch.bitwise_xor(x64[..., :-1], x64[..., 1:]), rows)
    return torch.cat([torch.zeros_like(x64[..., :1]), s], dim=-1).to(torch.int32)


def sign_table(generator: torch.Generator, rows: int = 8192, dim: int = 768) -> Tensor:
    """The fixed (rows, dim) ±1 bf16 table: the signs of N(0,1) draws from `generator`, on its device.
    A draw of exactly 0 (possible in principle) counts as +1 so that every entry is ±1."""
    draws = torch.randn(rows, dim, generator=generator, device=generator.device, dtype=torch.float32)
    return torch.where(draws < 0, -1.0, 1.0).to(torch.bfloat16)


def bigram_vector(table: Tensor, signs: Tensor, h: Tensor, s: Tensor) -> Tensor:
    """b[t] = table[h[t]] ⊙ signs[s[t]] (n, dim) in table's dtype; exact, the signs being ±1."""
    return table[h.long()] * signs[s.long()].to(table.dtype)


# ---------------------------------------------------------------- input stage


def smear(e: Tensor, gate_w: Tensor, lam: Tensor | float, inputs: int = 12) -> Tensor:
    """Smear (spec "Input stage" 2) on embeddings e (n, dim): e′[0] = e[0] and
    e′[t] = e[t] + λ·σ(gate_w·e[t][0:inputs])·e[t−1], the un-smeared neighbour, across document
    starts. gate_w (1, inputs); float32 math, the result in e's dtype."""
    ef = e.float()
    gate = torch.sigmoid(ef[..., 1:, :inputs] @ gate_w.float().reshape(-1, 1))  # (n−1, 1)
    lam_f = torch.as_tensor(lam, dtype=torch.float32, device=e.device)
    out = torch.cat([ef[..., :1, :], ef[..., 1:, :] + lam_f * gate * ef[..., :-1, :]], dim=-2)
    return out.to(e.dtype)


# ---------------------------------------------------------------- rotary and YaRN


def rope_freqs(pairs: int = 32, base: float = 1024.0) -> Tensor:
    """f_j = base^(−j/(pairs−1)), j = 0 … pairs−1, float32 (spec "Attention sublayer"; the same 32
    frequencies as the 2025-08 record, computed the same way)."""
    return (1.0 / base) ** torch.linspace(0, 1, steps=pairs, dtype=torch.float32)


def yarn(freqs: Tensor, attn_scale: float, old: int, new: int, alpha: float = 1.0, beta: float = 32.0,
         temperature: float = 0.2) -> tuple[Tensor, float]:
    """One YaRN update as the long window goes from `old` to `new` tokens (spec "YaRN"):
    r_j = old·f_j/(2π), w_j = clamp((r_j − alpha)/(beta − alpha), 0, 1),
    f_j ← f_j·(old/new + w_j·(1 − old/new)), attn_scale ← attn_scale·(1 + temperature·ln(new/old)).
    High frequencies (many turns inside the old window) keep their value, low ones are slowed by
    old/new. Returns the new float32 frequencies and the new scale."""
    ratio = old / new
    r = old * freqs.float() / (2 * math.pi)
    w = ((r - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    return freqs.float() * (ratio + w * (1.0 - ratio)), attn_scale * (1.0 + temperature * math.log(new / old))


def rope_tables(freqs: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """(cos, sin), each (n, pairs) bf16, of the angles t·f_j for positions t = 0 … n−1: the angles
    in float32, the stored tables rounded to bf16 as the record stores them."""
    theta = torch.arange(n, dtype=torch.float32, device=freqs.device)[:, None] * freqs.float()[None, :]
    return theta.cos().to(torch.bfloat16), theta.sin().to(torch.bfloat16)


def paired_positions(n: int, heads: int = 6, device: torch.device | str | None = None) -> Tensor:
    """(n, heads) int64 rotary positions of the paired layers: head h of token t at 2t + (h mod 2)
    (spec "Paired-head attention"). Index a table of 2n positions with it: `cos[paired_positions(n)]`."""
    t = torch.arange(n, device=device)[:, None]
    h = torch.arange(heads, device=device)[None, :]
    return 2 * t + h % 2


def rotate_adjacent(z: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary on z (..., n, H, D): for j < p = cos.shape[-1] the adjacent pair (2j, 2j+1) becomes
    out[2j] = cos·z[2j] + sin·z[2j+1], out[2j+1] = cos·z[2j+1] − sin·z[2j] (a rotation by −θ);
    dims 2p … D−1 are copied. cos/sin (n, p) for one position per token, or (n, H, p) for one per
    token and head (the paired layers). Float32 math on the stored tables, result in z's dtype."""
    c, s = cos.float(), sin.float()
    if c.dim() == 2:  # one angle per token: the same for every head
        c, s = c[:, None, :], s[:, None, :]
    p = c.shape[-1]
    zf = z.float()
    even, odd = zf[..., 0 : 2 * p : 2], zf[..., 1 : 2 * p : 2]
    pairs = torch.stack((c * even + s * odd, c * odd - s * even), dim=-1).flatten(-2)
    return torch.cat((pairs, zf[..., 2 * p :]), dim=-1).to(z.dtype)


def key_offset(k: Tensor, start: int = 64) -> Tensor:
    """Key offset (layers 3, 10, after rotary) on k (..., n, H, D): dims start … D−1 of key t become
    key t−1's original ones for t ≥ 1, across document starts; key 0 keeps its own."""
    out = k.clone()
    out[..., 1:, :, start:] = k[..., :-1, :, start:]
    return out


# ---------------------------------------------------------------- paired heads


def pair_heads(q: Tensor) -> Tensor:
    """(..., n, H, D) → (..., 2n, H/2, D), row-major: head h of token t goes to row 2t + ⌊h/(H/2)⌋,
    slot h mod (H/2) (spec "Paired-head attention"); a view where q is contiguous."""
    *lead, n, h, d = q.shape
    return q.reshape(*lead, 2 * n, h // 2, d)


def unpair_heads(y: Tensor) -> Tensor:
    """The inverse of `pair_heads`: (..., 2n, S, D) → (..., n, 2S, D)."""
    *lead, rows, s, d = y.shape
    return y.reshape(*lead, rows // 2, 2 * s, d)


def pair_cu_seqlens(cu_seqlens: Tensor) -> Tensor:
    """Document bounds in paired rows: every bound doubled (a document of L tokens is 2L rows).
    The window is not doubled: it counts rows."""
    return cu_seqlens * 2


# ---------------------------------------------------------------- attention


def _segments(cu_seqlens: Tensor, n: int) -> list[tuple[int, int]]:
    """The non-empty (start, end) token ranges of int cu_seqlens over n tokens; ValueError unless
    they start at 0, never decrease and end at n (trailing repeats of n are empty documents)."""
    cu = [int(c) for c in cu_seqlens.reshape(-1).tolist()]
    if not cu or cu[0] != 0 or cu[-1] != n or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must run from 0 to n = {n} without decreasing, got {cu}")
    return [(a, b) for a, b in zip(cu, cu[1:]) if b > a]


def _blocks(cu_seqlens: Tensor, n: int, window: int, chunk: int) -> list[tuple[int, int, int]]:
    """(q0, q1, k0) per block of at most `chunk` queries inside one document: the queries q0 … q1−1
    may only see the keys k0 … q1−1 (the document's start, or q0 − window if later)."""
    if window < 0:
        raise ValueError(f"window must be >= 0 tokens, got {window}")
    return [(q0, min(q0 + chunk, b), max(a, q0 - window))
            for a, b in _segments(cu_seqlens, n) for q0 in range(a, b, chunk)]


def _window_probs(q: Tensor, k: Tensor, q0: int, k0: int, window: int, scale: float) -> Tensor:
    """(H, nq, nk) float32 softmax of scale·q·k over the keys of one block: key j is visible to
    query i iff j ≤ i and i − j ≤ window (positions q0 + row, k0 + column)."""
    i = torch.arange(q0, q0 + q.shape[0], device=q.device)[:, None]
    j = torch.arange(k0, k0 + k.shape[0], device=q.device)[None, :]
    visible = (j <= i) & (i - j <= window)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    return scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)


def reference_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, window: int, scale: float,
                        query_chunk: int = 512) -> Tensor:
    """The attention every fast path must match (spec "Attention sublayer", "Systems notes": FA3
    varlen semantics): q, k, v (n, H, D) or (1, n, H, D); inside each cu_seqlens document, causal,
    query i sees keys i − window … i (window + 1 keys, itself included); softmax(scale·q·kᵀ) in
    float32, output in q's dtype. Queries go in chunks so that memory stays O(chunk·(chunk+window))."""
    batched = q.dim() == 4
    if batched:
        q, k, v = q[0], k[0], v[0]
    out = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=torch.float32, device=q.device)
    for q0, q1, k0 in _blocks(cu_seqlens, q.shape[0], window, query_chunk):
        probs = _window_probs(q[q0:q1], k[k0:q1], q0, k0, window, scale)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", probs, v[k0:q1].float())
    out = out.to(q.dtype)
    return out[None] if batched else out


def dc_correction(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, w1: Tensor, w2: Tensor, scale: float,
                  keys: int = 112, eps: float = 1e-6, query_chunk: int = 512) -> Tensor:
    """Layer 10's DC term (spec "Attention sublayer", DC), float32 (n, H, D), to add to the
    attention output: term_h(t) = w2_h(t)·Σ_j A(t, j)·v_h(j), A(t, j) = Σ_g w1n_g(t)·P_g(t, j).

    P_g is head g's softmax of scale·q_g(t)·k_g(j) over the `keys` keys j ∈ [t − keys + 1, t] of t's
    document; q, k, v (n, H, D) or (1, n, H, D) are the attention's own (after rotary, key offset and
    aux_v). w1 (n, H) raw, normed over the heads in float32 with `eps` (so it starts at 1 each);
    w2 (n, H). The score products run in float32, standing in for the record's tf32. The term stays
    float32 so that the caller rounds y + term once."""
    if q.dim() == 4:
        return dc_correction(q[0], k[0], v[0], cu_seqlens, w1.reshape(q.shape[1:3]), w2.reshape(q.shape[1:3]),
                             scale, keys, eps, query_chunk)[None]
    w1n = norm(w1.float(), eps)
    out = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for q0, q1, k0 in _blocks(cu_seqlens, q.shape[0], keys - 1, query_chunk):
        probs = _window_probs(q[q0:q1], k[k0:q1], q0, k0, keys - 1, scale)  # (H, nq, nk)
        mix = torch.einsum("qh,hqk->qk", w1n[q0:q1], probs)
        out[q0:q1] = w2[q0:q1].float()[..., None] * torch.einsum("qk,khd->qhd", mix, v[k0:q1].float())
    return out


def xsa(y: Tensor, v: Tensor, alpha: Tensor, eps: float = 1e-8) -> Tensor:
    """XSA (layers 1, 3, 4, 7) on y, v (..., H, D) and alpha (..., H): per head,
    y ← y − tanh(α)·(⟨y, v⟩ / max(‖v‖², eps))·v, v the token's own value. At tanh α = 1 this
    removes y's component along v. Float32 math, result in y's dtype."""
    yf, vf = y.float(), v.float()
    along = (yf * vf).sum(-1, keepdim=True) / (vf * vf).sum(-1, keepdim=True).clamp_min(eps)
    return (yf - torch.tanh(alpha.float())[..., None] * along * vf).to(y.dtype)


def value_embed_gate(a: Tensor, ve: Tensor, gate: Tensor, inputs: int = 6) -> Tensor:
    """Per-head value-embedding gate (layers 1, 2, 8, 9): g = 2σ(G·[a[0:inputs], ve[0:inputs]]),
    a the attention input and ve the token's value-embedding row (..., dim), G (H, 2·inputs).
    Returns g (..., H) in a's dtype; the layer adds g_h·ve_h to v_h."""
    u = torch.cat((a[..., :inputs], ve[..., :inputs]), dim=-1).float()
    return (2 * torch.sigmoid(u @ gate.float().T)).to(a.dtype)


# ---------------------------------------------------------------- banks


class _BankViews(torch.autograd.Function):
    """A bank's blocks of `rows` matrices along dim 0 as views (rows = 1: the matrices themselves),
    with a backward that lays the blocks' gradients side by side: one copy of each, where a
    gradient through a select or a slice per use is a bank-sized tensor of zeros with one block
    filled, and a compiler sums the uses' tensors in one bank-sized pass that tests every use at
    every element. Autograd hands an unused block a gradient of zeros (the pads)."""

    @staticmethod
    def forward(ctx, bank: Tensor, rows: int) -> tuple[Tensor, ...]:
        ctx.rows = rows
        return tuple(bank.unbind(0)) if rows == 1 else tuple(bank.split(rows))

    @staticmethod
    def backward(ctx, *grads: Tensor) -> tuple[Tensor, None]:
        return (torch.stack(grads) if ctx.rows == 1 else torch.cat(grads)), None


def bank_views(bank: Tensor, rows: int = 1) -> tuple[Tensor, ...]:
    """bank's matrices (rows = 1) or blocks of `rows` matrices (the last may be shorter), as
    `bank.unbind(0)` / `bank.split(rows)` give them; their gradients reach the bank in one
    concatenation (`_BankViews`). The same values and, each block used once, the same gradient bits."""
    return _BankViews.apply(bank, rows)
