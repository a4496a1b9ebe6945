"""The 2026-07 record's model against an independent from-the-spec forward (tests/record_reference.py).

The reference was written from the specification alone; these tests first hold the reference to the
spec's own numbers and sentences (hash wrap-around, YaRN's attn_scale chain, the paired-head
visibility), then hold the model to the reference on a few packed documents with every parameter
random, and finally check each quirk the spec calls out by showing that the model agrees with the
quirk and disagrees with the natural alternative reading.
"""

from __future__ import annotations

import math

import pytest
import torch

import record_reference as ref
from speedrun.model.record import RecordGPT, RecordModelConfig


# ---------------------------------------------------------------- the reference against the spec


def test_bigram_hash_matches_int32_arithmetic_and_the_spec_wrap():
    """h and s at the record's sizes: the sentinel at 0 and as position 1's neighbour, int32 wrap."""
    rows, signs = 377_280, 8192
    x = torch.tensor([50256, 15496, 11, 50256, 40, 50303, 0], dtype=torch.int32)
    h, s = ref.bigram_indices(x, rows, signs)
    assert h[0] == 377_279 and s[0] == 0
    # The spec's own wrapped product 27191·377279 → 1,668,658,697.
    assert h[1] == ((36313 * 15496) ^ 1_668_658_697) % 377_279
    # Later positions: the same formula evaluated as the script does, in int32 tensors.
    prod = (x[2:] * 36313) ^ (x[1:-1] * 27191)
    assert h[2:] == (prod % 377_279).tolist()
    assert s[1:] == ((x[:-1] ^ x[1:]) % signs).tolist()


def test_yarn_reproduces_the_spec_attn_scale_chain():
    """384→896→1408→1664 gives 0.116946, 0.127518, 0.131778; fast frequencies stay, slow ones shrink."""
    f0 = ref.base_frequencies(32)
    assert f0[0] == 1.0 and math.isclose(float(f0[31]), 1 / 1024)
    f, scale, got = f0, 0.1, []
    for old, new in ((384, 896), (896, 1408), (1408, 1664)):
        f_new, scale = ref.yarn_update(f, scale, old, new)
        r = old * f / (2 * math.pi)
        assert torch.equal(f_new[r >= 32], f[r >= 32])
        torch.testing.assert_close(f_new[r <= 1], f[r <= 1] * old / new, rtol=1e-15, atol=0)
        f = f_new
        got.append(round(scale, 6))
    assert got == [0.116946, 0.127518, 0.131778]


def _visible_sets(y: torch.Tensor, n: int, heads: int) -> list[list[set[tuple[int, int]]]]:
    """Which (token, head) one-hot values each output averaged."""
    return [[{divmod(int(c), heads) for c in torch.nonzero(y[t, h]).flatten()}
             for h in range(heads)] for t in range(n)]


def test_paired_attention_visibility_is_the_spec_sentence():
    """Head s of token t sees head s+3 only of tokens < t; head s+3 sees both heads of tokens ≤ t.

    q = k = 0 makes every visible key weigh the same, and one-hot values name each key, so the
    support of each output is its visible set; two documents check that rows stay in their own one.
    """
    n, heads, starts = 7, 6, [0, 0, 0, 0, 4, 4, 4]
    q = torch.zeros(n, heads, n * heads, dtype=torch.float64)
    v = torch.eye(n * heads, dtype=torch.float64).reshape(n, heads, n * heads)
    seen = _visible_sets(ref.paired_attention(q, q, v, starts, 10**6, 1.0), n, heads)
    for t in range(n):
        doc = [u for u in range(n) if starts[u] == starts[t]]
        for s in range(3):
            assert seen[t][s] == ({(u, s) for u in doc if u <= t} | {(u, s + 3) for u in doc if u < t})
            assert seen[t][s + 3] == {(u, g) for u in doc if u <= t for g in (s, s + 3)}
    # The window counts rows, not tokens: with w = 3, head s of token t reaches back to head s+3
    # of token t−2 (row 2t−3) and no further.
    seen = _visible_sets(ref.paired_attention(q, q, v, [0] * n, 3, 1.0), n, heads)
    assert seen[5][1] == {(5, 1), (4, 1), (4, 4), (3, 4)}
    assert seen[5][4] == {(5, 1), (5, 4), (4, 1), (4, 4)}


