"""The 2026-07 record's input and attention parts (`speedrun.model.record_parts`) against plain
computations written here from the spec's definitions: Python-int hashes, per-query loops over
the allowed keys, complex-number rotations, and the spec's own numbers."""

import math

import pytest
import torch
import torch.nn.functional as F

from speedrun.model.record_parts import (
    bigram_hash, bigram_sign_index, bigram_vector, dc_correction, key_offset, norm, pair_cu_seqlens, pair_heads,
    paired_positions, reference_attention, rope_freqs, rope_tables, rotate_adjacent, sign_table, smear, softcap,
    unpair_heads, value_embed_gate, xsa, yarn,
)

SENTINEL = 377_279


def wrap32(v: int) -> int:
    """What int32 arithmetic leaves of the Python int v."""
    return (v + 2**31) % 2**32 - 2**31


def docs_of(cu: list[int], n: int) -> list[int]:
    """Document index per token from cu_seqlens bounds."""
    return [max(i for i in range(len(cu) - 1) if cu[i] <= t < cu[i + 1]) for t in range(n)]


def qkv(n, heads, dim, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, heads, dim, generator=gen).to(dtype) for _ in range(3)]


# ---------------------------------------------------------------- norm, softcap


def test_norm_is_rms_with_float32_epsilon():
    z = torch.full((3, 768), 1e-4)  # mean z² = 1e-8: the epsilon dominates
    expected = 1e-4 / math.sqrt(1e-8 + 1.1920928955078125e-07)
    assert torch.allclose(norm(z), torch.full_like(z, expected), rtol=1e-6)
    assert torch.equal(norm(torch.zeros(2, 768)), torch.zeros(2, 768))
    x = torch.randn(5, 768, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    xd = x.double()
    ref = xd / (xd.square().mean(-1, keepdim=True) + torch.finfo(torch.float32).eps).sqrt()
    got = norm(x)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.double(), ref, rtol=2**-8, atol=0)


