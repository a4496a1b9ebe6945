"""QK RMS-norm + rotary: the reference against the model's code, the fused Triton kernels against it.

The Triton kernels are checked on the CPU through Triton's interpreter, in a
subprocess started with TRITON_INTERPRET=1 (the variable is read when a kernel
is defined, so it must not leak into this process, where GPU tests may compile
the real kernel). Without Triton installed those tests skip.

Tolerances (|got - ref| <= bound, elementwise; m = |n1*cos| + |n2*sin| for the
first half of D and |n1*sin| + |n2*cos| for the second, the size of the terms
of the rotation, from the reference's normalised n):

* forward, float32, against the eager reference: 2^-20 * m (8 float32 ulps of
  the terms). The two differ only by float32 rounding: the order of the sum of
  squares, rsqrt, a possible FMA; y may cancel, so the bound follows m, not |y|.
* forward, bfloat16, against the eager reference: 2^-7 * (|ref| + m), and at
  most 0.1% of the elements differ at all. Both round n to bfloat16 before
  rotating; a float32 difference in 1/rms can move n across a rounding boundary
  (one bfloat16 ulp, <= 2^-7 |n|, moving y by <= 2^-7 m), then the final
  rounding may fall either way (one ulp of y). Under the interpreter the
  kernel is bit-identical to the eager code in practice.
* backward, against float64 autograd of the same math on the same inputs
  (no intermediate rounding, which is what the kernel's backward assumes):
  bfloat16: 2^-7 * |ref| + 1e-5 * max|ref|: the kernel rounds a float32 result
  once (<= 2^-8 |ref|, observed <= 0.5 ulp); the atol covers float32
  cancellation in r*dn - n*r*mean(dn*n), whose terms are of the size of
  max|ref|. (Eager bfloat16 autograd rounds dn to bfloat16 first and misses
  this bound by up to ~40x.) float32: 2^-20 * (|ref| + max|ref|); the kernel
  is observed within ~2^-23 max|ref|, eager float32 autograd within ~2^-22.
"""

import textwrap

import pytest
import torch
import torch.nn.functional as F

from interpreter_helpers import run_interpreted
from speedrun import qk_rotary as qr
from speedrun.config import ModelConfig
from speedrun.model import Attention, Rotary, rms_norm


def _qkv(B, T, H, D, dtype, scale=1.0, seed=0):
    """q, k as the model takes them: views into one (B, T, 3H, D) projection."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(B, T, 3 * H, D, generator=g) * scale).to(dtype).requires_grad_()
    q, k, _ = qkv.view(B, T, 3 * H, D).chunk(3, dim=-2)
    return qkv, q, k


def test_rms_norm_eps_is_float32_eps():
    """F.rms_norm (eps=None) uses float32's eps for bfloat16 and float32 inputs; the kernel uses rms_eps."""
    for dtype in (torch.bfloat16, torch.float32):
        assert qr.rms_eps(dtype) == torch.finfo(torch.float32).eps
        x = (torch.randn(64, 128) * 1e-4).to(dtype)  # mean(x^2) ~ 1e-8 < eps: eps matters
        xf = x.float()
        ms = xf.pow(2).mean(-1, keepdim=True)
        ours = (xf * torch.rsqrt(ms + qr.rms_eps(dtype))).to(dtype)
        bf16_eps = (xf * torch.rsqrt(ms + torch.finfo(torch.bfloat16).eps)).to(dtype)
        assert torch.equal(F.rms_norm(x, (128,)), ours)
        assert not torch.equal(F.rms_norm(x, (128,)), bf16_eps)


