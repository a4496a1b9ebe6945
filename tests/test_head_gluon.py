"""The FP8 head's Gluon forward (head_gluon.py) with the CE row sums in its epilogue, and where head.py
uses it.

Gluon has no CPU interpreter: on the CPU the kernel is compiled for sm_90 with Triton's own ptxas and
checked for spills and shared memory, the row sums' definition is checked against the CE loss, and the
CE kernel's use of them runs interpreted (test_softcap_ce.py). The GPU tests hold z to cuBLAS's product
bit for bit, the row sums to float64, and the whole fused head op to its cuBLAS path.
"""

import math

import pytest
import torch

from speedrun.kernels import head
from speedrun.kernels import head_gluon as H
from speedrun.kernels.softcap_ce import reference_cross_entropy


def _gluon():
    pytest.importorskip("triton")
    if not H.available():
        pytest.skip("Triton's Gluon (Hopper) does not import here")


@pytest.mark.parametrize("rowsum,cfg", [(True, {}), (False, {}), (True, {"RS_EPI_SLICES": 3})])
def test_compiles_for_hopper_without_spills(rowsum, cfg):
    """Both forms (z alone; z and the row sums split between the epilogue warps and the consumer
    warpgroups, at CONFIG's split and at three slices on the epilogue) compile for sm_90 with no local
    memory (spills), within the H200's 227 KB of shared memory per block; 12 warps (two consumer
    warpgroups and the epilogue's)."""
    _gluon()
    from speedrun.kernels.relu2_gluon import resource_usage

    kernel = H.compile_offline(cfg, rowsum=rowsum)
    usage = resource_usage(kernel.asm["cubin"])
    assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0, usage
    assert kernel.metadata.shared <= 227 * 1024, kernel.metadata.shared
    assert kernel.metadata.num_warps == 12
    ptx = kernel.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "e4m3" in ptx and "setmaxnreg" in ptx
    assert ("ex2.approx" in ptx and "rcp.approx.ftz" in ptx) == rowsum  # the row sums' math only where asked


def test_rowsums_reference_gives_the_ce_loss():
    """Summed over a row's tiles, the row sums are exp(logsumexp(s) - cap): the CE loss follows from them
    and the target's s. Tiles are BLOCK_N wide, the last one zero-padded."""
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(5, 700, generator=g) * 8).bfloat16()
    t = torch.randint(0, 700, (5,), generator=g)
    rs = H.rowsums_reference(z, 30.0)
    assert rs.shape == (5, 6) and H.rowsum_tiles(700) == 6 and rs.dtype == torch.float64
    s = 30.0 * torch.sigmoid(z.double() / 7.5)
    loss = (30.0 + rs.sum(1).log() - s.gather(1, t[:, None])[:, 0]).sum()
    ref = reference_cross_entropy(z.double(), t, 30.0, "sigmoid")
    assert math.isclose(loss.item(), ref.item(), rel_tol=1e-6)  # the reference works in float32
    # the last tile: the epilogue's two 64-column slices, then the consumers' (60 columns, the rest padding)
    assert torch.allclose(rs[:, 4], torch.exp(s[:, 512:640] - 30.0).sum(1))
    assert torch.allclose(rs[:, 5], torch.exp(s[:, 640:] - 30.0).sum(1))


def test_launch_refuses_bad_operands_in_one_line():
    x = torch.zeros(4, 32, dtype=torch.float8_e4m3fn)
    w = torch.zeros(24, 32, dtype=torch.float8_e4m3fn)
    z = torch.zeros(4, 24, dtype=torch.bfloat16)
    one = torch.ones(1)
    H._check(x, w, one, z, torch.zeros(4, 2), H.config())  # fine
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        H._check(x.float(), w, one, z, None, H.config())
    with pytest.raises(ValueError, match="K % 16"):
        H._check(x[:, :24], w[:, :24], one, z, None, H.config())
    with pytest.raises(ValueError, match=r"rowsums must be a contiguous float32 \(4, 2\)"):
        H._check(x, w, one, z, torch.zeros(4, 1), H.config())
    with pytest.raises(ValueError, match="scale"):
        H._check(x, w, torch.ones(2), z, None, H.config())
    assert H.supports(768, 50304) and not H.supports(768, 50300) and not H.supports(760, 50304)