# ---------------------------------------------------------------- the model against the reference

N_TOKENS = 256
# Four documents (padded by repeating n, as the loader pads): one of 139 tokens so that DC's
# 112-key span bites inside the long window, short ones so that windows and starts matter.
CU_SEQLENS = (0, 37, 41, 180, N_TOKENS, N_TOKENS, N_TOKENS)
WINDOWS = (24, 160)
ATTN_SCALE = 0.2
BOS = 127
# Input rms of the four coefficient generators (pre-gate: x0, post-gate: cache3, MUDD 0: cache9,
# MUDD 1: the residual after layer 10) at these draws, so that each generated coefficient varies
# by ≈ ±0.2 around its init rather than saturating or vanishing.
GENERATOR_INPUT_RMS = {"mudd_gate_w1": (1.0, 7.0), "mudd_w1": (9.0, 12.0)}
HIDDEN_TOL = dict(rtol=1e-5, atol=5e-5)  # float32 model vs float64 reference: ≈1e-6 relative per layer
LOSS_TOL = 1e-5


def _draw(name: str, p: torch.Tensor, gen: torch.Generator, width: int) -> torch.Tensor:
    """A random value for every entry (zero-initialised tables and gates included)."""
    def normal(std: float) -> torch.Tensor:
        return torch.randn(p.shape, generator=gen) * std
    if name in GENERATOR_INPUT_RMS:
        rms = torch.tensor(GENERATOR_INPUT_RMS[name]).view(2, 1, 1)
        return normal(1.0) / (width ** 0.5 * rms)
    if name in ("mudd_w2", "mudd_gate_w2"):
        return normal(0.75)
    if name in ("mudd_b2", "mudd_gate_b2", "scalars", "resid_lambdas", "post_lambdas"):
        return p.float() + normal(1.0 if name.endswith("b2") else 0.2)  # around the spec's init
    if name == "mudd_gate_scale":
        return p.float() + 0.03
    if name == "lm_head":
        return normal(0.3)
    if name in ("embed", "bigram_embed", "value_embeds", "ve_gate_bank", "smear_gate"):
        return normal(1.0)
    return normal(width ** -0.5)  # the banks


def random_model(seed: int = 0) -> RecordGPT:
    """The tiny record model with every parameter random and bf16-representable.

    bf16-representable values make the spec's bf16 casts of fp32 parameters (lambdas, γ) exact,
    so the float32 model and the float64 reference read the very same numbers.
    """
    cfg = RecordModelConfig.tiny()
    gen = torch.Generator().manual_seed(seed)
    model = RecordGPT(cfg, generator=gen)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(_draw(name, p, gen, cfg.model_dim).bfloat16().to(p.dtype))
    return model


