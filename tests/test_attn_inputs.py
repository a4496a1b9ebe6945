"""The attention's inputs (QK RMS-norm + rotary, value mixing): the reference against the model's code,
the fused Triton kernels against the reference and against float64.

The Triton kernels are checked on the CPU through Triton's interpreter, in a
subprocess started with TRITON_INTERPRET=1 (the variable is read when a kernel
is defined, so it must not leak into this process, where GPU tests may compile
the real kernels). Without Triton installed those tests skip.

The kernel computes what the *compiled* reference computes: float32 throughout
and one rounding per output (it does not round rms_norm's output to the input
dtype before rotating, as eager `reference` does, and keeps λ in float32).

Tolerances (|got - ref| <= bound, elementwise). m is the size of the terms of
each output: for q, k, m = |n1*cos| + |n2*sin| in the first half of D and
|n1*sin| + |n2*cos| in the second (n the float64 normalised rows); for v,
m = |λ0*v| + |λ1*ve|.

* forward, float32, against the eager reference and against float64:
  2^-20 * m (8 float32 ulps of the terms). Only float32 rounding differs: the
  order of the sum of squares, rsqrt, a possible FMA; y may cancel, so the
  bound follows m, not |y|.
* forward, bfloat16, against the eager reference: 2^-7 * (|ref| + m). Eager
  rounds n (and λ0*v, λ1*ve) to bfloat16 before combining them (<= 2^-8 of
  each term, so 2^-8 m), then both round the result (<= 2^-8 |y| each).
* forward, bfloat16, against float64 (the exact math on the same inputs):
  2^-8 * |ref| + 2^-20 * m: one round-to-nearest of a float32 result. A
  truncating conversion (the interpreter's own, see attn_inputs._emulate_rne)
  is off by up to 2^-7 |ref| and fails this.
* backward, against float64 autograd of the same math on the same inputs
  (no intermediate rounding, which is what the kernel's backward assumes),
  per block of columns (q, k, v of d_qkv; d_ve):
  bfloat16: 2^-7 * |ref| + 1e-5 * max|ref|: the kernel rounds a float32 result
  once (<= 2^-8 |ref|); the atol covers float32 cancellation in
  r*dn - n*r*mean(dn*n), whose terms are of the size of max|ref|.
  float32: 2^-20 * (|ref| + max|ref|).
* d_λ (float32 in both dtypes: sums of float32 products of the inputs):
  1e-5 * S, S = (sum |g*v|, sum |g*ve|) in float64, the size of the terms
  summed (84 times float32's eps; a dropped or swapped term, or a row block
  missing from the sum, is off by far more). Without ve, d_λ1 must be 0.
"""

import textwrap

import pytest
import torch
import torch.nn.functional as F

from interpreter_helpers import run_interpreted
from speedrun.kernels import attn_inputs as ai
from speedrun.config import MASK_BLOCK, ModelConfig
from speedrun.model.gpt import Attention, Rotary

LAMBDAS = (0.625, -0.4375)  # neither 0 nor 1: a dropped, swapped or doubled λ term shows


def _inputs(B, T, H, D, dtype, with_ve=True, scale=1.0, seed=0):
    """qkv (B, T, 3HD), ve (B, T, HD) or None, lambdas (2,) float32: leaves requiring grad."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(B, T, 3 * H * D, generator=g) * scale).to(dtype).requires_grad_()
    ve = torch.randn(B, T, H * D, generator=g).to(dtype).requires_grad_() if with_ve else None
    return qkv, ve, torch.tensor(LAMBDAS, requires_grad=True)


def test_rms_norm_eps_is_float32_eps():
    """F.rms_norm (eps=None) uses float32's eps for bfloat16 and float32 inputs; the kernel uses rms_eps."""
    for dtype in (torch.bfloat16, torch.float32):
        assert ai.rms_eps(dtype) == torch.finfo(torch.float32).eps
        x = (torch.randn(64, 128) * 1e-4).to(dtype)  # mean(x^2) ~ 1e-8 < eps: eps matters
        xf = x.float()
        ms = xf.pow(2).mean(-1, keepdim=True)
        ours = (xf * torch.rsqrt(ms + ai.rms_eps(dtype))).to(dtype)
        bf16_eps = (xf * torch.rsqrt(ms + torch.finfo(torch.bfloat16).eps)).to(dtype)
        assert torch.equal(F.rms_norm(x, (128,)), ours)
        assert not torch.equal(F.rms_norm(x, (128,)), bf16_eps)
    assert ai.rms_eps(torch.float64) == torch.finfo(torch.float64).eps


