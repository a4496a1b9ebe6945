"""The ReLU² MLP's Triton products against the plain-PyTorch MLP, on the CPU (Triton's interpreter,
in a subprocess: see interpreter_helpers.py) and on the GPU at the record's size.

Triton 3.6's interpreter rounds float32 -> bfloat16 by truncation, not to nearest even as the GPU
does, so on the CPU the kernel is held to a float64 emulation of the reference's roundings with two
bfloat16 steps of slack; what the interpreter cannot change is checked exactly (zeros where h <= 0,
the no-grad forward equal to the training one, the compiled op equal to the eager op)."""

import textwrap

import pytest
import torch

from interpreter_helpers import run_interpreted
from speedrun.kernels import relu2_mlp as R

_INTERPRETED = textwrap.dedent(r'''
    import json, os, sys
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch
    from speedrun.kernels import relu2_mlp as R

    g = torch.Generator().manual_seed(0)
    N, D, F = 72, 64, 256   # 72 rows: the last row block (of 32) is partial
    x = torch.randn(N, D, generator=g).bfloat16()
    w1 = (torch.randn(F, D, generator=g) / 8).bfloat16()
    w2 = (torch.randn(D, F, generator=g) / 16).bfloat16()
    gy = torch.randn(N, D, generator=g).bfloat16()
    h64 = x.double() @ w1.double().T
    ga64 = gy.double() @ w2.double()
    negative = h64 < -1e-3  # clear of float32's summation error: h <= 0 in the kernel too

    def rel(a, b):
        return ((a.double() - b).abs().max() / b.abs().max()).item()

    cases = []
    base = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32}
    for extra in [{}, {"EPI_SPLIT": 1}, {"EPI_SPLIT": 4, "H_PTR": 0}, {"PERSISTENT": 0, "H_PTR": 1},
                  {"GROUP_M": 1, "EPI_SPLIT": 1, "PERSISTENT": 0}]:
        cfg = {d: dict(c, **base, **extra) for d, c in R.KERNEL_CONFIG.items()}
        a, gh = (torch.empty(N, F, dtype=torch.bfloat16) for _ in range(2))
        R.forward_product(x, w1, a, cfg["fwd"])
        R.backward_product(gy, w2, a, gh, cfg["bwd"])
        r = a.double().sqrt()  # relu(h) as the backward recovers it from a
        cases.append(dict(
            launch=extra,
            a_rel=rel(a, torch.relu(h64) ** 2), a_zero=bool((a[negative] == 0).all()),
            gh_rel=rel(gh, torch.where(r > 0, ga64 * 2 * r, 0.0)), gh_zero=bool((gh[a == 0] == 0).all()),
        ))

    # the op with autograd, eager and compiled, against the reference (float32 weights cast as the model does)
    xs = x.float().reshape(1, N, D).bfloat16().requires_grad_()
    w1s, w2s = w1.float().requires_grad_(), w2.float().requires_grad_()
    def mlp(xx, a_, b_, impl):
        return R.relu2_mlp(xx, a_.type_as(xx), b_.type_as(xx), impl)
    def run(fn):
        y = fn(xs, w1s, w2s)
        grads = torch.autograd.grad(y, (xs, w1s, w2s), gy.reshape(1, N, D))
        return y, grads
    y_k, g_k = run(lambda *t: mlp(*t, "triton"))
    y_r, g_r = run(lambda *t: mlp(*t, "torch"))
    y_c, g_c = run(torch.compile(lambda *t: mlp(*t, "triton"), fullgraph=True))
    saved = {str(want): [list(t.shape) for t in torch.ops.speedrun.relu2_mlp(x, w1, w2, want)[1:]]
             for want in (True, False)}
    with torch.no_grad():
        y_ng = mlp(xs, w1s, w2s, "triton")
    op = dict(
        y_rel=rel(y_k, y_r.double()), grad_rel=[rel(a, b.double()) for a, b in zip(g_k, g_r)],
        grad_dtypes=[str(t.dtype) for t in g_k], shape=list(y_k.shape),
        compiled_equal=bool(torch.equal(y_c, y_k)) and all(torch.equal(a, b) for a, b in zip(g_c, g_k)),
        nograd_equal=bool(torch.equal(y_ng, y_k)), saved=saved,
    )

    # the model passes its MLPs' impl down to the op: both layers' products on the kernel
    from speedrun.config import apply_overrides
    from speedrun.model.gpt import GPT, MLP
    from speedrun.recipes.presets import demo_2025_08 as demo
    calls = []
    real = R.forward_product, R.backward_product
    R.forward_product = lambda *a, **k: (calls.append("fwd"), real[0](*a, **k))[1]
    R.backward_product = lambda *a, **k: (calls.append("bwd"), real[1](*a, **k))[1]
    cfg = demo()
    apply_overrides(cfg, ["model.num_layers=2", "model.value_embeds=1", "model.model_dim=64",
                          "model.num_heads=2", "model.head_dim=32", "model.mlp_hidden=256",
                          "model.long_layers=0", "model.vocab_size=500"])
    torch.manual_seed(0)
    model = GPT(cfg.model, cfg.attention)
    for m in model.modules():
        if isinstance(m, MLP):
            m.impl = "triton"
    tok = torch.randint(0, 500, (128,))
    loss_k = model(tok, torch.roll(tok, -1), torch.tensor(2), dtype=torch.bfloat16)
    loss_k.backward()
    model.zero_grad()
    for m in model.modules():
        if isinstance(m, MLP):
            m.impl = "torch"
    loss_r = model(tok, torch.roll(tok, -1), torch.tensor(2), dtype=torch.bfloat16)
    R.forward_product, R.backward_product = real
    model_case = dict(calls=calls, loss_k=loss_k.item(), loss_r=loss_r.item())
    print("RESULT " + json.dumps(dict(cases=cases, op=op, model=model_case)))
''')


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED)