def test_used_only_on_hopper_and_split_only():
    x, w = torch.zeros(4, 768), torch.zeros(50304, 768)
    assert not head.use_gluon(x, w)  # CPU tensors: cuBLAS's path (which then falls back further)
    assert H.rowsum_tiles(50304) == 394  # two partial sums a tile
    for slices in (0, 4):  # all on the consumers or all on the epilogue: gone
        with pytest.raises(ValueError, match="RS_EPI_SLICES"):
            H.kernel_constexprs(H.config({"RS_EPI_SLICES": slices}), True, 768)


# --------------------------------------------------------------------------- GPU


def _hopper(cuda):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernel's wgmma needs compute capability 9.0")
    _gluon()


def _operands(m, k, n, seed):
    """Model-like fp8 operands (x RMS-normed / x_s, w ~ 0.02 randn / w_s) and the product's scale."""
    g = torch.Generator("cuda").manual_seed(seed)
    x_s, w_s = head.x_scale(k), 2.0**-9
    x = torch.nn.functional.rms_norm(torch.randn(m, k, generator=g, device="cuda"), (k,))
    w = torch.randn(n, k, generator=g, device="cuda") * 0.02
    x_f8, w_f8 = (x / x_s).to(torch.float8_e4m3fn), (w / w_s).to(torch.float8_e4m3fn)
    sa, sb = (torch.full((), s, device="cuda") for s in (x_s, w_s))
    return x_f8, w_f8, sa, sb


