"""The 2026-07 record's training loss (MTP + prefix term), eval loss and prefix table T′.

The losses are checked against loops over positions and terms that compute each
cross-entropy with math.exp / math.log in float64 from the spec's formula; the
gradient against the spec's per-logit formula (23/7.5)·s(1−s)·(S_t·p − Σ weights on
the target columns), with S_t counting only the terms kept at position t. The prefix
table is checked against GPT-2 tokens found by hand and a brute-force scan of the
whole vocabulary.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from speedrun.data.tokenizer import EOT, get_encoding
from speedrun.model.record_loss import (
    PADDED_VOCAB,
    prefix_table,
    record_eval_loss,
    record_training_loss,
)

V, N = 13, 9
# A T′ for the tiny vocabulary: ids 0, 3, 6, 9, 12 have none.
TINY_PREFIX = torch.tensor([-1, 0, 1, -1, 2, 3, -1, 5, 0, -1, 4, 8, -1])
TARGETS = torch.tensor([3, 7, 0, 12, 5, 9, 11, 6, 2])  # four of the nine have no T′


@pytest.fixture(scope="module")
def encoding():
    return get_encoding()


@pytest.fixture(scope="module")
def table(encoding):
    return prefix_table(encoding)


def logits(n: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, V, generator=g, dtype=torch.float64) * 12).to(dtype)


def ce64(row: list[float], y: int) -> float:
    """CE(ẑ, y) in float64 from the raw logits, with ẑ = 23·σ((z + 5)/7.5)."""
    s = [23.0 / (1.0 + math.exp(-(v + 5.0) / 7.5)) for v in row]
    return math.log(sum(math.exp(v) for v in s)) - s[y]


def loop_loss(z: torch.Tensor, targets: list[int], weights: list[float], pi: float,
              prefix: list[int]) -> float:
    """Σ_t [Σ_{k: t+k<n} w_k·CE(ẑ_t, x[t+k+1]) + π·CE(ẑ_t, T′(x[t+1])) where T′ exists]."""
    rows, n, total = z.double().tolist(), len(targets), 0.0
    for t in range(n):
        for k, w in enumerate(weights):
            if t + k < n:
                total += w * ce64(rows[t], targets[t + k])
        if prefix[targets[t]] >= 0:
            total += pi * ce64(rows[t], prefix[targets[t]])
    return total


# ------------------------------------------------------------------ prefix table


def test_prefix_table_known_tokens(encoding, table):
    tok = encoding.encode_single_token
    assert table.shape == (PADDED_VOCAB,) and table.dtype == torch.int64
    assert table[tok(b" there")] == tok(b" ther")  # " ther" is itself a token, longer than " the"
    assert table[tok(b" ther")] == tok(b" the")
    assert table[tok(b" the")] == tok(b" th")
    assert table[tok(b" th")] == tok(b" t")
    assert table[tok(b" t")] == tok(b" ")
    assert table[tok(b"ing")] == tok(b"in")
    # " therefor", " therefo", " theref" are not tokens: the walk skips down to " there"
    assert table[tok(b" therefore")] == tok(b" there")
    assert table[tok(b" Hello")] == tok(b" Hell")


def test_prefix_table_none(encoding, table):
    singles = [i for i in range(EOT) if len(encoding.decode_single_token_bytes(i)) == 1]
    assert len(singles) == 256
    assert (table[singles] == -1).all()
    assert (table[EOT:] == -1).all()  # BOS and the 47 padding ids
    # every byte is a token, so every multi-byte token has some prefix
    assert int((table[:EOT] >= 0).sum()) == EOT - 256


def test_prefix_table_against_a_scan(encoding, table):
    words = [encoding.decode_single_token_bytes(i) for i in range(EOT)]
    for v, p in enumerate(table[:EOT].tolist()):  # whatever T′ says is a proper prefix
        if p >= 0:
            assert len(words[p]) < len(words[v]) and words[v].startswith(words[p])
    for v in random.Random(0).sample(range(256, EOT), 30):  # and it is the longest one
        longest = max((u for u in range(EOT) if len(words[u]) < len(words[v]) and words[v].startswith(words[u])),
                      key=lambda u: len(words[u]))
        assert table[v] == longest


# ------------------------------------------------------------------ losses


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_loss_matches_a_loop(dtype):
    z = logits(N, 1, dtype)
    weights, pi = [1.0, 0.5, 0.25], 0.25
    got = record_training_loss(z, TARGETS, weights, pi, TINY_PREFIX)
    expect = loop_loss(z, TARGETS.tolist(), weights, pi, TINY_PREFIX.tolist())
    assert got.dtype == torch.float32 and got.shape == ()
    assert math.isclose(got.item(), expect, rel_tol=2e-6)


def test_more_terms_than_tokens():
    z, targets = logits(2, 2), TARGETS[:2]
    weights = [1.0, 0.5, 0.25, 0.125]
    got = record_training_loss(z, targets, weights, 0.1, TINY_PREFIX)
    expect = loop_loss(z, targets.tolist(), weights, 0.1, TINY_PREFIX.tolist())
    assert math.isclose(got.item(), expect, rel_tol=2e-6)


def test_dropped_terms_at_the_end():
    z = logits(N, 3).requires_grad_()
    # only the k = 2 term: positions 0..n−3 against targets 2..n−1
    only_k2 = record_training_loss(z, TARGETS, [0.0, 0.0, 1.0], 0.0, TINY_PREFIX)
    s = 23 * torch.sigmoid((z.detach().double() + 5) / 7.5)
    assert math.isclose(only_k2.item(), F.cross_entropy(s[: N - 2], TARGETS[2:], reduction="sum").item(),
                        rel_tol=2e-6)
    # without the k = 0 and prefix terms the last row has nothing left, the one before only k = 1
    (grad,) = torch.autograd.grad(record_training_loss(z, TARGETS, [0.0, 1.0, 1.0], 0.0, TINY_PREFIX), z)
    assert torch.equal(grad[-1], torch.zeros(V))
    (g1,) = torch.autograd.grad(record_training_loss(z, TARGETS, [0.0, 1.0], 0.0, TINY_PREFIX), z)
    torch.testing.assert_close(grad[-2], g1[-2])


def test_one_term_no_prefix_is_the_softcapped_ce_sum():
    z = logits(N, 4)
    got = record_training_loss(z, TARGETS, [1.0], 0.0, TINY_PREFIX)
    s = 23 * torch.sigmoid((z.double() + 5) / 7.5)
    expect = F.cross_entropy(s, TARGETS, reduction="sum")
    assert math.isclose(got.item(), expect.item(), rel_tol=2e-6)


def test_gradient_is_that_of_the_reported_loss():
    """The spec's per-logit gradient, with S_t = Σ of the weights of the terms kept at t
    (the fused kernel uses Σ of all weights on the last K−1 rows too; see the module docstring)."""
    z = logits(N, 5, torch.float64).requires_grad_()
    weights, pi = [1.0, 0.5, 0.25], 0.25
    (grad,) = torch.autograd.grad(record_training_loss(z, TARGETS, weights, pi, TINY_PREFIX), z)
    sig = torch.sigmoid((z.detach() + 5) / 7.5)
    p = torch.softmax(23 * sig, dim=-1)
    expect = torch.zeros(N, V, dtype=torch.float64)
    for t in range(N):
        has = TINY_PREFIX[TARGETS[t]] >= 0
        kept = [k for k in range(len(weights)) if t + k < N]
        expect[t] = (sum(weights[k] for k in kept) + (pi if has else 0.0)) * p[t]
        for k in kept:
            expect[t, TARGETS[t + k]] -= weights[k]
        if has:
            expect[t, TINY_PREFIX[TARGETS[t]]] -= pi
    expect *= (23 / 7.5) * sig * (1 - sig)
    torch.testing.assert_close(grad, expect, rtol=1e-12, atol=1e-14)


def test_gradcheck():
    z = logits(5, 6, torch.float64).requires_grad_()
    targets = torch.tensor([4, 9, 1, 0, 7])
    assert torch.autograd.gradcheck(
        lambda z: record_training_loss(z, targets, [1.0, 0.5], 0.25, TINY_PREFIX), (z,))


def test_eval_loss():
    z = logits(10, 7, torch.bfloat16)
    targets = torch.tensor([3, 7, 0, 12, 5, 9, 11, 6, 2, 1])
    rows = z.double().tolist()
    expect = sum(ce64(r, y) for r, y in zip(rows, targets.tolist())) / 10
    for chunk in (3, 4096):
        got = record_eval_loss(z, targets, chunk=chunk)
        assert got.dtype == torch.float32
        assert math.isclose(got.item(), expect, rel_tol=2e-6)