def test_interpreted_products_and_epilogues(interpreted):
    slack = 2 * 2 ** -8  # two bfloat16 steps (the interpreter truncates)
    assert len(interpreted["cases"]) == 5
    for case in interpreted["cases"]:
        assert case["a_rel"] < slack and case["a_zero"], case
        # relu(h) recovered from a: the interpreter truncates the root's rounding too, hence the slack
        assert case["gh_rel"] < 3 * slack and case["gh_zero"], case


def test_interpreted_op_matches_reference(interpreted):
    op = interpreted["op"]
    assert op["shape"] == [1, 72, 64]
    assert op["grad_dtypes"] == ["torch.bfloat16", "torch.float32", "torch.float32"]
    assert op["y_rel"] < 0.03 and max(op["grad_rel"]) < 0.03, op
    assert op["compiled_equal"] and op["nograd_equal"], op
    # the forward saves a alone (relu(h) recovered from it), nothing without a gradient
    assert op["saved"] == {"True": [[72, 256]], "False": [[0]]}, op["saved"]


def test_relu_recovered_from_its_square_exactly():
    """FROM_A's premise, for every positive bfloat16 r: a = bf16(r²) (float32 square, one rounding, as the
    reference and the kernel compute it) gives back r = bf16(sqrt(a)) exactly wherever r² is a normal
    finite bfloat16, i.e. 2⁻⁶³ <= r < 2⁶⁴, even from a root off by 2⁻¹¹ relative (the kernels use the
    approximate square root, relative error ~2⁻²²); outside that range it does not hold."""
    r = torch.arange(1, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)  # 0 < r < inf
    a = (r.float() * r.float()).bfloat16()
    inside = torch.isfinite(a.float()) & (a.float() >= 2.0 ** -126)
    assert r[inside].float().min().item() == 2.0 ** -63
    assert r[inside].float().max().item() == (2 - 2 ** -7) * 2.0 ** 63
    root = a[inside].float().sqrt()
    for scale in (1.0, 1 - 2 ** -11, 1 + 2 ** -11):
        assert torch.equal((root * scale).bfloat16(), r[inside]), scale
    assert not torch.equal(a[~inside].float().sqrt().bfloat16(), r[~inside])
    zero = torch.zeros(1, dtype=torch.bfloat16)
    assert (zero.float() * zero.float()).bfloat16().float().sqrt().item() == 0.0


