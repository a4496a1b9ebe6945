"""Embedding lookups and their gradients in one sorted pass: the op against index_add in float64, the
model's gradients with either implementation, the op's registrations.

The Triton kernels run on the CPU through Triton's interpreter, in a subprocess
(interpreter_helpers). Two kinds of check:

* exact: integer-valued gradients (|g| <= 4) whose every sum is a small
  integer, exactly representable in bfloat16 and float32, so the kernel's rows
  must equal index_add's bit for bit. A row counted twice or missed (a run cut
  at a chunk boundary, a chain walked too far or not far enough) shows.
* rounding: random gradients against float64, |got - ref| <= 2^-8 |ref| +
  2^-18 S in bfloat16 (one round-to-nearest of a float32 sum; S = the sum of
  the terms' magnitudes bounds float32's error), 2^-18 S in float32.

Token patterns: uniform over a small and a large vocabulary, a single token
(one run across every chunk), heavy-tailed (runs of every length), N not a
multiple of the chunk, D not a multiple of the column block.
"""

import textwrap

import pytest
import torch

from interpreter_helpers import run_interpreted
from model_helpers import assert_field_validated
from speedrun.kernels import embeddings as E


def test_reference_is_the_plain_lookups():
    tok = torch.tensor([3, 0, 3, 1])
    tables = [torch.randn(5, 4) for _ in range(2)]
    for got, w in zip(E.reference(tok, tables), tables):
        assert torch.equal(got, w[tok])


def test_config_field_validated():
    assert_field_validated("model.embed_kernel", "torch", "fast")


def test_impl_choice():
    tok = torch.tensor([1, 2])
    tables = [torch.zeros(4, 8, dtype=torch.bfloat16)] * 2
    assert E.pick(tok, tables, "auto") == "torch"  # CPU tensors: the reference
    assert E.pick(tok, tables, "torch") == "torch"
    if E.TRITON_FOUND:
        assert E.pick(tok, tables, "triton") == "triton"
    mixed = [torch.zeros(4, 8), torch.zeros(4, 9)]
    assert not E.supported(tok, mixed)
    assert not E.supported(tok, [torch.zeros(4, 8, dtype=torch.float16)])
    assert not E.supported(tok.float(), tables)
    with pytest.raises(ValueError, match="model.embed_kernel=triton"):
        E.pick(tok, mixed, "triton")
    with pytest.raises(ValueError, match="kernel impl"):
        E.pick(tok, tables, "fast")


def test_op_refuses_bad_input():
    tok = torch.tensor([0, 1, 2])
    g = torch.zeros(3, 4)
    cases = [
        (tok[None], [g], 5, "tokens must be 1-D"),
        (tok.float(), [g], 5, "tokens must be 1-D integers"),
        (tok, [], 5, "no gradients"),
        (tok, [g, torch.zeros(3, 5)], 5, "gradients must all be"),
        (tok, [torch.zeros(2, 4)], 5, "gradients must all be"),
        (tok, [g.half()], 5, "dtype must be"),
        (tok, [g], 0, "num_rows"),
    ]
    for t, grads, rows, msg in cases:
        with pytest.raises(ValueError, match=msg):
            torch.ops.speedrun.embedding_backward(t, grads, rows)


def test_fake_outputs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        outs = torch.ops.speedrun.embedding_backward(torch.zeros(6, dtype=torch.long),
                                                     [torch.zeros(6, 8, dtype=torch.bfloat16)] * 3, 11)
    assert [(tuple(o.shape), o.dtype) for o in outs] == [((11, 8), torch.bfloat16)] * 3