def test_softcap_at_points():
    z = torch.tensor([-5.0, 2.5, -12.5, 1000.0, -1000.0], dtype=torch.bfloat16)
    got = softcap(z)
    assert got.dtype == torch.float32
    expected = [11.5, 23 / (1 + math.exp(-1)), 23 / (1 + math.e), 23.0, 0.0]
    assert torch.allclose(got, torch.tensor(expected), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- bigram hash


def test_bigram_hash_by_hand():
    # a document ends at position 2; a BOS (50256) starts the next at position 3
    x = [50256, 464, 3290, 50256, 1169, 50303, 0]
    assert wrap32(27191 * SENTINEL) == 1_668_658_697
    expected = [
        SENTINEL,
        (wrap32(36313 * 464) ^ wrap32(27191 * SENTINEL)) % SENTINEL,  # p[1] is the sentinel, wrapped
        (36313 * 3290 ^ 27191 * 464) % SENTINEL,
        (36313 * 50256 ^ 27191 * 3290) % SENTINEL,  # across the document start: not masked
        (36313 * 1169 ^ 27191 * 50256) % SENTINEL,
        (36313 * 50303 ^ 27191 * 1169) % SENTINEL,
        (36313 * 0 ^ 27191 * 50303) % SENTINEL,
    ]
    # without the int32 wrap, position 1 would hash elsewhere
    assert expected[1] != (36313 * 464 ^ 27191 * SENTINEL) % SENTINEL
    got = bigram_hash(torch.tensor(x, dtype=torch.int32))
    assert got.dtype == torch.int32
    assert got.tolist() == expected
    assert bigram_hash(torch.tensor([x], dtype=torch.int32)).tolist() == [expected]  # batch dimension 1
    assert bigram_hash(torch.tensor([7], dtype=torch.int32)).tolist() == [SENTINEL]


def test_bigram_hash_matches_int32_tensor_arithmetic():
    """The record's form: the int32 products (wrapping), XOR, %, on the sentinel-shifted copy."""
    x = torch.randint(0, 50304, (500,), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    prev = x.clone()
    prev[0] = SENTINEL
    h = torch.full_like(x, SENTINEL)
    h[1:] = torch.bitwise_xor(36313 * x[1:], 27191 * prev[:-1]) % SENTINEL
    assert torch.equal(bigram_hash(x), h)


def test_bigram_sign_index_by_hand():
    x = [50256, 464, 3290, 50256, 1169]
    expected = [0, (50256 ^ 464) % 8192, (464 ^ 3290) % 8192, (3290 ^ 50256) % 8192, (50256 ^ 1169) % 8192]
    got = bigram_sign_index(torch.tensor(x, dtype=torch.int32))
    assert got.dtype == torch.int32 and got.tolist() == expected


def test_sign_table_is_the_sign_of_normal_draws():
    table = sign_table(torch.Generator().manual_seed(3))
    assert table.shape == (8192, 768) and table.dtype == torch.bfloat16
    draws = torch.randn(8192, 768, generator=torch.Generator().manual_seed(3))
    assert torch.equal(table, torch.where(draws < 0, -1.0, 1.0).to(torch.bfloat16))
    assert set(table.unique().tolist()) == {-1.0, 1.0}
    assert abs((table > 0).float().mean().item() - 0.5) < 0.01


def test_bigram_vector_rows():
    gen = torch.Generator().manual_seed(4)
    table = torch.randn(50, 8, generator=gen).to(torch.bfloat16)
    signs = sign_table(gen, rows=16, dim=8)
    h = torch.randint(0, 50, (20,), generator=gen, dtype=torch.int32)
    s = torch.randint(0, 16, (20,), generator=gen, dtype=torch.int32)
    got = bigram_vector(table, signs, h, s)
    for t in range(20):
        assert torch.equal(got[t], table[h[t]] * signs[s[t]])


# ---------------------------------------------------------------- smear


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2**-7)])
def test_smear_against_loop(dtype, tol):
    gen = torch.Generator().manual_seed(5)
    e = torch.randn(40, 768, generator=gen).to(dtype)
    w = torch.randn(1, 12, generator=gen)
    lam = 0.7
    got = smear(e, w, torch.tensor(lam))
    assert got.dtype == dtype and torch.equal(got[0], e[0])
    ed, wd = e.double(), w.double()[0]
    for t in range(1, 40):
        gate = 1 / (1 + math.exp(-float(ed[t, :12] @ wd)))
        expected = ed[t] + lam * gate * ed[t - 1]  # the un-smeared neighbour
        assert torch.allclose(got[t].double(), expected, rtol=tol, atol=tol), t


# ---------------------------------------------------------------- rotary and YaRN


def test_rope_freqs_and_tables():
    f = rope_freqs()
    expected = torch.tensor([1024.0 ** (-j / 31) for j in range(32)], dtype=torch.float64)
    assert f.dtype == torch.float32 and torch.allclose(f.double(), expected, rtol=1e-6, atol=0)
    cos, sin = rope_tables(f, 4096)
    assert cos.shape == sin.shape == (4096, 32) and cos.dtype == sin.dtype == torch.bfloat16
    theta = torch.arange(4096, dtype=torch.float64)[:, None] * expected[None, :]
    assert torch.allclose(cos.double(), theta.cos(), atol=5e-3, rtol=0)
    assert torch.allclose(sin.double(), theta.sin(), atol=5e-3, rtol=0)


def complex_rotation(z, angle_cos, angle_sin):
    """The spec's rotation as complex numbers: (z[2j] + i·z[2j+1])·e^(−iθ) on dims 0–63."""
    zc = torch.complex(z[..., 0:64:2].double(), z[..., 1:64:2].double())
    out = zc * torch.complex(angle_cos.double(), -angle_sin.double())
    return out.real, out.imag


def test_rotate_adjacent_against_complex_numbers():
    n = 50
    z = qkv(n, 6, 128, 6)[0]
    cos, sin = rope_tables(rope_freqs(), n)
    got = rotate_adjacent(z, cos, sin)
    re, im = complex_rotation(z, cos[:, None, :], sin[:, None, :])
    assert torch.allclose(got[..., 0:64:2].double(), re, atol=1e-5)
    assert torch.allclose(got[..., 1:64:2].double(), im, atol=1e-5)
    assert torch.equal(got[..., 64:], z[..., 64:])
    zb = z.to(torch.bfloat16)
    assert rotate_adjacent(zb, cos, sin).dtype == torch.bfloat16
    assert torch.equal(rotate_adjacent(z[None], cos, sin)[0], got)  # batch dimension 1