def test_model_reaches_the_kernels(interpreted):
    m = interpreted["model"]
    # two layers: both forwards' products, then both backwards'
    assert m["calls"] == ["fwd", "fwd", "bwd", "bwd"], m
    assert abs(m["loss_k"] - m["loss_r"]) < 0.02 * abs(m["loss_r"]), m


def test_choice_and_validation():
    x, w1, w2 = torch.zeros(4, 16), torch.zeros(32, 16), torch.zeros(16, 32)
    assert R.pick(x, w1, w2, "auto") == "torch"  # CPU tensors
    assert R.pick(x.bfloat16(), w1.bfloat16(), w2.bfloat16(), "triton") == "triton"
    with pytest.raises(ValueError, match="impl=triton"):
        R.pick(x, w1, w2, "triton")  # float32
    with pytest.raises(ValueError, match="impl=triton"):
        R.pick(x[:, :12].bfloat16(), w1[:, :12].bfloat16(), w2[:12].bfloat16(), "triton")  # 12 % 8
    assert torch.equal(R.relu2_mlp(x, w1, w2), R.reference(x, w1, w2))


@pytest.mark.gpu
def test_gpu_kernel_at_record_size(cuda):
    """One layer of one micro-step: 49,152 tokens, 768 -> 3,072. The products sum in another order
    than cuBLAS, so a few bfloat16 values differ by a step; the ReLU² parts are exact given h."""
    pytest.importorskip("triton")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the kernel needs compute capability 9.0+")
    torch.manual_seed(0)
    M, D, F = 49152, 768, 3072
    x = torch.nn.functional.rms_norm(torch.randn(M, D, device="cuda"), (D,)).bfloat16().requires_grad_()
    w1 = ((torch.rand(F, D, device="cuda") * 2 - 1) * D ** -0.5).requires_grad_()
    w2 = ((torch.rand(D, F, device="cuda") * 2 - 1) * F ** -0.5).requires_grad_()
    gy = (torch.randn(M, D, device="cuda") * 1e-3).bfloat16()

    def grads(impl):
        y = R.relu2_mlp(x, w1.type_as(x), w2.type_as(x), impl)
        return (y, *torch.autograd.grad(y, (x, w1, w2), gy))

    for got, ref in zip(grads("triton"), grads("torch")):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        rel = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        assert rel < 1e-2, rel
        assert (got != ref).float().mean().item() < 0.2

    h_ref = x.detach() @ w1.bfloat16().T
    a = torch.empty_like(h_ref)
    R.forward_product(x.detach(), w1.bfloat16().detach(), a)
    assert ((a.float() - torch.relu(h_ref).square().float()).abs()
            <= torch.relu(h_ref).square().float() * 2 ** -6 + 1e-6).all()
    assert (a[h_ref < -1e-2] == 0).all()
    gh = torch.empty_like(a)
    R.backward_product(gy, w2.bfloat16().detach(), a, gh)
    r = a.float().sqrt().bfloat16().float()  # relu(h) as recovered from a, exactly (test above)
    ga = (gy @ w2.bfloat16().detach()).float()
    want = torch.where(r > 0, ga * 2 * r, 0.0)
    assert (gh[a == 0] == 0).all()
    assert ((gh.float() - want).abs() <= want.abs() * 2 ** -7 + 1e-9).all()
    if R.use_gluon(x.device):  # the backward the op runs on this GPU: g bit for bit
        from speedrun.kernels import relu2_gluon as G
        gh_gluon = torch.empty_like(gh)
        G.launch(gy, w2.bfloat16().detach(), a, gh_gluon)
        assert torch.equal(gh_gluon, gh)