_INTERPRETED = textwrap.dedent(r"""
    import json, sys
    import torch
    sys.path.insert(0, "tests")
    from speedrun.kernels import embeddings as E

    def tokens(kind, n, v, gen):
        if kind == "uniform":
            return torch.randint(0, v, (n,), generator=gen)
        if kind == "single":
            return torch.full((n,), v - 1, dtype=torch.long)
        # heavy-tailed: token k with weight 1/(k+1)^1.5, so runs of every length
        w = 1.0 / torch.arange(1, v + 1, dtype=torch.float64) ** 1.5
        return torch.multinomial(w, n, replacement=True, generator=gen)

    CASES = [  # (kind, N, V, D, CHUNK, BLOCK_D)
        ("uniform", 203, 9, 40, 8, 16),     # N % C != 0, D % BLOCK_D != 0, chains of a few chunks
        ("uniform", 64, 500, 16, 16, 16),   # mostly distinct tokens, many absent rows
        ("single", 90, 7, 24, 8, 16),       # one run over every chunk
        ("heavy", 256, 40, 32, 16, 32),
        ("heavy", 61, 13, 8, 4, 8),
        ("uniform", 1, 5, 8, 4, 8),
        ("uniform", 100, 50304, 8, 16, 8),  # tokens past 32,767: int16 keys wrap, rows must not
        ("heavy", 100, 70000, 8, 16, 8),    # more than 65,535 rows: int32 keys
    ]
    out = {"exact": [], "rounding": [], "absent_zero": [], "absent_rows": 0, "deterministic": [], "chains": 0}
    gen = torch.Generator().manual_seed(0)
    for kind, n, v, d, c, bd in CASES:
        tok = tokens(kind, n, v, gen)
        st, order = E.sort_keys(tok, v)
        cfg = {"CHUNK": c, "BLOCK_D": bd}
        ends = torch.arange(c, max(n, c), c)
        out["chains"] += int((st[ends - 1] == st[ends]).sum())
        for dtype in (torch.bfloat16, torch.float32):
            gi = torch.randint(-4, 5, (n, d), generator=gen).to(dtype)
            got = torch.zeros(v, d, dtype=dtype)
            E.launch(st, order, [gi], [got], cfg)
            ref = torch.zeros(v, d, dtype=dtype).index_add_(0, tok, gi)
            out["exact"].append([kind, str(dtype), bool(torch.equal(got, ref))])

            g = torch.randn(n, d, generator=gen).to(dtype)
            got, again, alone = (torch.zeros(v, d, dtype=dtype) for _ in range(3))
            E.launch(st, order, [g, g], [got, again], cfg)  # two tables in one launch: the same sums
            E.launch(st, order, [g], [alone], cfg)
            ref = torch.zeros(v, d, dtype=torch.float64).index_add_(0, tok, g.double())
            s = torch.zeros(v, d, dtype=torch.float64).index_add_(0, tok, g.double().abs())
            bound = (2 ** -8 * ref.abs() if dtype == torch.bfloat16 else 0) + 2 ** -18 * s
            excess = ((got.double() - ref).abs() - bound).max().item()
            out["rounding"].append([kind, str(dtype), excess])
            absent = torch.ones(v, dtype=torch.bool)
            absent[tok] = False
            out["absent_rows"] += int(absent.sum())
            out["absent_zero"].append(bool((got[absent] == 0).all()))
            out["deterministic"].append(bool(torch.equal(got, again) and torch.equal(got, alone)))

    out["key_dtypes"] = [str(E.sort_keys(torch.zeros(3, dtype=torch.long), v)[0].dtype) for v in (65535, 65536)]

    # the op: more tables than one launch takes, the default launch
    tok = tokens("heavy", 300, 50, gen)
    grads = [torch.randn(300, 24, generator=gen).to(torch.bfloat16) for _ in range(E.MAX_TABLES + 2)]
    op = torch.ops.speedrun.embedding_backward(tok, grads, 50)
    out["op"] = [((o.double() - torch.zeros(50, 24, dtype=torch.float64).index_add_(0, tok, g.double())).abs()
                  - 2 ** -8 * torch.zeros(50, 24, dtype=torch.float64).index_add_(0, tok, g.double()).abs()
                  - 1e-6).max().item() for o, g in zip(op, grads)]
    torch.library.opcheck(torch.ops.speedrun.embedding_backward.default,
                          (tok[:40], [g[:40].float() for g in grads], 50))
    out["opcheck"] = True

    # the model: loss and gradients with either implementation, eager and compiled (fullgraph)
    from model_helpers import random_tiny_model
    model, cfg = random_tiny_model()
    model.train()
    t = torch.randint(0, 60, (256,), generator=gen)
    y = torch.randint(0, 60, (256,), generator=gen)
    win = torch.tensor(2)
    calls = {"n": 0}
    real = E.launch
    def counted(*a, **k):
        calls["n"] += 1
        return real(*a, **k)
    E.launch = counted
    def run(impl, compiled):
        model.cfg.embed_kernel = impl
        model.zero_grad()
        f = torch.compile(model, fullgraph=True, backend="aot_eager") if compiled else model
        loss = f(t, y, win)
        loss.backward()
        return loss.item(), {n: p.grad.double().clone() for n, p in model.named_parameters()}
    l0, g0 = run("torch", False)
    l1, g1 = run("triton", False)
    out["model_launches"] = calls["n"]
    l2, g2 = run("triton", True)
    out["model_loss"] = [l0, l1, l2]
    out["model_grads"] = {n: [(g1[n] - g0[n]).abs().max().item(), (g2[n] - g0[n]).abs().max().item(),
                              g0[n].abs().max().item()] for n in g0}
    print("RESULT " + json.dumps(out))  # read by interpreter_helpers.run_interpreted
""")


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED, timeout=600)