def test_paired_rotation_positions():
    n = 30
    z = qkv(n, 6, 128, 7)[0]
    pos = paired_positions(n)
    assert pos[5].tolist() == [10, 11, 10, 11, 10, 11]  # head h of token t at 2t + (h mod 2)
    cos, sin = rope_tables(rope_freqs(), 2 * n)
    got = rotate_adjacent(z, cos[pos], sin[pos])
    angles = pos[..., None].double() * rope_freqs().double()
    re, im = complex_rotation(z, angles.cos(), angles.sin())
    assert torch.allclose(got[..., 0:64:2].double(), re, atol=2e-2)  # bf16 tables
    assert torch.allclose(got[..., 1:64:2].double(), im, atol=2e-2)
    assert torch.equal(got[:, 1], rotate_adjacent(z[:, 1:2], cos[1::2], sin[1::2])[:, 0])


def test_yarn_matches_the_spec():
    f, scale = rope_freqs(), 0.1
    expected_scales = [0.116946, 0.127518, 0.131778]
    for (old, new), want in zip([(384, 896), (896, 1408), (1408, 1664)], expected_scales):
        before = f.double().tolist()
        f, scale = yarn(f, scale, old, new)
        assert abs(scale - want) < 5e-7
        for j, fj in enumerate(before):
            w = min(max((old * fj / (2 * math.pi) - 1) / 31, 0.0), 1.0)
            assert math.isclose(f[j].item(), fj * (old / new + w * (1 - old / new)), rel_tol=1e-6)
        assert f[0].item() == before[0] and math.isclose(f[31].item(), before[31] * old / new, rel_tol=1e-6)


# ---------------------------------------------------------------- key offset, paired heads


def test_key_offset():
    k = qkv(20, 6, 128, 8)[0]
    got = key_offset(k)
    assert torch.equal(got[0], k[0])
    for t in range(1, 20):
        assert torch.equal(got[t, :, :64], k[t, :, :64])
        assert torch.equal(got[t, :, 64:], k[t - 1, :, 64:])
    assert torch.equal(key_offset(k[None])[0], got)