@pytest.mark.parametrize("kind", ["half_truncated", "full"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_impl_is_the_models_code(kind, dtype):
    """impl="torch": outputs and gradients bit-identical to rms_norm then Rotary.rotate of speedrun.model."""
    B, T, H, D = 2, 33, 3, 32
    rope = Rotary(D, kind).compute(torch.arange(T))
    qkv, q, k = _qkv(B, T, H, D, dtype)
    got = qr.qk_norm_rotary(q, k, *rope, impl="torch")
    expect = (Rotary.rotate(rms_norm(q), rope), Rotary.rotate(rms_norm(k), rope))
    g = torch.Generator().manual_seed(1)
    up = [torch.randn(B, T, H, D, generator=g).to(dtype) for _ in range(2)]
    (g_got,) = torch.autograd.grad(got, qkv, up)
    (g_expect,) = torch.autograd.grad(expect, qkv, up)
    for a, b in zip(got, expect):
        assert a.dtype == dtype and torch.equal(a, b)
    assert torch.equal(g_got, g_expect) and g_got.abs().sum() > 0


def test_torch_impl_matches_attention_project():
    """The q, k `Attention.project` returns, from the same projection, are the op's outputs (bit for bit)."""
    cfg = ModelConfig(model_dim=64, num_heads=2, head_dim=32)
    torch.manual_seed(0)
    att = Attention(cfg)
    with torch.no_grad():
        att.qkvo_w.normal_(0, 0.3)
    T = 21
    x = torch.randn(1, T, 64, dtype=torch.bfloat16, requires_grad=True)
    rope = Rotary(32, "half_truncated").compute(torch.arange(T))
    q_model, k_model, _ = att.project(x, None, torch.ones(2), rope)
    qkv = F.linear(x, att.qkvo_w[:3].flatten(end_dim=1).type_as(x))
    q, k, _ = qkv.view(1, T, 6, 32).chunk(3, dim=-2)
    q_op, k_op = qr.qk_norm_rotary(q, k, *rope, impl="torch")
    assert torch.equal(q_model, q_op) and torch.equal(k_model, k_op)
    up = torch.randn(1, T, 2, 32, dtype=torch.bfloat16)
    g_model = torch.autograd.grad((q_model * up).sum() + (k_model * up.flip(1)).sum(), (x, att.qkvo_w))
    g_op = torch.autograd.grad((q_op * up).sum() + (k_op * up.flip(1)).sum(), (x, att.qkvo_w))
    assert all(torch.equal(a, b) for a, b in zip(g_model, g_op))


def test_float64_reference_is_the_math_without_rounding():
    """reference_float64 = rotation of x * rsqrt(mean(x^2) + float32 eps), all in float64."""
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 7, 2, 32, generator=g) for _ in range(2))
    cos, sin = Rotary(32, "half_truncated").compute(torch.arange(7))
    got = qr.reference_float64(q, k, cos, sin)
    for x, y in zip((q, k), got):
        n = F.rms_norm(x.double(), (32,), eps=torch.finfo(torch.float32).eps)
        c, s = cos.double()[None, :, None, :], sin.double()[None, :, None, :]
        n1, n2 = n.chunk(2, -1)
        assert y.dtype == torch.float64
        torch.testing.assert_close(y, torch.cat((n1 * c + n2 * s, n2 * c - n1 * s), -1), rtol=1e-14, atol=1e-14)


def test_impl_choice():
    q = torch.zeros(1, 4, 2, 8)
    assert qr.pick_impl(q, "auto") == "torch"  # CPU tensor
    assert qr.pick_impl(q, "triton") == "triton" and qr.pick_impl(q, "torch") == "torch"
    with pytest.raises(ValueError):
        qr.pick_impl(q, "cuda")
    _, q, k = _qkv(1, 5, 2, 8, torch.float32)
    rope = Rotary(8, "full").compute(torch.arange(5))
    got, expect = qr.qk_norm_rotary(q, k, *rope), qr.reference(q, k, *rope)  # impl="auto" on a CPU
    assert all(torch.equal(a, b) for a, b in zip(got, expect))