def packed_batch(vocab: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random tokens with a BOS at each document start: inputs int32, targets int64, cu_seqlens."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, BOS, (N_TOKENS + 1,), generator=gen)
    tokens[list(CU_SEQLENS[:4])] = BOS
    return tokens[:-1].int(), tokens[1:].long(), torch.tensor(CU_SEQLENS, dtype=torch.int32)


def float32_rope(freqs: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of θ = t·f for 2n positions, computed in float64 and kept in float32.

    The model stores its tables in bf16 as the spec says; handing it float32 ones removes that
    rounding (≈1e-3) from the comparison, and a separate test checks the bf16 tables.
    """
    theta = torch.arange(2 * n, dtype=torch.float64).unsqueeze(1) * freqs.to(torch.float64)
    return theta.cos().float(), theta.sin().float()


class Case:
    """One random model, one packed batch, and both forwards (computed once per module)."""

    def __init__(self) -> None:
        self.model = random_model()
        cfg = self.model.cfg
        self.inputs, self.targets, self.cu = packed_batch(cfg.vocab)
        self.freqs = ref.base_frequencies(cfg.rope_pairs).float()
        self.rope = float32_rope(self.freqs, N_TOKENS)
        self.const = ref.Constants(dc_span=cfg.dc_keys)
        self.hidden, self.loss = self.model_forward()
        self.ref_hidden, self.ref_loss = self.reference()

    def model_forward(self, model: RecordGPT | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.model if model is None else model
        args = (self.inputs, self.cu, WINDOWS, ATTN_SCALE)
        with torch.no_grad():
            hidden = model(*args, rope=self.rope, dtype=torch.float32)
            loss = model.eval_loss(self.inputs, self.targets, *args[1:], rope=self.rope,
                                   dtype=torch.float32)
        return hidden.double(), loss.double()

    def reference(self, const: ref.Constants | None = None, params: dict | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        return ref.reference_forward(self.model.state_dict() if params is None else params,
                                     self.inputs, self.targets, self.cu, WINDOWS, ATTN_SCALE,
                                     self.freqs, self.const if const is None else const)

    def gap_to(self, hidden: torch.Tensor) -> float:
        return float((hidden - self.hidden).abs().max())


@pytest.fixture(scope="module")
def case() -> Case:
    return Case()


def test_tiny_config_keeps_the_record_structure(case):
    """The comparison only means something at the spec's structure: 11 layers, 6 heads, 112 DC keys."""
    cfg = case.model.cfg
    assert (cfg.num_layers, cfg.num_heads, cfg.dc_keys) == (11, 6, 112)
    assert cfg.head_dim == 4 * cfg.rope_pairs and cfg.bigram_rows == cfg.vocab * 15 // 2
    assert torch.equal(case.model.bigram_signs.abs(), torch.ones_like(case.model.bigram_signs))


def test_model_forward_matches_the_reference(case):
    """Final hidden states and eval loss of the float32 model equal the float64 reference."""
    torch.testing.assert_close(case.hidden, case.ref_hidden, **HIDDEN_TOL)
    assert abs(float(case.loss - case.ref_loss)) < LOSS_TOL


def test_each_layer_matches_the_reference(case):
    """The residual after each layer (−1: cache0): a disagreement shows where it starts."""
    with torch.no_grad():
        got = case.model.residuals(case.inputs, case.cu, WINDOWS, ATTN_SCALE, rope=case.rope,
                                   dtype=torch.float32)
    trace: dict[int, torch.Tensor] = {}
    ref.reference_forward(case.model.state_dict(), case.inputs, case.targets, case.cu, WINDOWS,
                          ATTN_SCALE, case.freqs, case.const, trace=trace)
    assert sorted(got) == sorted(trace) == list(range(-1, 11))
    for layer, want in trace.items():
        scale = float(want.abs().max())
        torch.testing.assert_close(got[layer].double() / scale, want / scale, rtol=0, atol=1e-5,
                                   msg=lambda m, layer=layer: f"layer {layer}: {m}")


def test_rope_tables_from_frequencies_are_fp32_angles_in_bf16(case):
    """From `freqs` the model uses bf16 cos/sin of fp32 angles; no freqs means the record's own."""
    theta = torch.arange(2 * N_TOKENS, dtype=torch.float32).unsqueeze(1) * case.freqs
    tables = (theta.cos().bfloat16().float(), theta.sin().bfloat16().float())
    args = (case.inputs, case.cu, WINDOWS, ATTN_SCALE)
    with torch.no_grad():
        from_freqs = case.model(*args, case.freqs, dtype=torch.float32)
        from_default = case.model(*args, dtype=torch.float32)
        from_tables = case.model(*args, rope=tables, dtype=torch.float32)
    torch.testing.assert_close(from_freqs, from_tables, rtol=1e-5, atol=1e-5)
    # A last-bit difference in how f_j is evaluated can flip a few bf16 table entries (≈3e-4 here);
    # another base or count of frequencies would move the output by orders of magnitude more.
    torch.testing.assert_close(from_default, from_freqs, rtol=0, atol=2e-3)
    # The bf16 rounding is visible against the exact tables, so the check above can fail.
    assert case.gap_to(from_freqs.double()) > 10 * HIDDEN_TOL["atol"]  # ≈2e-3 measured


def test_bf16_forward_stays_near_the_reference(case):
    """The default bf16 forward (bf16 activations and tables) is the float64 function, roughly."""
    with torch.no_grad():
        loss = case.model.eval_loss(case.inputs, case.targets, case.cu, WINDOWS, ATTN_SCALE,
                                    case.freqs)
        hidden = case.model(case.inputs, case.cu, WINDOWS, ATTN_SCALE, case.freqs).double()
    cos = torch.nn.functional.cosine_similarity(hidden, case.ref_hidden, dim=1)
    assert float(cos.min()) > 0.995  # ≈0.9994 measured
    assert abs(float(loss) - float(case.ref_loss)) < 0.02  # ≈0.0015 measured


# ---------------------------------------------------------------- the spec's quirks


def _document_bounds(cu: torch.Tensor) -> list[tuple[int, int]]:
    bounds = sorted(set(cu.tolist()))
    return list(zip(bounds[:-1], bounds[1:]))


def test_bigram_hash_crosses_document_starts(case):
    """The bigram rows the loss reaches are exactly the spec's hash rows: a BOS hashes with the last
    token of the previous document, not with the sentinel as a fresh batch would."""
    model = random_model()
    model.eval_loss(case.inputs, case.targets, case.cu, WINDOWS, ATTN_SCALE, rope=case.rope,
                    dtype=torch.float32).backward()
    touched = set(torch.nonzero(model.bigram_embed.grad.abs().sum(1)).flatten().tolist())
    rows, signs = model.cfg.bigram_rows, model.cfg.sign_rows
    h, _ = ref.bigram_indices(case.inputs, rows, signs)
    assert touched == set(h)
    fresh = [ref.bigram_indices(case.inputs[a:b], rows, signs)[0] for a, b in _document_bounds(case.cu)]
    per_document_rows = {r for part in fresh for r in part}
    assert per_document_rows - set(h), "the batch should tell the two readings apart"
    assert not (per_document_rows - set(h)) & touched


def test_bigram_signs_also_cross_document_starts(case, monkeypatch):
    """Hashing each document as its own batch (sentinel and sign row 0 at every BOS) departs from
    the model."""
    whole = ref.bigram_indices

    def per_document(tokens, rows, sign_rows, const=ref.Constants()):
        h, s = [], []
        for a, b in _document_bounds(case.cu):
            part = whole(tokens[a:b], rows, sign_rows, const)
            h, s = h + part[0], s + part[1]
        return h, s

    monkeypatch.setattr(ref, "bigram_indices", per_document)
    assert case.gap_to(case.reference()[0]) > 100 * HIDDEN_TOL["atol"]


def _paired_with(order: list[int]):
    """paired_attention with the heads permuted first: `order` lists which head fills row-major slot."""
    original = ref.paired_attention
    inverse = [order.index(h) for h in range(len(order))]

    def attend(q, k, v, starts, window, scale):
        y = original(q[:, order], k[:, order], v[:, order], starts, window, scale)
        return y[:, inverse]
    return attend


def test_paired_heads_pair_h_with_h_plus_3(case, monkeypatch):
    """Pairing heads (2p, 2p+1), as the README's "pairs of heads" and the RoPE staggering suggest,
    is not what the model does: the spec's (h, h+3) with slot 1's reversed order is."""
    monkeypatch.setattr(ref, "paired_attention", _paired_with([0, 2, 4, 1, 3, 5]))
    assert case.gap_to(case.reference()[0]) > 100 * HIDDEN_TOL["atol"]


def test_paired_window_counts_rows_not_tokens(case, monkeypatch):
    """Doubling the paired window (to cover w tokens of each head) departs from the model."""
    original = ref.paired_attention
    monkeypatch.setattr(ref, "paired_attention",
                        lambda q, k, v, starts, window, scale: original(q, k, v, starts, 2 * window, scale))
    assert case.gap_to(case.reference()[0]) > 100 * HIDDEN_TOL["atol"]


def test_key_offset_crosses_document_starts(case, monkeypatch):
    """A key offset that stops at document starts (each BOS keeping its own upper dims) departs
    from the model: key t takes key t−1's dims across the boundary."""
    original = ref.key_offset
    starts = [a for a, _ in _document_bounds(case.cu) if a > 0]

    def within_documents(k):
        out, half = original(k), k.shape[-1] // 2
        out[starts, :, half:] = k[starts, :, half:]
        return out

    monkeypatch.setattr(ref, "key_offset", within_documents)
    assert case.gap_to(case.reference()[0]) > 100 * HIDDEN_TOL["atol"]


@pytest.mark.parametrize("span", [111, 113])
def test_dc_reads_exactly_112_keys(case, span):
    """DC's softmax over the last 112 keys of the document (not the 160-token window): one key
    fewer or more departs from the model in the 139-token document."""
    assert WINDOWS[1] > 113 and max(b - a for a, b in _document_bounds(case.cu)) > 113
    assert case.gap_to(case.reference(ref.Constants(dc_span=span))[0]) > 100 * HIDDEN_TOL["atol"]


def spec_unused_entries(cfg: RecordModelConfig) -> dict[str, list[tuple]]:
    """The spec's "Unused parameters (verified)" list, and the padding MLP layer 11 (world size 1)."""
    return {
        "ve_gate_bank": [(4,)],
        "scalars": [(slice(12, 14),)],
        "resid_lambdas": [(6, 0), (10,)],
        "post_lambdas": [(6, 0), (10,)],
        "mudd_w2": [(1, slice(5, None))],
        "mudd_b2": [(1, slice(5, None))],
        "mudd_gate_w2": [(0, slice(26, None))],
        "mudd_gate_b2": [(0, slice(26, None))],
        "mlp_bank": [(slice(cfg.num_layers, None),)],
    }


def _unused_masks(model: RecordGPT, entries: dict[str, list[tuple]]) -> dict[str, torch.Tensor]:
    masks = {name: torch.zeros_like(p, dtype=torch.bool) for name, p in model.named_parameters()}
    for name, indices in entries.items():
        for index in indices:
            masks[name][index] = True
    return masks


def test_unused_parameters_change_nothing_and_get_no_gradient(case):
    """The spec's unused entries: redrawn, the output is bit-identical; their gradient is exactly 0;
    every other entry of the dense parameters does get a gradient (the list is complete)."""
    model = random_model()
    masks = _unused_masks(model, spec_unused_entries(model.cfg))
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p[masks[name]] = (torch.randn(p.shape, generator=gen)[masks[name]] * 3).to(p.dtype)
    hidden, loss = case.model_forward(model)
    assert torch.equal(hidden, case.hidden) and torch.equal(loss, case.loss)
    model.eval_loss(case.inputs, case.targets, case.cu, WINDOWS, ATTN_SCALE, rope=case.rope,
                    dtype=torch.float32).backward()
    sparse_by_input = ("embed", "lm_head", "bigram_embed", "value_embeds")
    for name, p in model.named_parameters():
        assert not p.grad[masks[name]].any(), name
        if name not in sparse_by_input:
            assert (p.grad[~masks[name]] != 0).all(), name


def test_reference_ignores_the_unused_parameters_too(case):
    """The reference, written from the equations, reads none of the listed entries either."""
    model = random_model()
    masks = _unused_masks(model, spec_unused_entries(model.cfg))
    params = {name: t.clone() for name, t in model.state_dict().items()}
    for name, mask in masks.items():
        params[name][mask] = 1e3
    hidden, loss = case.reference(params=params)
    assert torch.equal(hidden, case.ref_hidden) and torch.equal(loss, case.ref_loss)


def test_model_lists_the_same_unused_entries_as_the_spec(case):
    """RecordGPT.unused_entries (which the optimiser may rely on) marks the spec's entries, no more."""
    model = case.model
    want = _unused_masks(model, spec_unused_entries(model.cfg))
    got_entries: dict[str, list[tuple]] = {}
    for name, index in model.unused_entries():
        got_entries.setdefault(name, []).append(index)
    got = _unused_masks(model, got_entries)
    for name in want:
        assert torch.equal(got[name], want[name]), name