def test_pair_heads_row_mapping():
    n = 9
    q = (1000 * torch.arange(n)[:, None] + torch.arange(6)[None, :]).float()[..., None].expand(n, 6, 4)
    p = pair_heads(q.contiguous())
    assert p.shape == (2 * n, 3, 4)
    for t in range(n):
        for h in range(6):
            assert torch.equal(p[2 * t + h // 3, h % 3], q[t, h])
    # the spec's slots: 0 interleaves heads 0 and 3, 1 heads 1 and 4, 2 heads 2 and 5
    heads = p[..., 0].long() % 1000
    assert heads[:, 0].tolist() == [0, 3] * n and heads[:, 1].tolist() == [1, 4] * n
    assert heads[:, 2].tolist() == [2, 5] * n
    # rotary positions along each slot's rows: slot 1 runs in reversed pairs
    rows = pair_heads(paired_positions(n)[..., None])[..., 0]
    assert rows[:, 0].tolist() == list(range(2 * n)) == rows[:, 2].tolist()
    assert rows[:, 1].tolist() == [r ^ 1 for r in range(2 * n)]
    assert torch.equal(unpair_heads(p), q)
    cu = torch.tensor([0, 4, 9, 9], dtype=torch.int32)
    doubled = pair_cu_seqlens(cu)
    assert doubled.dtype == torch.int32 and doubled.tolist() == [0, 8, 18, 18]


def paired_visibility(n, cu, window):
    """visible[t, h, t', h']: does head h of token t attend head h' of token t' in a paired layer.
    One-hot values (row r of a slot holds e_r) make the output the attention weights themselves."""
    q, k, _ = qkv(n, 6, 128, 9)
    rows = torch.zeros(2 * n, 3, 128)
    rows[torch.arange(2 * n), :, torch.arange(2 * n)] = 1.0
    out = unpair_heads(reference_attention(pair_heads(norm(q)), pair_heads(norm(k)), rows,
                                           pair_cu_seqlens(cu), window, 0.1))
    visible = torch.zeros(n, 6, n, 6, dtype=torch.bool)
    for h in range(6):
        for r in range(2 * n):
            visible[:, h, r // 2, h % 3 + 3 * (r % 2)] = out[:, h, r] > 0
    return visible


@pytest.mark.parametrize("window", [1, 2, 5, 100])
def test_paired_visibility_rule(window):
    """Head s of token t sees head s+3 only of tokens < t; head s+3 sees both heads of tokens ≤ t;
    the window counts rows, so about window/2 tokens of each head."""
    n, cu = 24, [0, 10, 11, 24, 24]
    docs = docs_of(cu, n)
    got = paired_visibility(n, torch.tensor(cu, dtype=torch.int32), window)
    for t in range(n):
        for tp in range(n):
            d = t - tp
            for s in range(3):
                same = docs[t] == docs[tp]
                rule = {  # (head of t, head of t'): visible
                    (s, s): same and 0 <= d <= window // 2,
                    (s, s + 3): same and 1 <= d <= (window + 1) // 2,
                    (s + 3, s): same and 0 <= d <= (window - 1) // 2,
                    (s + 3, s + 3): same and 0 <= d <= window // 2,
                }
                for (h, hp), want in rule.items():
                    assert bool(got[t, h, tp, hp]) == want, (t, h, tp, hp)
            for h in range(6):  # never across slots
                assert not got[t, h, tp, [x for x in range(6) if x % 3 != h % 3]].any()
    if window >= 2 * n:  # no window left: the spec's rule as written
        for t in range(n):
            tokens = [tp for tp in range(n) if docs[tp] == docs[t]]
            assert got[t, 0, :, 3].nonzero().flatten().tolist() == [tp for tp in tokens if tp < t]
            assert got[t, 3, :, 0].nonzero().flatten().tolist() == [tp for tp in tokens if tp <= t]


# ---------------------------------------------------------------- attention


def loop_attention(q, k, v, cu, window, scale):
    """Per query, the allowed key set built in Python, softmax in float64."""
    n = q.shape[0]
    docs = docs_of(cu, n)
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(n):
        keys = [j for j in range(n) if docs[j] == docs[i] and j <= i and i - j <= window]
        scores = torch.einsum("hd,khd->hk", q[i].double(), k[keys].double()) * scale
        out[i] = torch.einsum("hk,khd->hd", scores.softmax(-1), v[keys].double())
    return out


CU = [0, 37, 38, 90, 150, 150, 150]  # a one-token document and two empty trailing segments


@pytest.mark.parametrize("window", [0, 1, 7, 40, 500])
def test_reference_attention_against_loop(window):
    q, k, v = qkv(150, 6, 32, 10)
    cu = torch.tensor(CU, dtype=torch.int32)
    expected = loop_attention(q, k, v, CU, window, 0.3)
    got = reference_attention(q, k, v, cu, window, 0.3)
    assert got.dtype == torch.float32 and torch.allclose(got.double(), expected, atol=1e-5)
    chunked = reference_attention(q, k, v, cu, window, 0.3, query_chunk=16)
    assert torch.allclose(chunked.double(), expected, atol=1e-5)


def sdpa_mask(cu, n, window):
    docs = torch.tensor(docs_of(cu, n))
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (docs[:, None] == docs[None, :]) & (j <= i) & (i - j <= window)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("window", [3, 64, 1000])
def test_reference_attention_against_sdpa(dtype, tol, window):
    n = 150
    q, k, v = qkv(n, 6, 128, 11, dtype)
    cu = torch.tensor(CU, dtype=torch.int32)
    got = reference_attention(q[None], k[None], v[None], cu, window, 0.12)  # batch dimension 1
    assert got.shape == (1, n, 6, 128) and got.dtype == dtype
    expected = F.scaled_dot_product_attention(*(t.float().transpose(0, 1)[None] for t in (q, k, v)),
                                              attn_mask=sdpa_mask(CU, n, window), scale=0.12)
    assert torch.allclose(got[0].float(), expected[0].transpose(0, 1), atol=tol, rtol=tol)


def test_reference_attention_rejects_bad_bounds():
    q, k, v = qkv(10, 2, 8, 12)
    for cu in ([0, 5, 9], [1, 10], [0, 6, 5, 10]):
        with pytest.raises(ValueError):
            reference_attention(q, k, v, torch.tensor(cu, dtype=torch.int32), 4, 1.0)


def loop_dc(q, k, v, cu, w1, w2, scale):
    n, heads = q.shape[:2]
    docs = docs_of(cu, n)
    out = torch.zeros(q.shape, dtype=torch.float64)
    for t in range(n):
        keys = [j for j in range(max(0, t - 111), t + 1) if docs[j] == docs[t]]
        w1n = w1[t].double() / (w1[t].double().square().mean() + 1e-6).sqrt()
        mix = sum(w1n[g] * (scale * k[keys, g].double() @ q[t, g].double()).softmax(0) for g in range(heads))
        for h in range(heads):
            out[t, h] = w2[t, h].double() * (mix @ v[keys, h].double())
    return out


def test_dc_correction_against_loop():
    n, cu = 260, [0, 150, 151, 260, 260]  # a document longer than the 112 keys
    q, k, v = qkv(n, 6, 32, 13)
    gen = torch.Generator().manual_seed(14)
    w1, w2 = torch.randn(n, 6, generator=gen), torch.randn(n, 6, generator=gen)
    expected = loop_dc(q, k, v, cu, w1, w2, 0.2)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    got = dc_correction(q, k, v, cu_t, w1, w2, 0.2)
    assert got.dtype == torch.float32 and torch.allclose(got.double(), expected, atol=1e-5)
    assert torch.allclose(dc_correction(q, k, v, cu_t, w1, w2, 0.2, query_chunk=7).double(), expected, atol=1e-5)
    assert torch.equal(dc_correction(q[None], k[None], v[None], cu_t, w1[None], w2[None], 0.2)[0], got)


def test_xsa_removes_the_value_direction():
    gen = torch.Generator().manual_seed(15)
    y, v = torch.randn(30, 6, 128, generator=gen), torch.randn(30, 6, 128, generator=gen)
    alpha = torch.full((30, 6), 30.0)
    assert torch.equal(torch.tanh(alpha), torch.ones(30, 6))
    out = xsa(y, v, alpha)
    dots = (out.double() * v.double()).sum(-1)
    assert (dots.abs() <= 1e-5 * y.norm(dim=-1) * v.norm(dim=-1)).all()
    a = torch.randn(30, 6, generator=gen)
    v[0, 2] = 0.0  # a zero value: the 1e-8 floor keeps y as it is
    got = xsa(y.to(torch.bfloat16), v.to(torch.bfloat16), a)
    yd, vd = y.to(torch.bfloat16).double(), v.to(torch.bfloat16).double()
    coef = (yd * vd).sum(-1, keepdim=True) / (vd * vd).sum(-1, keepdim=True).clamp_min(1e-8)
    expected = yd - a.double().tanh()[..., None] * coef * vd
    assert got.dtype == torch.bfloat16 and torch.allclose(got.double(), expected, atol=2e-2, rtol=1e-2)
    assert torch.equal(got[0, 2], y[0, 2].to(torch.bfloat16))
    tiny = torch.zeros(1, 1, 128)
    tiny[..., 0] = 1e-5  # ‖v‖² = 1e-10 is floored to 1e-8: only 1 % of y's component along v goes
    expected = y[:1, :1].clone()
    expected[..., 0] -= math.tanh(0.5) * 0.01 * y[0, 0, 0]
    assert torch.allclose(xsa(y[:1, :1], tiny, torch.full((1, 1), 0.5)), expected, rtol=1e-5, atol=1e-6)


def test_value_embed_gate_against_loop():
    gen = torch.Generator().manual_seed(16)
    a, ve = torch.randn(10, 768, generator=gen), torch.randn(10, 768, generator=gen)
    gate = torch.randn(6, 12, generator=gen)
    got = value_embed_gate(a, ve, gate)
    assert got.shape == (10, 6)
    for t in range(10):
        u = a[t, :6].tolist() + ve[t, :6].tolist()
        for h in range(6):
            logit = sum(gate[h, i].item() * u[i] for i in range(12))
            assert math.isclose(got[t, h].item(), 2 / (1 + math.exp(-logit)), rel_tol=1e-5)
    assert torch.equal(value_embed_gate(a, ve, torch.zeros(6, 12)), torch.ones(10, 6))  # the zero init: 1