@pytest.mark.parametrize("with_ve", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_torch_impl_is_attention_project(dtype, with_ve):
    """impl="torch": q, k, v and the gradients wrt x, the qkvo weight, ve and λ bit-identical to
    `Attention.project` (QK norm, rotary, value embeddings on; the reference), with and without ve."""
    cfg = ModelConfig(model_dim=64, num_heads=2, head_dim=32, value_embeds=1)
    torch.manual_seed(0)
    att = Attention(cfg, "torch")
    with torch.no_grad():
        att.qkvo_w.normal_(0, 0.3)
    B, T, H, D = 2, 21, 2, 32
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, 64, generator=g).to(dtype).requires_grad_()
    ve = torch.randn(B, T, H * D, generator=g).to(dtype).requires_grad_() if with_ve else None
    lam = torch.tensor(LAMBDAS, requires_grad=True)
    rope = Rotary(D, "half_truncated").compute(torch.arange(T))
    got_model = att.project(x, ve, lam, rope)
    qkv = F.linear(x, att.qkvo_w[:3].flatten(end_dim=1).type_as(x))
    got_op = ai.attention_inputs(qkv, ve, lam, *rope, H, impl="torch")
    for a, b in zip(got_model, got_op):
        assert a.shape == (B, T, H, D) and a.dtype == dtype and torch.equal(a, b)
    up = [torch.randn(B, T, H, D, generator=g).to(dtype) for _ in range(3)]
    wrt = (x, att.qkvo_w, lam) + ((ve,) if with_ve else ())
    g_model = torch.autograd.grad(got_model, wrt, up)
    g_op = torch.autograd.grad(got_op, wrt, up)
    for a, b in zip(g_model, g_op):
        assert torch.equal(a, b) and a.abs().sum() > 0
    assert (g_op[2][1] != 0) == with_ve  # λ1 is used exactly when there is a value embedding


def test_float64_reference_is_the_math_without_rounding():
    """reference_float64: rotation of x * rsqrt(mean(x^2) + float32 eps) and λ0 v + λ1 ve, all in float64."""
    B, T, H, D = 2, 7, 2, 32
    qkv, ve, lam = (t.detach() for t in _inputs(B, T, H, D, torch.float32, seed=3))
    cos, sin = Rotary(D, "half_truncated").compute(torch.arange(T))
    q, k, v = (t.double() for t in qkv.view(B, T, 3 * H, D).chunk(3, dim=-2))
    c, s = cos.double()[None, :, None, :], sin.double()[None, :, None, :]
    lam64 = lam.double()
    for e in (ve, None):
        got = ai.reference_float64(qkv, e, lam, cos, sin, H)
        assert all(t.dtype == torch.float64 and t.shape == (B, T, H, D) for t in got)
        for x, y in zip((q, k), got[:2]):
            n1, n2 = F.rms_norm(x, (D,), eps=torch.finfo(torch.float32).eps).chunk(2, -1)
            torch.testing.assert_close(y, torch.cat((n1 * c + n2 * s, n2 * c - n1 * s), -1), rtol=1e-14, atol=1e-14)
        v_expect = lam64[0] * v + (lam64[1] * e.double().view(B, T, H, D) if e is not None else 0)
        torch.testing.assert_close(got[2], v_expect, rtol=1e-14, atol=1e-14)
    # and no rounding on the way: the float32 eager reference differs from it (by float32 rounding only)
    ref32 = ai.reference(qkv, ve, lam, cos, sin, H)
    got = ai.reference_float64(qkv, ve, lam, cos, sin, H)
    assert any(not torch.equal(a.double(), b) for a, b in zip(ref32, got))
    assert all(torch.allclose(a.double(), b, rtol=1e-5, atol=1e-6) for a, b in zip(ref32, got))


def test_impl_choice():
    qkv, ve, lam = _inputs(1, 5, 2, 8, torch.float32)
    assert ai.pick_impl(qkv, "auto") == "torch"  # CPU tensor
    assert ai.pick_impl(qkv, "triton") == "triton" and ai.pick_impl(qkv, "torch") == "torch"
    with pytest.raises(ValueError):
        ai.pick_impl(qkv, "cuda")
    rope = Rotary(8, "full").compute(torch.arange(5))
    with pytest.raises(ValueError):
        ai.attention_inputs(qkv, ve, lam, *rope, 2, impl="cuda")
    for e in (ve, None):
        got, expect = ai.attention_inputs(qkv, e, lam, *rope, 2), ai.reference(qkv, e, lam, *rope, 2)  # auto, CPU
        assert all(torch.equal(a, b) for a, b in zip(got, expect))