def test_interpreted_sums_are_exact_on_integers(interpreted):
    assert interpreted["chains"] > 20  # the cases do cross chunk boundaries, in runs of several chunks
    assert all(ok for _, _, ok in interpreted["exact"]), interpreted["exact"]


def test_interpreted_rounding_within_one_step(interpreted):
    assert all(excess <= 0 for _, _, excess in interpreted["rounding"]), interpreted["rounding"]
    assert interpreted["absent_rows"] > 100 and all(interpreted["absent_zero"])
    assert all(interpreted["deterministic"])


def test_interpreted_op_and_registrations(interpreted):
    assert len(interpreted["op"]) == 6 and all(e <= 0 for e in interpreted["op"]), interpreted["op"]
    assert interpreted["key_dtypes"] == ["torch.int16", "torch.int32"]
    assert interpreted["opcheck"]


def test_interpreted_model_same_loss_and_grads(interpreted):
    assert interpreted["model_launches"] == 1  # the model reached the kernel: its three tables in one launch
    l0, l1, l2 = interpreted["model_loss"]
    assert l1 == l0 and abs(l2 - l0) <= 1e-4 * abs(l0)
    for name, (eager, compiled, size) in interpreted["model_grads"].items():
        assert eager <= 1e-6 * max(size, 1.0), (name, eager, size)
        assert compiled <= 2e-3 * max(size, 1.0), (name, compiled, size)


@pytest.mark.gpu
def test_gpu_record_shape_against_float64(cuda):
    pytest.importorskip("triton")
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, v, d = 49152, 50304, 768
    w = 1.0 / torch.arange(1, v + 1, dtype=torch.float64, device="cuda") ** 1.1  # Zipf-like: long runs
    tok = torch.multinomial(w, n, replacement=True, generator=gen)
    grads = [torch.randn(n, d, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(4)]
    outs = torch.ops.speedrun.embedding_backward(tok, grads, v)
    again = torch.ops.speedrun.embedding_backward(tok, grads, v)
    for g, o, o2 in zip(grads, outs, again):
        ref = torch.zeros(v, d, dtype=torch.float64, device="cuda").index_add_(0, tok, g.double())
        s = torch.zeros(v, d, dtype=torch.float64, device="cuda").index_add_(0, tok, g.double().abs())
        assert ((o.double() - ref).abs() <= 2 ** -8 * ref.abs() + 2 ** -18 * s).all()
        assert torch.equal(o, o2)  # deterministic
        inductor = torch.compile(lambda gg: torch.zeros(v, d, dtype=torch.float32, device="cuda")
                                 .index_add_(0, tok, gg.float()).to(torch.bfloat16))(g)
        assert (o != inductor).float().mean().item() < 1e-2  # the reference's rounding, up to summation order