def _assert_rowsums_close(rs, z, cfg=None, rows=4096):
    for i in range(0, z.shape[0], rows):
        ref = H.rowsums_reference(z[i:i + rows], 30.0, cfg)
        torch.testing.assert_close(rs[i:i + rows].double(), ref, rtol=2e-6, atol=0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("epi_slices", [2, 3])
@pytest.mark.parametrize("M,K,N", [(49152, 768, 50304), (1000, 256, 392), (300, 208, 520), (77, 64, 264)])
def test_gpu_z_is_cublas_and_rowsums_are_float64s(cuda, M, K, N, epi_slices):
    """z bit for bit cuBLAS's FP8 product (at shapes it takes) or, elsewhere, within one bfloat16 rounding
    of the float32 product of the same fp8 values; nothing written past z's end; the row sums within
    float32 summation error of float64's, the padded columns of the last tile left out. The row sums split
    between the epilogue warps (2 or 3 slices) and the consumer warpgroups (over 1, 2 and 6 k-steps)."""
    _hopper(cuda)
    x_f8, w_f8, sa, sb = _operands(M, K, N, seed=M)
    guard = torch.full(((M + 64) * N,), float("nan"), device="cuda", dtype=torch.bfloat16)
    z = guard[:M * N].view(M, N)
    cfg = {"RS_EPI_SLICES": epi_slices}
    rs = torch.full((M, H.rowsum_tiles(N, cfg)), float("nan"), device="cuda")
    H.launch(x_f8, w_f8, sa * sb, z, rs, cfg=cfg)
    assert guard[M * N:].isnan().all()
    if N % 16 == 0:
        ref = torch._scaled_mm(x_f8, w_f8.T, out_dtype=torch.bfloat16, scale_a=sa, scale_b=sb, use_fast_accum=True)
        for i in range(0, M, 4096):
            assert torch.equal(z[i:i + 4096].view(torch.int16), ref[i:i + 4096].view(torch.int16))
    else:
        ref = (x_f8.float() @ w_f8.float().T * (sa * sb)).bfloat16()
        torch.testing.assert_close(z.float(), ref.float(), rtol=2.0**-7, atol=1e-3)
    _assert_rowsums_close(rs, z, cfg)
    z2 = torch.empty_like(z)
    H.launch(x_f8, w_f8, sa * sb, z2)  # without the row sums: the same z
    assert torch.equal(z2.view(torch.int16), z.view(torch.int16))


@pytest.mark.gpu
def test_gpu_fused_head_gluon_matches_cublas_path(cuda, monkeypatch):
    """The fused head op at one record micro-step, compiled as the model runs it: the Gluon forward (the
    default on Hopper) against cuBLAS's (`head.use_gluon` patched off). The same z, so the same loss up
    to the row sums' order, the same e5m2 gradient but for rare one-step roundings (lse moves in its last
    bits), and nearly the same grad_x and grad_w."""
    _hopper(cuda)
    g = torch.Generator("cuda").manual_seed(0)
    N, K, M = 49152, 768, 50304
    x = torch.nn.functional.rms_norm(torch.randn(N, K, generator=g, device="cuda"), (K,)).bfloat16()
    w = torch.randn(M, K, generator=g, device="cuda") * 0.02
    t = torch.randint(0, 50257, (N,), generator=g, device="cuda")

    def loss_fn(x, w, t):
        return head.head_loss(x, w, t, 30.0, "sigmoid", "triton", True) / N

    results, g8 = {}, {}
    for gluon in (False, True):
        if not gluon:
            monkeypatch.setattr(head, "use_gluon", lambda x, w: False)
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        loss = torch.compile(loss_fn, fullgraph=True)(xi, wi, t)
        results[gluon] = (loss.detach(), *torch.autograd.grad(loss, (xi, wi)))
        with torch.no_grad():
            g8[gluon] = torch.ops.speedrun.fp8_softcap_ce(x, w, t, 30.0, "sigmoid", head.x_scale(K), 2.0**-9,
                                                          1 / 448, True)[1]
        monkeypatch.undo()
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    (lc, cx, cw), (lg, gx, gw) = results[False], results[True]
    print("gluon vs cublas: loss", (lg - lc).abs().item(), "grad_x rel", rel(gx, cx), "grad_w rel", rel(gw, cw))
    assert abs(lg.item() - lc.item()) / lc.item() < 1e-6
    assert rel(gx, cx) < 1e-3 and rel(gw, cw) < 1e-3
    differ = sum((g8[False][i:i + 4096].view(torch.uint8) != g8[True][i:i + 4096].view(torch.uint8)).sum().item()
                 for i in range(0, N, 4096))
    print("e5m2 gradient bytes differing:", differ / g8[True].numel())
    assert differ / g8[True].numel() < 1e-4


def test_model_passes_its_head_settings(monkeypatch):
    """The model's soft cap, CE kernel choice and FP8 setting travel from the config to head.head_loss, and
    the forward's head_q (train.head_once) as its w_q."""
    from speedrun.model import gpt as model_module
    from speedrun.config import apply_overrides
    from speedrun.recipes.presets import demo_2025_08 as demo

    seen = {}

    def head_loss(x, w, targets, cap, form, ce_impl, use_fp8, w_q=None):
        seen.update(cap=cap, form=form, ce_impl=ce_impl, use_fp8=use_fp8, w_q=w_q)
        return x.float().sum() * 0.0

    monkeypatch.setattr(model_module.head_ops, "head_loss", head_loss)
    cfg = demo()
    apply_overrides(cfg, ["model.num_layers=2", "model.value_embeds=1", "model.model_dim=64", "model.num_heads=2",
                          "model.head_dim=32", "model.mlp_hidden=128", "model.long_layers=0", "model.vocab_size=500",
                          "train.kernels=reference", "model.logit_softcap=20", "model.softcap_form=tanh"])
    model = model_module.GPT(cfg.model, cfg.attention, kernels=cfg.train.kernels)
    tok = torch.randint(0, 500, (128,))
    model(tok, torch.roll(tok, -1), torch.tensor(2))
    assert seen == {"cap": 20.0, "form": "tanh", "ce_impl": "torch", "use_fp8": False, "w_q": None}
    marker = (torch.zeros(1), torch.zeros(1))
    model(tok, torch.roll(tok, -1), torch.tensor(2), torch.float32, marker)
    assert seen["w_q"] is marker