def test_kernel_refuses_what_it_cannot_do():
    """The ops' input checks (pure Python, before any launch)."""
    N, H, D = 6, 2, 32
    qkv, ve, lam, tab = torch.zeros(N, 3 * H * D), torch.zeros(N, H * D), torch.zeros(2), torch.zeros(N, D // 2)
    assert ai._check(qkv, ve, lam, tab, tab, H) == D and ai._check(qkv, None, lam, tab, tab, H) == D
    bad = [
        (qkv.half(), ve, lam, tab, tab, H),                                   # dtype
        (torch.zeros(N, 3 * H * 24), None, lam, torch.zeros(N, 12), torch.zeros(N, 12), H),  # D/2 = 12
        (qkv, ve, lam, tab, tab, 5),                                          # width not 3*H*D
        (qkv, ve, lam, torch.zeros(N + 1, D // 2), tab, H),                   # table rows
        (qkv, ve, lam, tab, torch.zeros(N, D), H),                            # table width
        (qkv, ve[:, :-2], lam, tab, tab, H),                                  # ve shape
        (qkv, ve.bfloat16(), lam, tab, tab, H),                               # ve dtype
        (qkv, ve, lam.bfloat16(), tab, tab, H),                               # λ dtype
        (qkv, ve, torch.zeros(3), tab, tab, H),                               # λ shape
    ]
    for args in bad:
        with pytest.raises(ValueError):
            ai._check(*args)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fake_outputs(dtype):
    """register_fake: q, k, v (N, H, D) contiguous in the input dtype, from a strided projection; the
    backward's d_qkv like qkv, d_ve like ve (or (0,)), the λ partials (blocks, 2) float32. No Triton
    needed."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    N, H, D = 14, 6, 128
    with FakeTensorMode():
        qkv = torch.empty(N, 3 * H * D + 64, dtype=dtype)[:, : 3 * H * D]  # a strided view
        lam, cos = torch.empty(2), torch.empty(N, D // 2)
        g = torch.empty(N, H, D, dtype=dtype)
        for ve in (torch.empty(N, H * D, dtype=dtype), None):
            outs = torch.ops.speedrun.attn_inputs(qkv, ve, lam, cos, cos, H)
            assert len(outs) == 3
            for t in outs:
                assert t.shape == (N, H, D) and t.dtype == dtype and t.is_contiguous()
            d_qkv, d_ve, parts = torch.ops.speedrun.attn_inputs_backward(g, g, g, qkv, ve, lam, cos, cos, H)
            assert d_qkv.shape == qkv.shape and d_qkv.dtype == dtype
            assert d_ve.shape == ((N, H * D) if ve is not None else (0,)) and d_ve.dtype == dtype
            assert parts.shape == (ai.lambda_blocks(N, H), 2) and parts.dtype == torch.float32


# --------------------------------------------------------------------------- Triton, interpreted on the CPU

_INTERPRETED = textwrap.dedent(r'''
    import json, os, sys, time
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch
    import torch.nn.functional as F
    from speedrun.kernels import attn_inputs as ai
    from speedrun.model.gpt import Rotary

    LAMBDAS = (0.625, -0.4375)
    EPS = torch.finfo(torch.float32).eps

    def qk_term_size(x, cos, sin):
        """m for q or k: |n1 cos| + |n2 sin|, |n1 sin| + |n2 cos| of the float64 normalised rows."""
        x = x.double()
        n1, n2 = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)).abs().chunk(2, -1)
        c, s = cos.double().abs()[None, :, None, :], sin.double().abs()[None, :, None, :]
        return torch.cat((n1 * c + n2 * s, n1 * s + n2 * c), -1)

    def upstream(B, T, H, D, dtype, layout, g):
        """An upstream gradient (B, T, H, D), possibly a strided view (the kernel takes its strides)."""
        if layout == "transposed":  # as attention's transpose(1, 2) hands it back: head stride T*D
            return torch.randn(B, H, T, D, generator=g).to(dtype).transpose(1, 2)
        if layout == "sliced":  # rows of a wider tensor: token stride 2HD, head stride 2D
            return torch.randn(B, T, H, 2 * D, generator=g).to(dtype)[..., :D]
        if layout == "last_strided":  # last stride 2: copied before the launch
            return torch.randn(B, T, H, D, 2, generator=g).to(dtype)[..., 0]
        return torch.randn(B, T, H, D, generator=g).to(dtype)

    def case(dtype, B, T, H, D, block, block_bwd, with_ve=True, scale=1.0, kind="half_truncated", seed=0,
             grads="contiguous"):
        g = torch.Generator().manual_seed(seed)
        ai.KERNEL_CONFIG.update(BLOCK_R=block, BLOCK_R_BWD=block_bwd)
        qkv = (torch.randn(B, T, 3 * H * D, generator=g) * scale).to(dtype)
        ve = torch.randn(B, T, H * D, generator=g).to(dtype) if with_ve else None
        lam = torch.tensor(LAMBDAS)
        cos, sin = Rotary(D, kind).compute(torch.arange(T))
        up = [upstream(B, T, H, D, dtype, grads, g) for _ in range(3)]
        leaves = [qkv.clone().requires_grad_(), lam.clone().requires_grad_()]
        if with_ve:
            leaves.append(ve.clone().requires_grad_())
        t0 = time.time()
        got = ai.attention_inputs(leaves[0], leaves[2] if with_ve else None, leaves[1], cos, sin, H, impl="triton")
        g_got = torch.autograd.grad(got, leaves, up)
        secs = time.time() - t0
        ref = ai.reference(qkv, ve, lam, cos, sin, H)
        l64 = [t.detach().double().requires_grad_() for t in leaves]
        ref64 = ai.reference_float64(l64[0], l64[2] if with_ve else None, l64[1], cos, sin, H)
        g_ref = torch.autograd.grad(ref64, l64, [u.double() for u in up])

        # forward: q, k, v against the eager reference and against float64
        v_in = qkv.view(B, T, 3, H, D)[:, :, 2].double()
        v_terms = abs(LAMBDAS[0]) * v_in.abs()
        if with_ve:
            v_terms = v_terms + abs(LAMBDAS[1]) * ve.view(B, T, H, D).double().abs()
        terms = [qk_term_size(x, cos, sin) for x in qkv.view(B, T, 3, H, D).unbind(2)[:2]] + [v_terms]
        over_eager, over_f64 = [], []
        for a, b, b64, m in zip(got, ref, ref64, terms):
            a, b = a.double(), b.double()
            tol = 2.0**-20 * m if dtype == torch.float32 else 2.0**-7 * (b.abs() + m)
            over_eager.append(((a - b).abs() / tol).max().item())
            tol = 2.0**-20 * m if dtype == torch.float32 else 2.0**-8 * b64.abs() + 2.0**-20 * m
            over_f64.append(((a - b64.detach()).abs() / tol).max().item())

        # backward: d_qkv by column block (q, k, v), d_ve against float64 autograd; d_λ against 1e-5 * S
        def over(a, b):
            a, b = a.double(), b.double()
            top = b.abs().max()
            tol = 2.0**-7 * b.abs() + 1e-5 * top if dtype == torch.bfloat16 else 2.0**-20 * (b.abs() + top)
            return ((a - b).abs() / tol).max().item()
        blocks = lambda t: t.view(B, T, 3, H * D).unbind(2)
        bwd_over = [over(a, b) for a, b in zip(blocks(g_got[0]), blocks(g_ref[0]))]
        if with_ve:
            bwd_over.append(over(g_got[2], g_ref[2]))
        gv = up[2].double()
        S = torch.stack([(gv * v_in).abs().sum(), (gv * ve.view(B, T, H, D).double()).abs().sum() if with_ve else
                         torch.zeros((), dtype=torch.float64)])
        lam_over = ((g_got[1].double() - g_ref[1]).abs() / (1e-5 * S + 1e-30)).tolist()
        return dict(dtype=str(dtype), B=B, T=T, H=H, D=D, block=block, block_bwd=block_bwd, with_ve=with_ve,
                    scale=scale, kind=kind, grads=grads, rows=B * T * H,
                    fwd_over_eager=over_eager, fwd_over_f64=over_f64,
                    bwd_over=bwd_over, lam_over=lam_over, lam_grad=g_got[1].tolist(), lam_ref=g_ref[1].tolist(),
                    grad_dtypes=[str(t.dtype) for t in g_got],
                    layout=all(t.dtype == dtype and t.shape == (B, T, H, D) and t.is_contiguous() for t in got),
                    finite=all(bool(torch.isfinite(t).all()) for t in list(got) + list(g_got)), secs=secs)

    out = {"cases": []}
    for dtype in (torch.float32, torch.bfloat16):
        # rows = B*T*H: 74, 270, 156, 57; neither block size divides them (but 4 | 156): masked last blocks
        out["cases"].append(case(dtype, 1, 37, 2, 32, 8, 16, grads="transposed"))              # small H, D
        out["cases"].append(case(dtype, 1, 45, 6, 128, 16, 32, seed=1, grads="sliced"))        # the record's H, D
        out["cases"].append(case(dtype, 2, 13, 6, 128, 64, 4, with_ve=False, kind="full", seed=2,
                                 grads="last_strided"))                                       # B = 2, no ve
        out["cases"].append(case(dtype, 1, 19, 3, 64, 32, 8, scale=1e-4, seed=3, grads="transposed"))  # eps matters
        out["cases"].append(case(dtype, 1, 11, 2, 32, 16, 64, with_ve=False, seed=4, grads="transposed"))

    # only q's output used: k's and v's upstream gradients are None (treated as zero)
    ai.KERNEL_CONFIG.update(BLOCK_R=8, BLOCK_R_BWD=8)
    B, T, H, D = 1, 10, 2, 32
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(B, T, 3 * H * D, generator=g, requires_grad=True)
    ve = torch.randn(B, T, H * D, generator=g, requires_grad=True)
    lam = torch.tensor(LAMBDAS, requires_grad=True)
    cos, sin = Rotary(D, "half_truncated").compute(torch.arange(T))
    yq, yk, yv = ai.attention_inputs(qkv, ve, lam, cos, sin, H, impl="triton")
    d_qkv, d_ve, d_lam = torch.autograd.grad(yq.sum(), (qkv, ve, lam), allow_unused=True, materialize_grads=True)
    _, gk, gv = d_qkv.view(B, T, 3, H * D).unbind(2)
    (g_ref,) = torch.autograd.grad(ai.reference(qkv, ve, lam, cos, sin, H)[0].sum(), qkv)
    out["one_output"] = dict(kv_grad_zero=bool((gk == 0).all() and (gv == 0).all()),
                             ve_lam_grad_zero=bool((d_ve == 0).all() and (d_lam == 0).all()),
                             q_grad_err=(d_qkv - g_ref).abs().max().item(), q_grad_max=g_ref.abs().max().item())

    # the model reaches the kernel: Attention.project with impl triton, against the reference
    from speedrun.config import ModelConfig
    from speedrun.model.gpt import Attention
    launches = []
    launch_forward = ai.launch_forward
    ai.launch_forward = lambda *a: launches.append(1) or launch_forward(*a)
    cfg = ModelConfig(model_dim=64, num_heads=2, head_dim=32, value_embeds=1)
    torch.manual_seed(0)
    att = Attention(cfg, "triton")
    with torch.no_grad():
        att.qkvo_w.normal_(0, 0.3)
    x = torch.randn(1, T, 64)
    model = {}
    for kernel in ("triton", "torch"):
        att.impl = kernel
        model[kernel] = [t for e in (ve, None) for t in att.project(x, e, lam, (cos, sin))]
    ai.launch_forward = launch_forward
    rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()
    out["model"] = dict(launches=len(launches), rel=max(rel(a, b) for a, b in zip(model["triton"], model["torch"])))

    # torch.compile(fullgraph=True) of a projection + the op (a graph break would raise), with and without ve
    ai.KERNEL_CONFIG.update(BLOCK_R=16, BLOCK_R_BWD=16)
    def f(x, w, ve, lam, cos, sin, impl):
        return ai.attention_inputs(F.linear(x, w), ve, lam, cos, sin, 3, impl)

    torch.manual_seed(0)
    B, T = 2, 12
    x = torch.randn(B, T, 48, requires_grad=True)
    w = (torch.randn(3 * 3 * 32, 48) * 0.2).requires_grad_()
    ve = torch.randn(B, T, 3 * 32, requires_grad=True)
    lam = torch.tensor(LAMBDAS, requires_grad=True)
    cos, sin = Rotary(32, "half_truncated").compute(torch.arange(T))
    up = [torch.randn(B, T, 3, 32) for _ in range(3)]
    compiled = torch.compile(f, fullgraph=True)
    out["compiled"] = []
    for e in (ve, None):
        wrt = (x, w, lam) + ((e,) if e is not None else ())
        t0 = time.time()
        got = compiled(x, w, e, lam, cos, sin, "triton")
        g_got = torch.autograd.grad(got, wrt, up)
        secs = time.time() - t0
        eager = f(x, w, e, lam, cos, sin, "triton")
        g_eager = torch.autograd.grad(eager, wrt, up)
        ref = f(x, w, e, lam, cos, sin, "torch")
        g_ref = torch.autograd.grad(ref, wrt, up)
        out["compiled"].append(dict(
            with_ve=e is not None,
            fwd_vs_eager_op=max(rel(a, b) for a, b in zip(got, eager)),
            grad_vs_eager_op=max(rel(a, b) for a, b in zip(g_got, g_eager)),
            fwd_vs_reference=max(rel(a, b) for a, b in zip(got, ref)),
            grad_vs_reference=max(rel(a, b) for a, b in zip(g_got, g_ref)),
            layout=all(t.is_contiguous() and t.shape == (B, T, 3, 32) for t in got), secs=secs))

    # the ops' registrations (schema, fake vs real, autograd) as torch.library checks them
    N, H, D = 9, 2, 32
    g = torch.Generator().manual_seed(6)
    qkv = torch.randn(N, 3 * H * D, generator=g).bfloat16().requires_grad_()
    ve = torch.randn(N, H * D, generator=g).bfloat16().requires_grad_()
    lam = torch.tensor(LAMBDAS, requires_grad=True)
    cos, sin = Rotary(D, "half_truncated").compute(torch.arange(N))
    gq, gk, gv = (torch.randn(N, H, D, generator=g).bfloat16() for _ in range(3))
    def opcheck(op, args, tests):
        result = torch.library.opcheck(op, args, test_utils=tests, raise_exception=False)
        return {k: v if v == "SUCCESS" else repr(v)[:1000] for k, v in result.items()}

    out["opcheck"] = {}
    for name, e in (("ve", ve), ("no_ve", None)):
        out["opcheck"]["fwd_" + name] = opcheck(torch.ops.speedrun.attn_inputs.default, (qkv, e, lam, cos, sin, H),
                                                ("test_schema", "test_autograd_registration", "test_faketensor"))
        out["opcheck"]["bwd_" + name] = opcheck(
            torch.ops.speedrun.attn_inputs_backward.default,
            (gq, gk, gv, qkv.detach(), None if e is None else e.detach(), lam.detach(), cos, sin, H),
            ("test_schema", "test_faketensor"))
    print("RESULT " + json.dumps(out))  # read by interpreter_helpers.run_interpreted
''')


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED, timeout=600)


def _label(case):
    return {k: case[k] for k in ("dtype", "B", "T", "H", "D", "block", "block_bwd", "with_ve", "scale", "grads")}


def test_interpreted_covers_masking_and_both_dtypes(interpreted):
    """The cases exercise what they are meant to: partial row blocks, both dtypes, with and without ve."""
    cases = interpreted["cases"]
    assert {c["dtype"] for c in cases} == {"torch.float32", "torch.bfloat16"}
    assert {c["with_ve"] for c in cases} == {True, False}
    assert any(c["rows"] % c["block"] for c in cases) and any(c["rows"] % c["block_bwd"] for c in cases)
    assert {"transposed", "sliced", "last_strided"} <= {c["grads"] for c in cases}


def test_interpreted_forward_matches_reference(interpreted):
    for case in interpreted["cases"]:
        assert case["finite"] and case["layout"], _label(case)
        assert max(case["fwd_over_eager"]) <= 1.0, (_label(case), case["fwd_over_eager"])
        assert max(case["fwd_over_f64"]) <= 1.0, (_label(case), case["fwd_over_f64"])


def test_interpreted_backward_matches_float64_autograd(interpreted):
    for case in interpreted["cases"]:
        assert case["grad_dtypes"] == [case["dtype"], "torch.float32"] + [case["dtype"]] * case["with_ve"], _label(case)
        assert max(case["bwd_over"]) <= 1.0, (_label(case), case["bwd_over"])
        assert max(case["lam_over"]) <= 1.0, (_label(case), case["lam_over"], case["lam_grad"], case["lam_ref"])
        if not case["with_ve"]:
            assert case["lam_grad"][1] == 0.0, _label(case)
    one = interpreted["one_output"]
    assert one["kv_grad_zero"] and one["ve_lam_grad_zero"], one
    assert one["q_grad_err"] <= 1e-6 * one["q_grad_max"], one


def test_interpreted_model_reaches_the_kernel(interpreted):
    """Attention.project with impl triton launches the kernel (with ve and without) and agrees
    with the reference (float32)."""
    m = interpreted["model"]
    assert m["launches"] == 2 and m["rel"] < 1e-5, m


def test_interpreted_op_under_compile(interpreted):
    assert [c["with_ve"] for c in interpreted["compiled"]] == [True, False]
    for c in interpreted["compiled"]:
        # the op is opaque to Inductor (same kernels); only the float32 projection around it may differ
        assert c["layout"], c
        assert c["fwd_vs_eager_op"] < 1e-5 and c["grad_vs_eager_op"] < 1e-5, c
        assert c["fwd_vs_reference"] < 1e-5 and c["grad_vs_reference"] < 1e-5, c


def test_interpreted_op_registrations(interpreted):
    assert set(interpreted["opcheck"]) == {"fwd_ve", "fwd_no_ve", "bwd_ve", "bwd_no_ve"}
    for name, result in interpreted["opcheck"].items():
        expect = {"test_schema", "test_faketensor"}
        if name.startswith("fwd"):
            expect.add("test_autograd_registration")
        assert set(result) == expect and all(v == "SUCCESS" for v in result.values()), (name, result)


# --------------------------------------------------------------------------- on a GPU (the compiled kernels)


@pytest.mark.gpu
def test_gpu_kernel_matches_reference_at_record_shape(cuda):
    """bf16, H=6, D=128, a (1, T, 3HD) projection with a value embedding: the forward within one bf16
    rounding of the eager reference (and of float64), the gradients as close to float64 as eager's."""
    T, H, D = 4096 + 64, 6, 128
    g = torch.Generator(device=cuda).manual_seed(0)
    qkv = torch.randn(1, T, 3 * H * D, device=cuda, generator=g).to(torch.bfloat16)
    ve = torch.randn(1, T, H * D, device=cuda, generator=g).to(torch.bfloat16)
    lam = torch.tensor(LAMBDAS, device=cuda)
    cos, sin = Rotary(D, "half_truncated").to(cuda).compute(torch.arange(T, device=cuda))
    ups = [torch.randn(1, T, H, D, device=cuda, generator=g).to(torch.bfloat16) for _ in range(3)]
    outs, grads = {}, {}
    for impl in ("triton", "torch", "float64"):
        leaves = [t.double() if impl == "float64" else t.clone() for t in (qkv, ve, lam)]
        leaves = [t.requires_grad_() for t in leaves]
        if impl == "float64":
            out = ai.reference_float64(*leaves, cos, sin, H)
        else:
            out = ai.attention_inputs(*leaves, cos, sin, H, impl=impl)
        gr = torch.autograd.grad(out, leaves, [u.to(out[0].dtype) for u in ups])
        outs[impl], grads[impl] = [o.double() for o in out], [t.double() for t in gr]
    # q, k: the normalised rows are O(1) (RMS 1, entries up to ~4): eager rounds a normalised entry to
    # bf16 before rotating (<= 2^-8 of an entry below 4, twice: 2^-6), then both round the result
    for a, b in zip(outs["triton"][:2], outs["torch"][:2]):
        assert ((a - b).abs() <= 2.0**-7 * b.abs() + 2.0**-6).all(), (a - b).abs().max().item()
    # v: eager rounds λ0*v and λ1*ve before adding them, the kernel only the sum
    v_in, ve_in = qkv.view(1, T, 3, H, D)[:, :, 2].double(), ve.view(1, T, H, D).double()
    v_terms = abs(LAMBDAS[0]) * v_in.abs() + abs(LAMBDAS[1]) * ve_in.abs()
    a, b = outs["triton"][2], outs["torch"][2]
    assert ((a - b).abs() <= 2.0**-7 * (b.abs() + v_terms)).all(), (a - b).abs().max().item()
    # against the exact math: one round-to-nearest of a float32 result (slack for the GPU's rsqrt.approx)
    for a, b in zip(outs["triton"], outs["float64"]):
        assert ((a - b).abs() <= 2.0**-8 * b.abs() + 2.0**-16).all(), (a - b).abs().max().item()
    err = lambda gr, i: ((gr[i] - grads["float64"][i]).norm() / grads["float64"][i].norm()).item()
    for i, name in enumerate(("qkv", "ve", "lambdas")):
        assert err(grads["triton"], i) <= 1.5 * err(grads["torch"], i) + 1e-4, (name, err(grads["triton"], i),
                                                                                 err(grads["torch"], i))
    gv = ups[2].double()
    S = torch.stack([(gv * v_in).abs().sum(), (gv * ve_in).abs().sum()])  # d_λ: as in the interpreted tests
    d_lam, d_lam64 = grads["triton"][2], grads["float64"][2]
    assert ((d_lam - d_lam64).abs() <= 1e-5 * S).all(), (d_lam, d_lam64, S)


@pytest.mark.gpu
def test_gpu_model_loss_and_grads_same_with_either_kernel(cuda):
    """The compiled model (bf16, like training) with the kernel against the reference."""
    from speedrun.config import AttentionConfig
    from speedrun.model.gpt import GPT

    from speedrun.kernels.flex_tiles import use_sparse_block

    cfg = ModelConfig(num_layers=2, value_embeds=1, model_dim=768, num_heads=6, head_dim=128, mlp_hidden=512,
                      vocab_size=1000, no_attn_layers=(), long_layers=(0,), fp8_head=False)
    attn_cfg = AttentionConfig()
    use_sparse_block(MASK_BLOCK, attn_cfg.block_size, cuda)  # the trainer's set-up for 64-token masks
    torch.manual_seed(0)
    model = GPT(cfg, attn_cfg).to(cuda)
    model.attention_backend = "flex"
    with torch.no_grad():  # non-zero output projections and head (zero-initialised), so gradients reach q, k, v
        for b in model.blocks:
            b.attn.qkvo_w[3].normal_(0, 0.02)
            b.mlp.proj_w.normal_(0, 0.02)
        model.head_w.normal_(0, 0.02)
    model.rotary.build_table(2048)
    tok = torch.randint(0, 1000, (2048,), device=cuda)
    # the matrices only: the scalars' gradients are sums over every token and channel that cancel to a
    # few percent of their terms, so bfloat16 noise moves them by several percent either way (the λ
    # gradients are held to float64 by the record-shape test above)
    params = [b.attn.qkvo_w for b in model.blocks] + [model.value_embeds[0].weight]
    results = {}
    for kernel in ("torch", "triton"):
        for m in model.modules():  # the attention inputs only; the rest stays on the reference
            if isinstance(m, Attention):
                m.impl = kernel
        torch._dynamo.reset()
        loss = torch.compile(model, fullgraph=True)(tok, torch.roll(tok, -1), torch.tensor(4, device=cuda), torch.bfloat16)
        results[kernel] = (loss.float(), torch.autograd.grad(loss, params))
    assert abs(results["triton"][0].item() - results["torch"][0].item()) < 1e-2 * abs(results["torch"][0].item())
    for a, b in zip(results["triton"][1], results["torch"][1]):
        assert ((a.float() - b.float()).norm() / b.float().norm()).item() < 3e-2


@pytest.mark.gpu
def test_gpu_compiled_model_keeps_custom_op_outputs_aligned(cuda):
    """Inductor assumes every output of a custom op unaligned when one of its inputs is a view at an offset
    it cannot prove a multiple of 16 bytes, and the kernels reading those outputs (FlexAttention's forward
    among them) then lose their divisibility hints: every second layer's attention ran 1.5-2 times slower
    until the λ pairs were laid out 16-byte aligned (model.aligned_pairs). The generated code of the
    compiled forward and backward must assume no custom op's output unaligned."""
    from torch._inductor.utils import run_and_get_code

    from speedrun.config import AttentionConfig
    from speedrun.kernels.flex_tiles import use_sparse_block
    from speedrun.model.gpt import GPT

    # two layers: the λ section starts at float 6, so the plain slice for layer 0 sat at byte 24
    cfg = ModelConfig(num_layers=2, value_embeds=1, model_dim=768, num_heads=6, head_dim=128, mlp_hidden=512,
                      vocab_size=1000, no_attn_layers=(), long_layers=(0,), fp8_head=False)
    attn_cfg = AttentionConfig()
    use_sparse_block(MASK_BLOCK, attn_cfg.block_size, cuda)
    torch.manual_seed(0)
    model = GPT(cfg, attn_cfg).to(cuda)
    for m in model.modules():
        if isinstance(m, Attention):
            m.impl = "triton"
    model.attention_backend = "flex"
    model.rotary.build_table(2048)
    tok = torch.randint(0, 1000, (2048,), device=cuda)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)

    def step():
        compiled(tok, torch.roll(tok, -1), torch.tensor(4, device=cuda), torch.bfloat16).backward()

    _, code = run_and_get_code(step)
    text = "\n".join(code)
    assert "torch.ops.speedrun.attn_inputs.default" in text and "attn_inputs_backward" in text
    assert "is assumed to be not aligned" not in text


_ALIGNMENT_SCRIPT = r"""
import json, re, sys, torch
from torch._inductor.utils import run_and_get_code
from speedrun.model import gpt as model_mod
from speedrun.config import AttentionConfig, ModelConfig
from speedrun.model.gpt import GPT
if sys.argv[1] == "plain":  # the λ pairs as plain slices of the scalars, as before ae2e367 (2026-12-02)
    model_mod.aligned_pairs = lambda v: v.view(-1, 2)
cfg = ModelConfig(num_layers=2, value_embeds=1, model_dim=64, num_heads=2, head_dim=32, mlp_hidden=128,
                  vocab_size=1000, no_attn_layers=(), long_layers=(0,), fp8_head=False)
torch.manual_seed(0)
model = GPT(cfg, AttentionConfig())
for m in model.modules():
    if isinstance(m, model_mod.Attention):
        m.impl = "triton"
model.rotary.build_table(256)
tok = torch.randint(0, 1000, (256,))
compiled = torch.compile(model, fullgraph=True)
with torch.no_grad():
    _, code = run_and_get_code(lambda: compiled(tok, torch.roll(tok, -1), torch.tensor(2), torch.float32))
text = "\n".join(code)
ops = re.findall(r"# buffer \w+ \(op: ([\w.]+)\) is assumed to be not aligned", text)
print("RESULT " + json.dumps({"calls": text.count("torch.ops.speedrun.attn_inputs.default("), "unaligned": ops}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("pairs", ["aligned", "plain"])
def test_interpreted_compiled_forward_keeps_attn_inputs_outputs_aligned(pairs):
    """The CPU side of the GPU test above (Triton interpreted, so that the custom op is in the graph; about
    40 s each): with the model's λ pairs Inductor assumes no output of `attn_inputs` unaligned; with the
    plain slices it did, for the layer whose pair sat at byte 24."""
    out = run_interpreted(_ALIGNMENT_SCRIPT, pairs, timeout=600)
    assert out["calls"] == 2
    flagged = [op for op in out["unaligned"] if op.startswith("torch.ops.speedrun.")]
    assert (flagged == []) if pairs == "aligned" else ("torch.ops.speedrun.attn_inputs.default" in flagged)
