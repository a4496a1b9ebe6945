"""The 2026-07 record's model (`speedrun.model.record`) against the spec's own numbers and tables.

Parameter names, shapes and counts at the record's size (meta device, no memory); the init table
value by value; the gate-lane tables and the layer map written out here from the spec (not from the
module's derivation), checked by which layer's residual a lane first reaches (autograd), by the calls
the forward makes into `record_parts`, and by q/k recomputed by hand (complex-number rotation, paired
rows placed by a loop); the unused parameters of "Unresolved / ambiguous" get exactly zero gradient and
every other entry some; the bf16 casts of the lambdas and γ; causality. All on the tiny config, CPU.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from speedrun.model import record_parts
from speedrun.model.record import RecordGPT, RecordModelConfig, count_parameters, gate_lanes
from speedrun.model.record_loss import record_eval_loss

TINY = RecordModelConfig.tiny()
N = 40
CU = torch.tensor([0, 13, 30, 40, 40, 40], dtype=torch.int32)  # three documents, two empty
WINDOWS = (6, 16)  # short, long: both bind inside the documents
SCALE = 0.12
F32 = torch.float32
ATTN_LAYERS = (0, 1, 2, 3, 4, 5, 7, 8, 9, 10)

# The spec's lane tables: lane -> the layer that reads it (−1: before layer 0; None: nobody).
PRE_LANES = {**{i: 1 for i in range(0, 6)}, **{i: 3 for i in range(6, 18)}, 18: 0, 19: -1, 20: 1, 21: 1,
             22: 2, 23: 2, 24: 3, 25: 3, **{i: None for i in range(26, 41)}}
POST_LANES = {**{i: 4 for i in range(0, 6)}, **{i: 7 for i in range(6, 12)}, **{i: 10 for i in range(12, 18)},
              18: 4, 19: 4, 20: 5, 21: 5, 22: 7, 23: 7, 24: 8, 25: 8, 26: 9, 27: 9, 28: 6,
              **{i: 10 for i in range(29, 41)}}
# effective initial values (pre- and post-gate tables, MUDD blocks)
PRE_INIT = [0.0] * 12 + [0.25] * 6 + [0.0, 0.05] * 4
POST_INIT = [0.0] * 12 + [0.25] * 6 + [0.0, 0.05] * 5 + [0.5] + [1.0] * 6 + [0.0] * 6
MU_INIT = [0.0] * 6 + [2.0, 2.0, math.sqrt(1.1), 1.0, 0.0, 0.05, math.sqrt(1.1), 1.0]
NU_INIT = [0.0, -0.5, 0.0, 0.0, 0.0]


def tokens(seed: int, n: int = N) -> torch.Tensor:
    return torch.randint(0, TINY.vocab, (n,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)


@torch.no_grad()
def randomize(model: RecordGPT, seed: int) -> RecordGPT:
    """Every parameter but γ moved off its init (zero matrices and gates included), so that every
    path carries signal: bf16 matrices and tables by N(0, 1/last dim), the generators' biases by
    N(0, 1) (0.1 effective), the fp32 scalars and lambdas by N(0, 0.2²)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name == "mudd_gate_scale":
            continue
        std = 1.0 if name.endswith("_b2") else 0.2 if p.dtype == torch.float32 else p.shape[-1] ** -0.5
        p.add_((torch.randn(p.shape, generator=g) * std).to(p.dtype))
    return model


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: these matrices are tiny, and on the shared 2-core machine two threads
    made the file ten times slower (40 s against 4 s under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def fresh() -> RecordGPT:
    return RecordGPT(TINY, world_size=8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def model() -> RecordGPT:
    return randomize(RecordGPT(TINY, world_size=8, generator=torch.Generator().manual_seed(1)), 2)


def rms(z: torch.Tensor) -> torch.Tensor:
    z = z.double()
    return z / (z.square().mean(-1, keepdim=True) + torch.finfo(torch.float32).eps).sqrt()


# ---------------------------------------------------------------- record size (meta)


@pytest.mark.parametrize("world_size, total", [(1, 640_605_607), (2, 640_605_607), (4, 640_605_607),
                                               (8, 643_751_335)])
def test_record_size_parameters_on_meta(world_size, total):
    m = RecordGPT(world_size=world_size, device="meta")
    assert count_parameters(m) == total
    assert count_parameters(m, padding=False) == 635_887_015
    pad = 4 if world_size == 8 else 0
    shapes = {
        "embed": (50304, 768), "lm_head": (768, 50304), "bigram_embed": (377280, 768),
        "value_embeds": (5 * 50304, 768), "ve_gate_bank": (5, 6, 12), "smear_gate": (1, 12),
        "qk_bank": (60 + pad, 256, 768), "vo_bank": (20 + pad, 768, 768), "mlp_bank": (12, 2, 3072, 768),
        "scalars": (24,), "resid_lambdas": (11, 2), "post_lambdas": (11, 2),
        "mudd_w1": (2, 64, 768), "mudd_w2": (2, 14, 64), "mudd_b2": (2, 14),
        "mudd_gate_w1": (2, 64, 768), "mudd_gate_w2": (2, 41, 64), "mudd_gate_b2": (2, 41), "mudd_gate_scale": (),
    }
    assert {n: tuple(p.shape) for n, p in m.named_parameters()} == shapes
    fp32 = {"scalars", "resid_lambdas", "post_lambdas", "mudd_gate_scale"}
    assert all(p.dtype == (torch.float32 if n in fp32 else torch.bfloat16) for n, p in m.named_parameters())
    buffers = dict(m.named_buffers())
    assert set(buffers) == {"bigram_signs"} and buffers["bigram_signs"].shape == (8192, 768)
    assert m.cfg.bigram_rows == 377_280 and m.cfg.gate_outputs == (26, 41)


def test_gate_lanes_are_the_spec_tables():
    for cfg in (RecordModelConfig(), TINY):
        lanes = gate_lanes(cfg)
        for k, table in enumerate((PRE_LANES, POST_LANES)):
            for lane, layer in table.items():
                owners = [key for key, (g, s) in lanes.items() if g == k and s.start <= lane < s.stop]
                assert [key[1] for key in owners] == ([] if layer is None else [max(layer, 0)]), (k, lane)
        assert lanes[("x0", 0)] == (0, slice(18, 19)) and lanes[("bigram", 0)] == (0, slice(19, 20))
        assert lanes[("skip", 6)] == (1, slice(28, 29))
        assert lanes[("dc_w1", 10)] == (1, slice(29, 35)) and lanes[("dc_w2", 10)] == (1, slice(35, 41))


# ---------------------------------------------------------------- init


def test_init_values_are_the_table(fresh):
    m = fresh
    assert torch.equal(m.embed, m.lm_head.T) and m.tied
    for name in ("bigram_embed", "ve_gate_bank", "smear_gate", "mudd_w2", "mudd_gate_w2"):
        assert not getattr(m, name).any(), name
    assert not m.mlp_bank[:, 1].any() and m.mlp_bank[:, 0].ne(0).float().mean() > 0.99  # all 12 c_fc drawn
    assert not m.qk_bank[60:].any() and not m.vo_bank[20:].any() and m.qk_bank.shape[0] == 64
    expected_scalars = [0.5, 1.0] * 11 + [0.0, -1.5]
    assert m.scalars.tolist() == expected_scalars
    assert torch.equal(m.resid_lambdas, torch.full((11, 2), math.sqrt(1.1), dtype=torch.float32))
    assert torch.equal(m.post_lambdas, torch.ones(11, 2))
    assert m.mudd_gate_scale.item() == pytest.approx(0.1) and m.mudd_gate_scale.dtype == torch.float32
    # stored biases: effective ÷ 0.1 in bf16 (√1.1/0.1 → 10.5)
    assert m.mudd_b2[0].tolist() == [0.0] * 6 + [20.0, 20.0, 10.5, 10.0, 0.0, 0.5, 10.5, 10.0]
    assert m.mudd_b2[1].tolist() == [0.0, -5.0] + [0.0] * 12
    assert m.mudd_gate_b2[0].tolist() == [0.0] * 12 + [2.5] * 6 + [0.0, 0.5] * 4 + [0.0] * 15
    assert m.mudd_gate_b2[1].tolist() == [0.0] * 12 + [2.5] * 6 + [0.0, 0.5] * 5 + [5.0] + [10.0] * 6 + [0.0] * 6
    signs = m.bigram_signs.float()
    assert signs.abs().eq(1).all() and abs(signs.mean().item()) < 0.05


def test_init_statistics(fresh):
    m, d = fresh, TINY.model_dim
    assert math.isclose(math.sqrt(3) * 0.5 * 768**-0.5, 1 / 32)  # the record's bound
    bound = math.sqrt(3) * 0.5 * d**-0.5
    for w in (m.qk_bank[:60], m.vo_bank[:20], m.mlp_bank[:, 0]):
        w = w.float()
        assert w.abs().max() <= bound and w.abs().max() > 0.99 * bound
        assert w.var().item() == pytest.approx(bound**2 / 3, rel=0.03)
        assert abs(w.mean().item()) < 0.01 * bound
    assert m.lm_head.float().std().item() == pytest.approx(0.005, rel=0.03)
    assert m.value_embeds.float().std().item() == pytest.approx(0.01, rel=0.03)
    for w1 in (m.mudd_w1, m.mudd_gate_w1):  # kaiming U(±1/√width)
        assert w1.float().abs().max() <= d**-0.5 and w1.float().var().item() == pytest.approx(1 / (3 * d), rel=0.1)
    other = RecordGPT(TINY, generator=torch.Generator().manual_seed(0))
    assert torch.equal(other.qk_bank, m.qk_bank[:60]) and torch.equal(other.bigram_signs, m.bigram_signs)


def test_generators_start_at_the_effective_values(fresh):
    z = rms(torch.randn(7, TINY.model_dim, generator=torch.Generator().manual_seed(3))).float()
    pre, post = fresh.gate(0, z), fresh.gate(1, z)
    assert pre.shape == (7, 26) and post.shape == (7, 41)
    # γ acts as bf16(0.1) = 0.10009765625, the biases as bf16(v / 0.1)
    assert torch.allclose(pre, torch.tensor(PRE_INIT).expand(7, 26), rtol=2e-3, atol=0)
    assert torch.allclose(post, torch.tensor(POST_INIT).expand(7, 41), rtol=2e-3, atol=0)
    assert torch.allclose(fresh.mudd(0, z), torch.tensor(MU_INIT).expand(7, 14), rtol=5e-3, atol=0)
    assert torch.allclose(fresh.mudd(1, z), torch.tensor(NU_INIT).expand(7, 5), rtol=0, atol=0)
    skip = torch.sigmoid(fresh.scalars[23]) * post[0, 28]
    assert skip.item() == pytest.approx(0.091, abs=5e-4)  # σ(−1.5)·0.5


# ---------------------------------------------------------------- forward


@pytest.mark.parametrize("which", ["fresh", "model"])
def test_forward_runs_in_float32_and_bfloat16(which, request):
    m = request.getfixturevalue(which)
    x = tokens(4)
    with torch.no_grad():
        h32 = m(x, CU, WINDOWS, SCALE, dtype=F32)
        h16 = m(x, CU, WINDOWS, SCALE)
    assert h32.shape == h16.shape == (N, TINY.model_dim)
    assert h32.dtype == F32 and h16.dtype == torch.bfloat16
    assert torch.isfinite(h32).all() and torch.isfinite(h16.float()).all()
    assert torch.allclose(h32.square().mean(-1), torch.ones(N), atol=1e-4)  # the final norm
    cos = torch.nn.functional.cosine_similarity(h32, h16.float(), dim=-1)
    # bf16 rounding compounds over 11 layers, more so with the randomised gates and MLPs
    assert cos.min() > (0.999 if which == "fresh" else 0.9) and cos.median() > 0.99


def test_causal_across_documents(model):
    """Token 14 (inside the second document) reaches no earlier row and every later row of its
    document. It reaches the third document (30 …) only through the key offset of layers 3 and 10,
    which hands key 29's upper half to key 30 across the document start: row 30 sees key 30 alone
    (softmax weight 1 whatever the key) and does not change, rows 31 … do. Smear and the bigram hash
    at row 30 read token 29, which is unchanged."""
    x = tokens(5)
    y = x.clone()
    y[14] = (y[14] + 1) % TINY.vocab
    with torch.no_grad():
        hx, hy = model(x, CU, WINDOWS, SCALE, dtype=F32), model(y, CU, WINDOWS, SCALE, dtype=F32)
    diff = (hx - hy).abs().amax(-1)
    assert torch.allclose(hx[:14], hy[:14], rtol=0, atol=1e-6) and diff[30] <= 1e-6
    assert diff[14:30].gt(1e-2).all() and diff[31:].gt(1e-5).all()


def trace_calls(monkeypatch, m: RecordGPT) -> tuple[list, list]:
    """Record the forward's calls into record_parts and the attention inputs per layer."""
    events, inputs = [], []
    for name in ("reference_attention", "key_offset", "dc_correction", "xsa", "value_embed_gate"):
        real = getattr(record_parts, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            events.append((_name, args))
            return _real(*args, **kwargs)

        monkeypatch.setattr(record_parts, name, spy)
    real_attention = m.attention

    def attention(i, a, aux_v, ctx):
        inputs.append((i, a.detach()))
        return real_attention(i, a, aux_v, ctx)

    monkeypatch.setattr(m, "attention", attention)
    return events, inputs


def per_layer(events: list) -> list[dict]:
    """Group the calls by attention call: VE gate and key offset come before it, DC and XSA after."""
    layers, pending = [], set()
    for name, args in events:
        if name == "reference_attention":
            q, _, _, cu, window, _ = args
            layers.append({"rows": q.shape[0], "slots": q.shape[1], "cu": cu, "window": window,
                           "q": q, "k": args[1], **{p: True for p in pending}})
            pending = set()
        elif name in ("dc_correction", "xsa"):
            layers[-1][name] = True
        else:
            pending.add(name)
    return layers


def test_layer_map_by_the_calls_made(model, monkeypatch):
    m = copy.deepcopy(model)
    events, inputs = trace_calls(monkeypatch, m)
    with torch.no_grad():
        after = m.residuals(tokens(6), CU, WINDOWS, SCALE, dtype=F32)
    layers = per_layer(events)
    assert [i for i, _ in inputs] == list(ATTN_LAYERS) and len(layers) == 10
    for i, got in zip(ATTN_LAYERS, layers):
        paired = i in (0, 2, 5, 9)
        assert (got["rows"], got["slots"]) == ((2 * N, 3) if paired else (N, 6)), i
        assert torch.equal(got["cu"], 2 * CU if paired else CU), i  # the window is never doubled
        assert got["window"] == (16 if i in (3, 10) else 6), i
        assert got.get("key_offset", False) == (i in (3, 10)), i
        assert got.get("value_embed_gate", False) == (i in (1, 2, 8, 9)), i  # layer 10: μ6, μ7
        assert got.get("dc_correction", False) == (i == 10), i
        assert got.get("xsa", False) == (i in (1, 3, 4, 7)), i
    for i, a in inputs:  # norm(cache7) on 8–10, else the norm of the residual entering the layer
        src = after[7] if i in (8, 9, 10) else after[i - 1]
        assert torch.allclose(a.double(), rms(src), atol=1e-5), i


def by_hand_qk(m: RecordGPT, i: int, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer i's q, k as the attention receives them, from the spec in float64: W_Q = qk_bank[6j..6j+2]
    stacked, W_K = qk_bank[6j+3..6j+5], scaled by λ0 = scalars[2i]; RMS-normed per head; rotated
    (z[2j] + i·z[2j+1])·e^(−iθ) at t (plain) or 2t + h mod 2 (paired); dims D/2… of key t from key
    t−1 on 3 and 10; paired rows: head h of token t at row 2t + ⌊h/3⌋, slot h mod 3."""
    n, H, D, p = a.shape[0], 6, TINY.head_dim, TINY.head_dim // 4
    j = i if i < 6 else i - 1
    bank = m.qk_bank[6 * j : 6 * j + 6].double() * m.scalars[2 * i].double()
    q = rms((a.double() @ bank[:3].reshape(H * D, -1).T).view(n, H, D))
    k = rms((a.double() @ bank[3:].reshape(H * D, -1).T).view(n, H, D))
    t, h = torch.arange(n)[:, None], torch.arange(H)[None, :]
    pos = (2 * t + h % 2) if i in (0, 2, 5, 9) else t.expand(n, H)
    freqs = 1024.0 ** (-torch.arange(p, dtype=torch.float64) / (p - 1))
    turn = torch.polar(torch.ones(n, H, p, dtype=torch.float64), -pos[..., None].double() * freqs)

    def rotate(z):
        zc = torch.complex(z[..., 0 : 2 * p : 2], z[..., 1 : 2 * p : 2]) * turn
        return torch.cat((torch.stack((zc.real, zc.imag), -1).flatten(-2), z[..., 2 * p :]), -1)

    q, k = rotate(q), rotate(k)
    if i in (3, 10):
        k[1:, :, D // 2 :] = k[:-1, :, D // 2 :].clone()
    if i not in (0, 2, 5, 9):
        return q, k
    rows = torch.zeros(2, 2 * n, 3, D, dtype=torch.float64)
    for tt in range(n):
        for hh in range(H):
            rows[:, 2 * tt + hh // 3, hh % 3] = torch.stack((q[tt, hh], k[tt, hh]))
    return rows[0], rows[1]


def test_queries_and_keys_by_hand(model, monkeypatch):
    m = copy.deepcopy(model)
    events, inputs = trace_calls(monkeypatch, m)
    with torch.no_grad():
        m(tokens(7), CU, WINDOWS, SCALE, dtype=F32)
    layers = per_layer(events)
    for (i, a), got in zip(inputs, layers):
        if i not in (0, 3, 9, 10):  # paired, plain + key offset, paired on cache7, the MUDD layer
            continue
        q, k = by_hand_qk(m, i, a)
        assert torch.allclose(got["q"].double(), q, atol=2e-2), i  # bf16 cos/sin tables
        assert torch.allclose(got["k"].double(), k, atol=2e-2), i


def test_each_lane_first_reaches_its_layer(model):
    """The gradient of layer l's residual reaches a lane's bias iff the lane is read at l or before:
    the first such l is the layer of the spec's tables (−1: the bigram before layer 0)."""
    m = copy.deepcopy(model)
    after = m.residuals(tokens(8), CU, WINDOWS, SCALE, dtype=F32)
    g = torch.Generator().manual_seed(9)
    reached = {}
    for layer in range(-1, 11):
        probe = (after[layer] * torch.randn(after[layer].shape, generator=g)).sum()
        gate_b2, mudd_b2 = torch.autograd.grad(probe, [m.mudd_gate_b2, m.mudd_b2], retain_graph=True,
                                               allow_unused=True)
        for name, grad in (("gate", gate_b2), ("mudd", mudd_b2)):
            if grad is None:
                continue
            for k, lane in grad.ne(0).nonzero().tolist():
                reached.setdefault((name, k, lane), layer)
    expected = {("gate", k, lane): layer for k, table in enumerate((PRE_LANES, POST_LANES))
                for lane, layer in table.items() if layer is not None}
    expected.update({("mudd", 0, lane): 10 for lane in range(14)})  # block 1 reaches no residual
    assert reached == expected


X0_LANES = {0: (0, 18), 1: (0, 20), 2: (0, 22), 3: (0, 24), 4: (1, 18), 5: (1, 20), 7: (1, 22), 8: (1, 24),
            9: (1, 26)}  # (generator, x0 lane); the bigram lane is the next one


def close(got: torch.Tensor, want: torch.Tensor, what) -> None:
    assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4), what


def generator_by_hand(p: dict, prefix: str, k: int, z: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """(W2·gelu(W1·z) + b2)·scale in float64, GELU in its erf form."""
    u = z.double() @ p[prefix + "w1"][k].T
    return (0.5 * u * (1 + torch.erf(u / math.sqrt(2))) @ p[prefix + "w2"][k].T + p[prefix + "b2"][k]) * scale


def capture_sublayers(monkeypatch, m: RecordGPT) -> tuple[dict, dict]:
    att, mlps = {}, {}
    real_attention, real_mlp = m.attention, m.mlp

    def attention(i, a, aux_v, ctx):
        att[i] = (a.detach(), aux_v, real_attention(i, a, aux_v, ctx))
        return att[i][2]

    def mlp(layer, a, ctx=None):
        mlps[layer] = (a.detach(), real_mlp(layer, a, ctx))
        return mlps[layer][1]

    monkeypatch.setattr(m, "attention", attention)
    monkeypatch.setattr(m, "mlp", mlp)
    return att, mlps


def input_stage_by_hand(m: RecordGPT, p: dict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x0 = norm(smeared embedding) and the bigram vector b, in float64."""
    t = x.long()
    e = p["embed"][t]
    gate = torch.sigmoid(e[1:, :12] @ p["smear_gate"][0])
    x0 = rms(torch.cat((e[:1], e[1:] + p["scalars"][22] * gate[:, None] * e[:-1])))
    rows = record_parts.bigram_hash(x, TINY.bigram_rows).long()
    signs = m.bigram_signs.double()[record_parts.bigram_sign_index(x, TINY.sign_rows).long()]
    return x0, p["bigram_embed"][rows] * signs


def check_value_aux(p: dict, i: int, a: torch.Tensor, aux: torch.Tensor | None, x: torch.Tensor) -> None:
    """aux_v of layer i: g_h·ve_h with g = 2σ(G_k·[a[0:6], ve[0:6]]) on VE layers 1, 2, 8, 9 (tables
    0–3), none on the others (layer 10 is checked with its μ)."""
    if i not in (1, 2, 8, 9):
        assert aux is None, i
        return
    k = (1, 2, 8, 9).index(i)
    ve = p["value_embeds"][k * TINY.vocab + x.long()]
    g = 2 * torch.sigmoid(torch.cat((a.double()[:, :6], ve[:, :6]), -1) @ p["ve_gate_bank"][k].T)
    close(aux, g[..., None] * ve.view(N, 6, -1), ("aux_v", i))


def check_mudd_layer(p: dict, after: dict, att: dict, mlps: dict, b: torch.Tensor, x: torch.Tensor) -> None:
    """Layer 10 from μ = mudd_0(cache9): the VE gate μ6/μ7 and v_mudd, the pre-attention mix, μ8–μ11
    after attention, μ12/μ13 around the MLP."""
    c0, c7, c9 = after[-1], after[7], after[9]
    mu = generator_by_hand(p, "mudd_", 0, c9, 0.1)[:, :14].split(1, -1)
    _, aux, out = att[10]
    ve4 = p["value_embeds"][4 * TINY.vocab + x.long()].view(N, 6, -1)
    g = torch.cat((mu[6].expand(N, 3), mu[7].expand(N, 3)), -1)
    close(aux, g[..., None] * ve4 + (mu[0] * c0 + mu[1] * c7 + mu[2] * c9).view(N, 6, -1), "aux_v 10")
    mid = (1 + mu[5]) * c9 + mu[3] * c0 + mu[4] * c7
    mid = mu[8] * mid + mu[9] * out.double() + mu[10] * c0 + mu[11] * b
    close(mlps[10][0], rms(mid), "mlp input 10")
    close(after[10], mu[12] * mid + mu[13] * mlps[10][1].double(), 10)


def test_residual_wiring_by_hand(model, monkeypatch):
    """Every residual update of the spec in float64 from the model's own attention and MLP outputs:
    input stage, x0/bigram gates by lane, bf16 lambdas, the skip, the VE gates and aux_v, layer 10's
    μ0 … μ13, MUDD block 1 and the final norm."""
    m = copy.deepcopy(model)
    att, mlps = capture_sublayers(monkeypatch, m)
    x = tokens(13)
    with torch.no_grad():
        h = m(x, CU, WINDOWS, SCALE, dtype=F32)
        after = {i: r.double() for i, r in m.residuals(x, CU, WINDOWS, SCALE, dtype=F32).items()}
    p = {n: q.detach().double() for n, q in m.named_parameters()}
    bf = lambda v: v.to(torch.bfloat16).double()  # noqa: E731
    x0, b = input_stage_by_hand(m, p, x)
    gates = [generator_by_hand(p, "mudd_gate_", 0, x0, bf(m.mudd_gate_scale)),
             generator_by_hand(p, "mudd_gate_", 1, after[3], bf(m.mudd_gate_scale))]
    close(after[-1], x0 + gates[0][:, 19:20] * b, "cache0")
    for i in range(10):
        if i == 6:
            mid = after[5] + torch.sigmoid(p["scalars"][23]) * gates[1][:, 28:29] * after[3]
        else:
            a, aux, out = att[i]
            check_value_aux(p, i, a, aux, x)
            k, lane = X0_LANES[i]
            mid = bf(p["resid_lambdas"][i, 0]) * after[i - 1] + bf(p["post_lambdas"][i, 0]) * out.double()
            mid = mid + gates[k][:, lane : lane + 1] * x0 + (gates[k][:, lane + 1 : lane + 2] * b if i else 0)
        close(mlps[i][0], rms(mid), ("mlp input", i))
        close(after[i], bf(p["resid_lambdas"][i, 1]) * mid + bf(p["post_lambdas"][i, 1]) * mlps[i][1].double(), i)
    check_mudd_layer(p, after, att, mlps, b, x)
    nu = generator_by_hand(p, "mudd_", 1, after[10], 0.1)[:, :5].split(1, -1)
    ve0 = p["value_embeds"][x.long()]  # table 0, ungated
    final = after[10] + nu[0] * after[-1] + nu[1] * after[7] + nu[2] * after[9] + nu[3] * ve0 + nu[4] * after[3]
    close(h, rms(final), "output")


# ---------------------------------------------------------------- gradients


SPEC_UNUSED = {  # "Unresolved / ambiguous", plus the W = 8 pads
    "ve_gate_bank": [(4,)], "scalars": [(slice(12, 14),)], "resid_lambdas": [(6, 0), (10,)],
    "post_lambdas": [(6, 0), (10,)], "mudd_w2": [(1, slice(5, 14))], "mudd_b2": [(1, slice(5, 14))],
    "mudd_gate_w2": [(0, slice(26, 41))], "mudd_gate_b2": [(0, slice(26, 41))], "mlp_bank": [(11,)],
    "qk_bank": [(slice(60, 64),)], "vo_bank": [(slice(20, 24),)],
}


# Each index over the first dims must get some gradient (unless wholly unused): every entry of the
# small vectors, every bank matrix, every lane of the generators, every value table (dims as (5, V, d)).
UNIT_DIMS = {"scalars": 1, "resid_lambdas": 2, "post_lambdas": 2, "mudd_w2": 2, "mudd_b2": 2, "mudd_gate_w2": 2,
             "mudd_gate_b2": 2, "ve_gate_bank": 1, "qk_bank": 1, "vo_bank": 1, "mlp_bank": 2, "value_embeds": 1}


def unused_mask(p: torch.Tensor, entries: list[tuple]) -> torch.Tensor:
    mask = torch.zeros(p.shape, dtype=torch.bool)
    for entry in entries:
        mask[entry] = True
    return mask


def test_unused_parameters_get_zero_gradient_and_the_others_some(model):
    m = copy.deepcopy(model)
    declared = {}
    for name, entry in m.unused_entries():
        declared.setdefault(name, []).append(entry)
    assert declared.keys() == SPEC_UNUSED.keys()
    params = dict(m.named_parameters())
    for name, entries in SPEC_UNUSED.items():
        assert torch.equal(unused_mask(params[name], declared[name]), unused_mask(params[name], entries)), name
    x = tokens(10)
    targets = torch.cat((x[1:].long(), torch.tensor([3])))
    prefix = torch.tensor([-1] * 8 + [i % 8 for i in range(8, TINY.vocab)])
    loss = m.training_loss(x, targets, CU, WINDOWS, SCALE, [1.0, 0.5, 0.25], 0.25, prefix, dtype=F32)
    loss.backward()
    for name, p in params.items():
        assert p.grad is not None, name
        mask = unused_mask(p, SPEC_UNUSED.get(name, []))
        assert not p.grad[mask].any(), name
        grad, mask = p.grad, mask
        if name == "value_embeds":
            grad, mask = grad.view(5, TINY.vocab, -1), mask.view(5, TINY.vocab, -1)
        dims = UNIT_DIMS.get(name, 0)
        for unit in (torch.cartesian_prod(*(torch.arange(s) for s in grad.shape[:dims])).reshape(-1, dims).tolist()
                     if dims else [[]]):
            unit = tuple(unit)
            if not mask[unit].all():
                assert grad[unit][~mask[unit]].ne(0).any(), (name, unit)


# ---------------------------------------------------------------- casts and losses


def test_lambdas_and_gamma_act_rounded_to_bf16(model):
    """In a float32 forward, √1.1 and 1.046875 (its bf16) give the same function, as do γ = 0.1 and
    0.10009765625; the next bf16 value of either does not."""
    x = tokens(11)

    def run(resid: float, gamma: float) -> torch.Tensor:
        m = copy.deepcopy(model)
        with torch.no_grad():
            m.resid_lambdas.fill_(resid)
            m.mudd_gate_scale.fill_(gamma)
            return m(x, CU, WINDOWS, SCALE, dtype=F32)

    base = run(math.sqrt(1.1), 0.1)
    assert torch.equal(base, run(1.046875, 0.10009765625))
    assert not torch.allclose(base, run(1.0546875, 0.1), atol=1e-4)
    assert not torch.allclose(base, run(math.sqrt(1.1), 0.1005859375), atol=1e-4)


def test_tie_copies_the_head(model):
    m = copy.deepcopy(model)
    assert not torch.equal(m.embed, m.lm_head.T)  # randomised apart
    m.tie()
    assert m.tied and torch.equal(m.embed, m.lm_head.T)
    m.untie()
    assert not m.tied


def test_eval_loss_in_row_chunks_is_the_token_mean(model):
    x = tokens(12)
    targets = torch.cat((x[1:].long(), torch.tensor([0])))
    with torch.no_grad():
        whole = record_eval_loss(model.logits(model(x, CU, WINDOWS, SCALE, dtype=F32)), targets)
        chunked = model.eval_loss(x, targets, CU, WINDOWS, SCALE, dtype=F32, rows=16)  # 16 + 16 + 8 rows
    assert chunked.item() == pytest.approx(whole.item(), rel=1e-6)
    assert 0 < whole.item() < 2 * math.log(TINY.vocab)