def test_fake_outputs():
    """register_fake: contiguous (B, T, H, D) outputs in the input dtype, from strided views; no Triton needed."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        qkv = torch.empty(2, 7, 18, 128, dtype=torch.bfloat16)
        q, k, _ = qkv.chunk(3, dim=-2)
        cos = torch.empty(7, 64)
        outs = torch.ops.speedrun.qk_norm_rotary(q, k, cos, cos)
        grads = torch.ops.speedrun.qk_norm_rotary_backward(torch.empty(2, 7, 6, 128, dtype=torch.bfloat16),
                                                           torch.empty(2, 7, 6, 128, dtype=torch.bfloat16), q, k, cos, cos)
        for t in outs + grads:
            assert t.shape == (2, 7, 6, 128) and t.dtype == torch.bfloat16 and t.is_contiguous()


# --------------------------------------------------------------------------- Triton, interpreted on the CPU

_INTERPRETED = textwrap.dedent(r'''
    import json, os, sys, time
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch
    import torch.nn.functional as F
    from speedrun import qk_rotary as qr
    from speedrun.model import Rotary

    def term_size(x, cos, sin):
        """m: |n1 cos| + |n2 sin|, |n1 sin| + |n2 cos| from the reference's normalised (rounded) n."""
        n1, n2 = F.rms_norm(x, (x.size(-1),)).double().abs().chunk(2, -1)
        c, s = cos.double().abs()[None, :, None, :], sin.double().abs()[None, :, None, :]
        return torch.cat((n1 * c + n2 * s, n1 * s + n2 * c), -1)

    def case(dtype, B, T, H, D, block, scale=1.0, kind="half_truncated", seed=0, strided_table=False):
        g = torch.Generator().manual_seed(seed)
        qr.KERNEL_CONFIG.update(BLOCK_T=block, BLOCK_T_BWD=block)
        qkv = (torch.randn(B, T, 3 * H, D, generator=g) * scale).to(dtype)
        cos, sin = Rotary(D, kind).compute(torch.arange(T))
        if strided_table:  # non-contiguous tables: the first columns of wider ones
            cos, sin = torch.cat((cos, sin), 1)[:, : D // 2], torch.cat((sin, cos), 1)[:, : D // 2]
            assert not cos.is_contiguous()
        up = [torch.randn(B, T, H, D, generator=g).to(dtype) for _ in range(2)]
        leaf = qkv.clone().requires_grad_()
        q, k, _ = leaf.view(B, T, 3 * H, D).chunk(3, dim=-2)  # as Attention.project
        t0 = time.time()
        got = qr.qk_norm_rotary(q, k, cos, sin, impl="triton")
        (g_qkv,) = torch.autograd.grad(got, leaf, up)
        secs = time.time() - t0
        g_q, g_k, g_v = g_qkv.chunk(3, dim=-2)
        ref = qr.reference(q.detach(), k.detach(), cos, sin)
        q64 = q.detach().double().requires_grad_()
        k64 = k.detach().double().requires_grad_()
        ref_g = torch.autograd.grad(qr.reference_float64(q64, k64, cos, sin), (q64, k64), [u.double() for u in up])
        fwd_over, mismatch = 0.0, 0
        for x, a, b in zip((q, k), got, ref):
            d = (a.double() - b.double()).abs()
            m = term_size(x.detach(), cos, sin)
            tol = 2.0**-20 * m if dtype == torch.float32 else 2.0**-7 * (b.double().abs() + m)
            fwd_over = max(fwd_over, (d / tol).max().item())
            mismatch += (a != b).sum().item()
        bwd_over = 0.0
        for a, b in zip((g_q, g_k), ref_g):
            d = (a.double() - b).abs()
            top = b.abs().max()
            tol = 2.0**-7 * b.abs() + 1e-5 * top if dtype == torch.bfloat16 else 2.0**-20 * (b.abs() + top)
            bwd_over = max(bwd_over, (d / tol).max().item())
        ok_layout = all(t.dtype == dtype and t.shape == (B, T, H, D) and t.is_contiguous() for t in got)
        return dict(dtype=str(dtype), B=B, T=T, H=H, D=D, block=block, scale=scale, kind=kind,
                    strided_table=strided_table, fwd_over=fwd_over, mismatch_frac=mismatch / (2 * q.numel()),
                    bwd_over=bwd_over, v_grad_zero=bool((g_v == 0).all()), grad_dtype=str(g_qkv.dtype),
                    layout=ok_layout, finite=bool(all(torch.isfinite(t).all() for t in got) and torch.isfinite(g_qkv).all()),
                    secs=secs)

    out = {"cases": []}
    for dtype in (torch.float32, torch.bfloat16):
        out["cases"].append(case(dtype, 1, 37, 2, 32, 8))                     # small H/D, T = 4.6 blocks
        out["cases"].append(case(dtype, 1, 45, 6, 128, 16, seed=1))           # the record's H, D
        out["cases"].append(case(dtype, 2, 13, 6, 128, 4, seed=2, kind="full", strided_table=True))  # B = 2
        out["cases"].append(case(dtype, 1, 19, 3, 64, 32, scale=1e-4, seed=3))  # mean(x^2) < eps; one partial block

    # only q's output used: k's upstream gradient is None (treated as zero)
    qr.KERNEL_CONFIG.update(BLOCK_T=8, BLOCK_T_BWD=8)
    qkv = torch.randn(1, 10, 6, 32, requires_grad=True)
    q, k, _ = qkv.chunk(3, dim=-2)
    cos, sin = Rotary(32, "half_truncated").compute(torch.arange(10))
    yq, yk = qr.qk_norm_rotary(q, k, cos, sin, impl="triton")
    (g,) = torch.autograd.grad(yq.sum(), qkv)
    gq, gk, _ = g.chunk(3, dim=-2)
    (g_ref,) = torch.autograd.grad(qr.reference(q, k, cos, sin)[0].sum(), qkv)
    out["one_output"] = dict(k_grad_zero=bool((gk == 0).all()), q_grad_err=(g - g_ref).abs().max().item(),
                             q_grad_max=g_ref.abs().max().item())

    # torch.compile(fullgraph=True) of a projection + the op (a graph break would raise)
    def f(x, w, cos, sin, impl):
        B, T = x.shape[:2]
        qkv = F.linear(x, w)
        q, k, v = qkv.view(B, T, 9, 32).chunk(3, dim=-2)
        yq, yk = qr.qk_norm_rotary(q, k, cos, sin, impl=impl)
        return yq, yk, v

    torch.manual_seed(0)
    T = 24
    x = torch.randn(1, T, 48, requires_grad=True)
    w = (torch.randn(3 * 3 * 32, 48) * 0.2).requires_grad_()
    cos, sin = Rotary(32, "half_truncated").compute(torch.arange(T))
    up = [torch.randn(1, T, 3, 32) for _ in range(3)]
    t0 = time.time()
    got = torch.compile(f, fullgraph=True)(x, w, cos, sin, "triton")
    g_got = torch.autograd.grad(got, (x, w), up)
    secs = time.time() - t0
    eager = f(x, w, cos, sin, "triton")
    g_eager = torch.autograd.grad(eager, (x, w), up)
    ref = f(x, w, cos, sin, "torch")
    g_ref = torch.autograd.grad(ref, (x, w), up)
    rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()
    out["compiled"] = dict(fwd_vs_eager_op=max(rel(a, b) for a, b in zip(got, eager)),
                           grad_vs_eager_op=max(rel(a, b) for a, b in zip(g_got, g_eager)),
                           fwd_vs_reference=max(rel(a, b) for a, b in zip(got, ref)),
                           grad_vs_reference=max(rel(a, b) for a, b in zip(g_got, g_ref)), secs=secs)

    # the op's registrations (schema, fake vs real, autograd) as torch.library checks them
    qkv = torch.randn(1, 9, 6, 32, dtype=torch.bfloat16, requires_grad=True)
    q, k, _ = qkv.chunk(3, dim=-2)
    cos, sin = Rotary(32, "half_truncated").compute(torch.arange(9))
    checks = torch.library.opcheck(torch.ops.speedrun.qk_norm_rotary.default, (q, k, cos, sin),
                                   test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    gq = torch.randn(1, 9, 2, 32, dtype=torch.bfloat16)
    checks_bwd = torch.library.opcheck(torch.ops.speedrun.qk_norm_rotary_backward.default,
                                       (gq, gq.flip(1), q.detach(), k.detach(), cos, sin),
                                       test_utils=("test_schema", "test_faketensor"))
    out["opcheck"] = {"fwd": checks, "bwd": checks_bwd}
    print("RESULT " + json.dumps(out))  # read by interpreter_helpers.run_interpreted
''')


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED, timeout=600)


def test_interpreted_forward_matches_reference(interpreted):
    for case in interpreted["cases"]:
        label = {k: case[k] for k in ("dtype", "B", "T", "H", "D", "block", "scale", "kind")}
        assert case["finite"] and case["layout"], label
        assert case["fwd_over"] <= 1.0, (label, case)
        if case["dtype"] == "torch.bfloat16":
            assert case["mismatch_frac"] <= 1e-3, (label, case)


def test_interpreted_backward_matches_float64_autograd(interpreted):
    for case in interpreted["cases"]:
        label = {k: case[k] for k in ("dtype", "B", "T", "H", "D", "block", "scale", "kind")}
        assert case["bwd_over"] <= 1.0, (label, case)
        assert case["grad_dtype"] == case["dtype"] and case["v_grad_zero"], label
    one = interpreted["one_output"]
    assert one["k_grad_zero"] and one["q_grad_err"] <= 1e-6 * one["q_grad_max"], one


def test_interpreted_op_under_compile(interpreted):
    c = interpreted["compiled"]
    # the op is opaque to Inductor (same kernels); only the float32 projection around it may differ
    assert c["fwd_vs_eager_op"] < 1e-5 and c["grad_vs_eager_op"] < 1e-5, c
    assert c["fwd_vs_reference"] < 1e-5 and c["grad_vs_reference"] < 1e-5, c


def test_interpreted_op_registrations(interpreted):
    for name, result in interpreted["opcheck"].items():
        assert all(v == "SUCCESS" for v in result.values()), (name, result)


# --------------------------------------------------------------------------- on a GPU (the compiled kernels)


@pytest.mark.gpu
def test_gpu_kernel_matches_reference_at_record_shape(cuda):
    """bf16, H=6, D=128, views of a (1, T, 18, 128) projection as the model takes them: the forward
    within one bf16 rounding of the eager reference, the gradients as close to float64 as eager's."""
    from speedrun.model import Rotary
    from speedrun.qk_rotary import qk_norm_rotary, reference

    T, H, D = 4096 + 64, 6, 128
    g = torch.Generator(device=cuda).manual_seed(0)
    qkv = torch.randn(1, T, 3 * H, D, device=cuda, generator=g).to(torch.bfloat16)
    rot = Rotary(D, "half_truncated").to(cuda)
    cos, sin = rot.compute(torch.arange(T, device=cuda))
    gq, gk = (torch.randn(1, T, H, D, device=cuda, generator=g).to(torch.bfloat16) for _ in range(2))
    outs, grads = {}, {}
    for impl in ("triton", "torch", "float64"):
        x = qkv.double() if impl == "float64" else qkv
        x = x.clone().requires_grad_()
        q, k, _ = x.view(1, T, 3 * H, D).chunk(3, dim=-2)
        out = reference(q, k, cos.double(), sin.double()) if impl == "float64" else qk_norm_rotary(q, k, cos, sin, impl)
        (gx,) = torch.autograd.grad(out, x, (gq.to(x.dtype), gk.to(x.dtype)))
        outs[impl], grads[impl] = [o.double() for o in out], gx.double()
    # the normalised rows are O(1) (RMS 1, entries up to ~4): the two paths may round a normalised
    # entry one bf16 step apart (different rsqrt/summation order), and the rotation mixes two of them,
    # so the bound is one bf16 step of an entry below 4 (2^-6) plus one of the result
    for a, b in zip(outs["triton"], outs["torch"]):
        assert ((a - b).abs() <= 2.0**-7 * b.abs() + 2.0**-6).all(), (a - b).abs().max().item()
    err = lambda g: ((g - grads["float64"]).norm() / grads["float64"].norm()).item()
    assert err(grads["triton"]) <= 1.5 * err(grads["torch"]) + 1e-4, (err(grads["triton"]), err(grads["torch"]))


@pytest.mark.gpu
def test_gpu_model_loss_and_grads_same_with_either_kernel(cuda):
    """The compiled model (bf16, like training) with qk_kernel=triton against qk_kernel=torch."""
    from speedrun.config import AttentionConfig, ModelConfig
    from speedrun.model import GPT

    cfg = ModelConfig(num_layers=2, value_embeds=1, model_dim=768, num_heads=6, head_dim=128, mlp_hidden=512,
                      vocab_size=1000, no_attn_layers=(), long_layers=(0,), fp8_head=False)
    torch.manual_seed(0)
    model = GPT(cfg, AttentionConfig()).to(cuda)
    model.attention_backend = "flex"
    with torch.no_grad():  # non-zero output projections and head (zero-initialised), so gradients reach q and k
        for b in model.blocks:
            b.attn.qkvo_w[3].normal_(0, 0.02)
            b.mlp.proj_w.normal_(0, 0.02)
        model.head_w.normal_(0, 0.02)
    model.rotary.build_table(2048)
    tok = torch.randint(0, 1000, (2048,), device=cuda)
    results = {}
    for kernel in ("torch", "triton"):
        model.cfg.qk_kernel = kernel
        torch._dynamo.reset()
        loss = torch.compile(model, fullgraph=True)(tok, torch.roll(tok, -1), torch.tensor(4, device=cuda), torch.bfloat16)
        results[kernel] = (loss.float(), torch.autograd.grad(loss, [b.attn.qkvo_w for b in model.blocks]))
    assert abs(results["triton"][0].item() - results["torch"][0].item()) < 1e-2 * abs(results["torch"][0].item())
    for a, b in zip(results["triton"][1], results["torch"][1]):
        assert ((a.float() - b.float()).norm() / b.float().norm()).item() < 3e-2
